"""README.md and docs/ quote the tool, not a memory of it (issue 45, item 3): every output block
after an `<!-- output: ... -->` marker is regenerated from the bundled configs and compared
(qaudit/render/doc_blocks.py, written by scripts/docs-output, as scripts/rules-doc writes the
rule pages); the bundled-config tables' exit codes and the configs `--megatron main` changes
are the tool's; the corpus counts come from one place (docs/launch-scripts.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.render.doc_blocks import MARKER, _select, documents, regenerated
from qaudit.run.options import AuditOptions

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
FIX = "run scripts/docs-output and commit what it writes"
BUNDLED = sorted(path.name for path in (REPO / "configs").glob("*.yaml"))


def _exit_of_golden(name: str) -> int:
    last = (GOLDEN / name.replace(".yaml", ".txt")).read_text().rstrip().splitlines()[-1]
    return int(last.rsplit("exit ", 1)[1])


def test_every_quoted_output_block_is_what_the_tool_prints_now():
    stale = []
    cache: dict[str, list[str]] = {}
    for path in documents(REPO):
        text = path.read_text(encoding="utf-8")
        if MARKER.search(text) and regenerated(text, REPO, cache) != text:
            stale.append(path.name)
    assert not stale, f"quoted output out of date in {', '.join(stale)}: {FIX}"


def test_the_readme_quotes_its_failing_example_and_the_command_it_tells_you_to_run():
    readme = (REPO / "README.md").read_text()
    specs = [match["spec"] for match in MARKER.finditer(readme)]
    assert specs and specs[0].startswith("check configs/deepseek-v3-mtp-fp8.yaml |")
    assert ".venv/bin/qaudit check configs/deepseek-v3-mtp-fp8.yaml\n" in readme


def test_a_block_that_drifted_is_caught():
    output = ["verdict: 1 error(s)", "  QA001 fix: x", "", "module", "a", "b", "c", "1 error(s)"]
    assert _select(output, ["verdict:..", "module +1", "1 error"]) == [
        "verdict: 1 error(s)", "  QA001 fix: x", "", "module", "a", "...", "1 error(s)"]
    with pytest.raises(ValueError):
        _select(output, ["no such line"])


def _table_exits(path: Path) -> dict[str, int]:
    rows = re.findall(r"^\| `([\w.-]+\.yaml)` \|.*\| (\d) \|$", path.read_text(), re.MULTILINE)
    return {name: int(code) for name, code in rows}


@pytest.mark.parametrize("doc", ["README.md", "docs/usage.md"])
def test_bundled_config_tables_list_every_config_with_its_exit_code(doc):
    listed = _table_exits(REPO / doc)
    assert sorted(listed) == BUNDLED
    assert listed == {name: _exit_of_golden(name) for name in BUNDLED}


@pytest.mark.slow
def test_the_configs_megatron_main_changes_are_those_the_docs_name():
    options = AuditOptions(steps=1, microbatches=2, megatron="main")
    changed = sorted(name for name in BUNDLED if _exit_of_golden(name) != audit_files(
        str(REPO / "configs" / name), None, options).exit_code())
    for doc in ("README.md", "docs/usage.md"):
        text = " ".join((REPO / doc).read_text().split())
        sentence = re.search(r"`--megatron main` changes (.*?), to 0", text)
        assert sentence, doc
        named = sorted(set(re.findall(r"`([\w.-]+\.yaml)`", sentence[1])))
        assert named == changed, doc


def test_corpus_counts_come_from_one_place():
    """docs/launch-scripts.md states them; the README quotes the same figures."""
    source = " ".join((REPO / "docs" / "launch-scripts.md").read_text().split())
    audited, total = map(int, re.search(r"\*\*(\d+) of (\d+) fully audited\*\*", source).groups())
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"({total} real Megatron-LM configs and launch scripts" in readme
    assert f"{audited} of {total} fully audited, {total - audited} refused" in readme
    run = int(re.search(r"The default test run audits (\d+) files", source)[1])
    assert f"default run audits {run} of them" in readme
    assert not re.search(r"\b305 fully audited\b", readme)


def test_readme_prose_lines_are_readable():
    """The test paragraph was one 442-character line."""
    long = [number for number, line in enumerate((REPO / "README.md").read_text().splitlines(), 1)
            if len(line) > 110 and not line.startswith(("|", "<!--"))]
    assert not long, f"README.md lines over 110 characters: {long}"
