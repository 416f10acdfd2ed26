"""docs/rules/ and README.md's rule table are generated from the registry and must not drift."""

from __future__ import annotations

import pytest

from cli_helpers import REPO, run_in_process
from qaudit.judge.rules import load_rules
from qaudit.render.rules_doc import BEGIN, DOCS_DIR, END, rule_pages, rules_table, with_table

FIX = "run scripts/rules-doc and commit what it writes"


def test_docs_rules_has_one_current_page_per_rule():
    expected = rule_pages(load_rules())
    folder = REPO / DOCS_DIR
    present = {path.name: path.read_text() for path in sorted(folder.glob("*.md"))}
    assert sorted(present) == sorted(expected), f"{DOCS_DIR}/ lists other rules: {FIX}"
    stale = sorted(name for name, text in expected.items() if present[name] != text)
    assert not stale, f"{DOCS_DIR}/ pages out of date ({', '.join(stale)}): {FIX}"


def test_readme_rule_table_is_the_registrys():
    readme = (REPO / "README.md").read_text()
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1
    inside = readme[readme.index(BEGIN) + len(BEGIN):readme.index(END)]
    assert inside == "\n" + rules_table(load_rules()), f"README.md rule table out of date: {FIX}"


def test_rules_markdown_prints_the_readme_table(monkeypatch, capsys):
    code, out, err = run_in_process(monkeypatch, capsys, "rules", "--format", "markdown")
    assert (code, err) == (0, "") and out == rules_table(load_rules())
    rows = out.splitlines()[2:]
    assert len(rows) == len(load_rules())
    assert rows[0].startswith("| [QA001](docs/rules/QA001.md) | error | ")


def test_a_page_carries_id_title_severity_source_and_the_whole_docstring():
    rule = load_rules()["QA018"]
    page = rule_pages({"QA018": rule})["QA018.md"]
    assert page.startswith(f"# QA018: {rule.title}\n\nSeverity: **warning**. Rule code: "
                           "`qaudit/judge/rules/qa018_enabled_not_boolean.py`.")
    assert "by truthiness" in page and page.endswith("-->\n")


def test_table_cells_escape_a_pipe_and_the_table_is_in_id_order():
    registry = load_rules()
    shuffled = dict(reversed(list(registry.items())))
    assert rules_table(shuffled) == rules_table(registry)
    from dataclasses import replace

    odd = {"QA001": replace(registry["QA001"], title="a | b")}
    assert "| a \\| b |" in rules_table(odd)


def test_with_table_replaces_only_between_the_markers():
    text = f"intro\n{BEGIN}\nold table\n{END}\noutro\n"
    assert with_table(text, "| new |\n") == f"intro\n{BEGIN}\n| new |\n{END}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        with_table("no markers here\n", "| new |\n")
