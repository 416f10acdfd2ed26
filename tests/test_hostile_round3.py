"""Hostile and careless inputs, round three (issue 21): one section per class.

1. the user's own Megatron under --cross-check (exit codes, output, deadline, memory, the
   worker outliving qaudit); 2. outputs written through symlinks; 3. launch-script shapes
   outside the shell budget; 4. recipe glob patterns; 5. escaping of every printed string;
   6. unencodable characters on a non-UTF-8 stdout.
scripts/fuzz has a generator for each class (tests/hostile_inputs.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import mutations as m

REPO = Path(__file__).resolve().parent.parent
BASE = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
CONFIG = str(REPO / "configs" / "gpt-small-bf16.yaml")


def cli(*args: str) -> tuple[int, str, str]:
    return m.run_cli([*args])


def fake_megatron(root: Path, core_init: str) -> Path:
    """A Megatron checkout whose `import megatron.core` runs `core_init`."""
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text(textwrap.dedent(core_init))
    return root


# --- 1. the user's Megatron never decides the exit code ------------------------------------

HOSTILE_MEGATRONS = {
    "exit": "exit()",
    "sys.exit(1)": "import sys; sys.exit(1)",
    "sys.exit(0)": "import sys; sys.exit(0)",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "GeneratorExit": "raise GeneratorExit('closed')",
    "BaseException subclass": "class Odd(BaseException): pass\nraise Odd('odd')",
    "os._exit(0)": "import os; os._exit(0)",
    "os._exit(1)": "import os; os._exit(1)",
    "SIGKILL itself": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    "prints then raises": """\
        import os, sys
        print("UPSTREAM-STDOUT")
        sys.stderr.write("UPSTREAM-STDERR\\n")
        os.write(1, b"UPSTREAM-FD1\\n")
        os.write(2, b"UPSTREAM-FD2\\n")
        raise RuntimeError("after printing")
        """,
    "forks": """\
        import os, time
        if os.fork() == 0:
            time.sleep(600)
        raise RuntimeError("forked")
        """,
    "bidi and ANSI in its message": "raise RuntimeError('evil \\u202e \\x1b[31mred \\r x')",
}


def one_line_exit_3(code: int, out: str, err: str) -> None:
    assert (code, out) == (3, ""), (code, out, err)
    assert err.count("\n") == 1 and err.startswith("error: --cross-check: "), err
    assert "Traceback" not in err and "internal error" not in err
    assert err.isprintable() or err[:-1].isprintable(), repr(err)


@pytest.mark.parametrize("body", HOSTILE_MEGATRONS.values(), ids=HOSTILE_MEGATRONS.keys())
def test_whatever_upstream_does_it_is_exit_3_in_one_line(body, tmp_path, monkeypatch, capfd):
    monkeypatch.syspath_prepend(str(fake_megatron(tmp_path, body)))
    code, out, err = cli("check", CONFIG, "--cross-check", "-f", "json")
    fd_out, fd_err = capfd.readouterr()
    one_line_exit_3(code, out, err)
    # Nothing upstream printed reached qaudit's stdout or stderr, at any level.
    assert "UPSTREAM" not in fd_out + fd_err + out + err.replace("UPSTREAM-FD2", "")


def test_what_upstream_printed_last_is_quoted_escaped(tmp_path, monkeypatch, capfd):
    body = "import os\nos.write(2, b'why: \\x1b[2J bad\\n')\nraise SystemExit(1)"
    monkeypatch.syspath_prepend(str(fake_megatron(tmp_path, body)))
    code, out, err = cli("check", CONFIG, "--cross-check")
    one_line_exit_3(code, out, err)
    assert "its code called exit(1)" in err and "why: \\x1b[2J bad" in err


@pytest.mark.parametrize("flag", ["--checkpoint-activations"])
def test_real_megatron_exiting_on_a_launch_scripts_flag_is_exit_3(megatron, tmp_path, flag,
                                                                   capfd):
    """megatron-core 0.19.2's validate_args calls exit() on --checkpoint-activations: that
    does not decide the exit code. (`--help` is refused before upstream's parser runs, a
    QA030: tests/test_hostile_round4.py.)"""
    from test_crosscheck import write_script

    script = write_script(tmp_path, flag)
    code, out, err = cli("check", script, "--cross-check", "--policy", "legacy", "-f", "json")
    one_line_exit_3(code, out, err)
    assert "usage:" not in "".join(capfd.readouterr())


def test_the_deadline_kills_a_hanging_build(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(fake_megatron(tmp_path, "import time; time.sleep(600)")))
    code, out, err = cli("check", CONFIG, "--cross-check", "--cross-check-timeout", "1")
    one_line_exit_3(code, out, err)
    assert "--cross-check-timeout 1 s" in err


def test_memory_exhaustion_is_exit_3(tmp_path, monkeypatch):
    body = "x = bytearray(8 * 1024 ** 3)"  # 8 GiB, over the 512 MiB the worker may grow by
    monkeypatch.syspath_prepend(str(fake_megatron(tmp_path, body)))
    code, out, err = cli("check", CONFIG, "--cross-check", "--cross-check-memory", "512")
    one_line_exit_3(code, out, err)
    assert "MemoryError" in err


def test_processes_upstream_forks_are_killed_with_the_worker(tmp_path, monkeypatch):
    marker = tmp_path / "grandchild.pid"
    body = f"""\
        import os, time
        if os.fork() == 0:
            with open({str(marker)!r} + ".part", "w") as handle:
                handle.write(str(os.getpid()))
            os.rename({str(marker)!r} + ".part", {str(marker)!r})
            time.sleep(600)
            os._exit(0)
        while not os.path.exists({str(marker)!r}):  # the grandchild is running: waited for
            time.sleep(0.01)
        raise RuntimeError("forked")
        """
    monkeypatch.syspath_prepend(str(fake_megatron(tmp_path / "tree", body)))
    one_line_exit_3(*cli("check", CONFIG, "--cross-check"))
    grandchild = int(marker.read_text())
    assert not _alive(grandchild)


def _state(pid: int) -> str | None:
    """The process's state letter (Z: ended, not yet collected), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None


def _alive(pid: int, patience: float = 120.0) -> bool:
    """Whether `pid` still runs after up to `patience` seconds (a kill is asynchronous; the
    patience only bounds a failing wait, so a loaded machine cannot trip it)."""
    end = time.monotonic() + patience
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(")")[-1].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_worker_dies_with_qaudit_and_frees_the_jobs_stdout(tmp_path):
    """qaudit SIGKILLed (or OOM-killed) mid cross-check: the worker dies too, and whoever
    reads qaudit's stdout sees EOF."""
    script = textwrap.dedent(f"""\
        import os, signal, sys, time
        from qaudit.crosscheck import worker
        job = worker.ForkedWorker(time.sleep, (600,), worker.WorkerLimits(), "test")
        print(job.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               cwd=tmp_path)
    child = int(process.stdout.readline())
    assert process.stdout.read() == b""  # EOF: nobody holds the job's stdout any more
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not _alive(child)


def test_a_worker_result_comes_back_and_its_output_does_not(capfd):
    from qaudit.crosscheck import worker

    def noisy(value):
        print("UPSTREAM")
        os.write(1, b"UPSTREAM")
        return value * 2

    job = worker.ForkedWorker(noisy, (21,), worker.WorkerLimits(), "test")
    assert job.result() == 42
    assert "UPSTREAM" not in "".join(capfd.readouterr())


def test_the_worker_inherits_qaudits_heap_frozen_and_qaudit_keeps_collecting():
    """A collection in the child would write into every inherited object (copy-on-write of
    the whole heap): what existed at the fork is frozen out of the child's collector only."""
    import gc

    from qaudit.crosscheck import worker

    job = worker.ForkedWorker(gc.get_freeze_count, (), worker.WorkerLimits(), "test")
    assert job.result() > 1000
    assert gc.get_freeze_count() == 0


def test_a_worker_never_waits_on_qaudit(capfd):
    """qaudit's own audit may outlast the deadline: a worker that finished in time (after
    printing and returning more than a pipe holds) is collected, not called hung."""
    from qaudit.crosscheck import worker

    def chatty():
        os.write(1, b"UPSTREAM " * 200_000)
        return list(range(200_000))

    job = worker.ForkedWorker(chatty, (), worker.WorkerLimits(timeout_s=1), "test")
    # qaudit's own audit outlasts the worker's deadline, and the worker has finished by then:
    # both waited for (a fixed sleep let a loaded machine end the worker after it).
    while _state(job.pid) not in ("Z", None):
        time.sleep(0.01)
    while time.monotonic() < job.started + 1:
        time.sleep(0.01)
    assert job.result() == list(range(200_000))
    assert "UPSTREAM" not in "".join(capfd.readouterr())


def test_in_process_the_same_holds(capfd):
    """No fork (or a GPU build): output captured, exits and interrupts turned into exit 3,
    and the deadline kept with SIGALRM."""
    from qaudit.crosscheck import worker
    from qaudit.errors import EnvironmentProblem

    def exits():
        print("UPSTREAM")
        os.write(2, b"UPSTREAM last words\n")
        raise SystemExit(1)

    limits = worker.WorkerLimits(timeout_s=1)
    with pytest.raises(EnvironmentProblem, match=r"exit\(1\).*UPSTREAM last words"):
        worker.run_in_process(exits, (), limits, "test")
    with pytest.raises(EnvironmentProblem, match="KeyboardInterrupt"):
        worker.run_in_process(lambda: (_ for _ in ()).throw(KeyboardInterrupt), (), limits,
                              "test")
    with pytest.raises(EnvironmentProblem, match="--cross-check-timeout 1 s"):
        worker.run_in_process(time.sleep, (30,), limits, "test")
    assert "UPSTREAM" not in "".join(capfd.readouterr())
    assert worker.run_in_process(lambda: 7, (), limits, "test") == 7


def test_the_documented_defaults_are_the_options_defaults():
    from qaudit.crosscheck import worker
    from qaudit.run.options import AuditOptions

    options = AuditOptions()
    assert options.cross_check_timeout == worker.DEFAULT_TIMEOUT_S
    assert options.cross_check_memory == worker.DEFAULT_MEMORY_MIB
    security = (REPO / "docs" / "security.md").read_text()
    assert "--cross-check-timeout" in security and "--cross-check-memory" in security


# --- 2. nothing is written through a symlink ----------------------------------------------

@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A PR's checkout (cwd) and, outside it, a file and a folder the PR must not reach."""
    checkout, outside = tmp_path / "checkout", tmp_path / "outside"
    checkout.mkdir()
    outside.mkdir()
    (checkout / "cfg.yaml").write_text(BASE)
    (outside / "precious").write_text("keep me")
    monkeypatch.chdir(checkout)
    return checkout


def outside_untouched(workspace: Path) -> None:
    outside = workspace.parent / "outside"
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert (outside / "precious").read_text() == "keep me"


def refused(result, *words) -> None:
    code, out, err = result
    assert (code, out) == (2, ""), (code, err)
    assert err.count("\n") == 1 and "symbolic link" in err, err
    for word in words:
        assert word in err


LINKS = {
    "link to a file": lambda w: os.symlink(w.parent / "outside" / "precious", "out"),
    "dangling link": lambda w: os.symlink(w.parent / "outside" / "new", "out"),
    "relative dangling link": lambda w: os.symlink("../outside/new", "out"),
    "link chain": lambda w: (os.symlink("out2", "out"),
                             os.symlink(w.parent / "outside" / "precious", "out2")),
}
FORMATS = ("table", "markdown", "json", "sarif", "github", "svg")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("make", LINKS.values(), ids=LINKS.keys())
def test_an_output_that_is_a_symlink_is_refused(workspace, make, fmt):
    make(workspace)
    refused(cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1", "-o", f"{fmt}=out"))
    outside_untouched(workspace)


@pytest.mark.parametrize("make", LINKS.values(), ids=LINKS.keys())
def test_a_baseline_written_to_a_symlink_is_refused(workspace, make):
    make(workspace)
    refused(cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                "--write-baseline", "out"))
    outside_untouched(workspace)


@pytest.mark.parametrize("target", ["linked/out.json", "linked/./out.json", "a/linked/out.json",
                                    "linked/../cfg-copy.json"])
def test_an_output_in_a_symlinked_directory_is_refused(workspace, target):
    os.symlink(workspace.parent / "outside", "linked")
    (workspace / "a").mkdir()
    os.symlink(workspace.parent / "outside", "a/linked")
    refused(cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1", "-o",
                f"json={target}"), "directory 'linked'")
    outside_untouched(workspace)


def test_diff_outputs_refuse_symlinks_too(workspace):
    os.symlink(workspace.parent / "outside" / "precious", "out.md")
    refused(cli("diff", "cfg.yaml", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                "-o", "markdown=out.md"))
    outside_untouched(workspace)


def test_a_link_swapped_in_after_the_check_is_replaced_not_followed(workspace, monkeypatch):
    """The race: the path is a plain name when checked and a symlink when written."""
    from qaudit.files import outputs

    original = outputs._replace

    def swap_then_replace(directory, name, data, info):
        os.symlink(workspace.parent / "outside" / "precious", "report.json")
        return original(directory, name, data, info)

    monkeypatch.setattr(outputs, "_replace", swap_then_replace)
    code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                       "-o", "json=report.json")
    assert code == 0, err
    assert not os.path.islink("report.json")
    assert '"schema": "qaudit/1"' in Path("report.json").read_text()
    outside_untouched(workspace)


def test_a_directory_swapped_for_a_link_mid_write_is_not_followed(workspace):
    """The directory is held open: renaming it and planting a link does not redirect."""
    from qaudit.files import outputs

    (workspace / "out").mkdir()
    directory, name = outputs._open_parent("out/report.json")
    try:
        os.rename("out", "moved")
        os.symlink(workspace.parent / "outside", "out")
        outputs._replace(directory, name, b"{}", None)
    finally:
        os.close(directory)
    assert (workspace / "moved" / "report.json").read_bytes() == b"{}"
    outside_untouched(workspace)


def test_plain_outputs_and_own_descriptors_still_work(workspace, capfd):
    (workspace / "sub").mkdir()
    code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                       "-o", "json=sub/r.json", "-o", "md=/dev/stderr", "-o", "sarif=/dev/null",
                       "--write-baseline", "./b.json")
    assert code == 0, err
    assert Path("sub/r.json").is_file() and Path("b.json").is_file()
    assert not [p for p in workspace.rglob(".*") if p.is_file()]  # no temporary file left


def test_allow_symlinked_output_writes_the_linked_file(workspace):
    os.symlink(workspace.parent / "outside" / "precious", "out")
    code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                       "-o", "json=out", "--allow-symlinked-output")
    assert code == 0, err
    assert os.path.islink("out")
    assert '"schema"' in (workspace.parent / "outside" / "precious").read_text()


def test_with_links_allowed_an_output_linked_to_an_input_is_still_refused(workspace):
    os.symlink("cfg.yaml", "link.yaml")
    code, out, err = cli("check", "cfg.yaml", "-o", "json=link.yaml", "--allow-symlinked-output")
    assert (code, out) == (2, "") and "would overwrite the config" in err
    assert Path("cfg.yaml").read_text() == BASE


# --- 3. launch-script shapes outside the budget -------------------------------------------

SHELL_SHAPES = {  # each under 1 MiB
    "120,000-term && list": " && ".join(["true"] * 120_000),
    "cat <( nested 50,000 deep": "cat <(" * 50_000 + "true" + ")" * 50_000,
    "[[ ( nested 50,000 deep": "[[ " + "( " * 50_000 + "a" + " )" * 50_000 + " ]]",
    "heredoc of 200,000 $A": "A=x\ncat <<EOF\n" + "$A" * 200_000 + "\nEOF",
    "heredoc of 200,000 $A and blanks": "A=x\ncat <<EOF\n" + "$A " * 200_000 + "\nEOF",
    "8,000 heredocs on one line": "cat " + " ".join(f"<<E{i}" for i in range(8000)) + "\n"
                                  + "".join(f"x\nE{i}\n" for i in range(8000)),
    # Found by the fuzz campaign (seed s26-final, input 7482): tree-sitter's error recovery
    # after a long pipeline grew past 15 GB.
    "10,000-stage pipeline, then a syntax error": " | ".join(["cat"] * 10_000) + "\nfoo )",
    "the same over continuation lines": "cat | \\\n" * 10_000 + "cat\nfoo )",
    "10,000 |& stages, then a syntax error": " |& ".join(["cat"] * 10_000) + "\nfoo )",
}


class CountingParser:
    """shell_tree's parser, counting the bytes it is handed and the queries run after it."""

    def __init__(self, parser):
        self.parser, self.parsed_bytes = parser, 0

    def parse(self, source):
        self.parsed_bytes += len(source)
        return self.parser.parse(source)


@pytest.mark.parametrize("body", SHELL_SHAPES.values(), ids=SHELL_SHAPES.keys())
def test_script_shapes_are_refused_by_counted_work(body, monkeypatch):
    """Refused by the node count or the per-line parsing work before anything quadratic: no
    query runs over an oversized tree, and a script whose lines cost too much to parse is
    never handed to tree-sitter."""
    import tree_sitter

    from qaudit.errors import InputError
    from qaudit.load.sources import shell_tree
    from qaudit.load.sources.launch_script import launch_script_words

    text = "#!/bin/bash\n" + body + "\n"
    assert len(text.encode()) < 1 << 20
    parser = CountingParser(shell_tree._PARSER)
    queries = []
    monkeypatch.setattr(shell_tree, "_PARSER", parser)
    monkeypatch.setattr(shell_tree.tree_sitter, "QueryCursor",
                        lambda query: queries.append(query) or tree_sitter.QueryCursor(query))
    with pytest.raises(InputError, match="cannot read the script") as refused:
        launch_script_words(text, "train.sh", {})
    assert queries == []
    work = sum((line.count("$") + line.count("<<")) ** 2 for line in text.split("\n"))
    pipes = len(shell_tree._PIPE.findall(text.encode()))
    if work > shell_tree.MAX_LINE_WORK:
        assert parser.parsed_bytes == 0 and "units of parsing work" in str(refused.value)
    elif pipes > shell_tree.MAX_PIPES:
        assert parser.parsed_bytes == 0 and "pipes" in str(refused.value)
    else:
        assert parser.parsed_bytes == len(text.encode())
        assert "100,000 words" in str(refused.value)
        assert shell_tree._PARSER.parser.parse(text.encode()).root_node.descendant_count \
            > shell_tree.MAX_NODES


def test_the_parsing_work_bound_leaves_real_scripts_alone(tmp_path):
    from qaudit.load.sources import shell_tree

    corpus = REPO.parent / "shared" / "corpus"
    scripts = sorted(corpus.rglob("*.sh"))
    if not scripts:
        pytest.skip("../shared/corpus not present")
    worst = max(shell_tree.Script(p.read_text(), str(p)).prescan_work for p in scripts)
    assert 0 < worst <= shell_tree.MAX_LINE_WORK // 1000


def test_a_pipeline_of_1000_stages_is_still_read():
    from qaudit.load.sources import shell_tree

    script = shell_tree.Script("#!/bin/bash\n" + " | ".join(["cat"] * 1001) + " || true\n",
                               "t.sh")
    assert not script.root.has_error


def test_a_line_of_1000_expansions_is_still_read():
    from qaudit.load.sources import shell_tree

    script = shell_tree.Script("#!/bin/bash\necho " + "$A " * 1000 + "\n", "t.sh")
    assert script.prescan_work == 1_000_000 == shell_tree.MAX_LINE_WORK


# --- 4. recipe glob patterns ----------------------------------------------------------------

RECIPE = """\
configs:
  bf16:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {{}}
matchers:
  attention:
    type: glob
    pattern: "{pattern}"
    config: bf16
    enabled: true
"""


@pytest.mark.parametrize("pattern, words", [
    ("*[" * 70_000, "140,000 characters long"),  # minutes in fnmatch's translation before
    ("a" * 1001, "1,001 characters long"),
    ("*" * 65, "65 wildcards"),
    ("*[a]?" * 22, "66 wildcards"),
])
def test_a_huge_or_complex_glob_is_refused_naming_the_matcher(tmp_path, monkeypatch, pattern,
                                                              words):
    import fnmatch

    (tmp_path / "r.yaml").write_text(RECIPE.format(pattern=pattern))
    (tmp_path / "cfg.yaml").write_text(BASE)
    translated = []
    monkeypatch.setattr(fnmatch, "translate", lambda p: translated.append(p))
    code, out, err = cli("check", str(tmp_path / "cfg.yaml"), "--recipe", str(tmp_path / "r.yaml"))
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1
    assert f"r.yaml:8: key 'pattern': matcher 'attention': the glob pattern" in err and words in err
    assert translated == []


def test_a_glob_at_the_bounds_still_matches(tmp_path):
    from qaudit.load.recipe import MAX_PATTERN_LENGTH, MAX_PATTERN_WILDCARDS, load_recipe

    pattern = "*" * MAX_PATTERN_WILDCARDS + "x" * (MAX_PATTERN_LENGTH - MAX_PATTERN_WILDCARDS)
    (tmp_path / "r.yaml").write_text(RECIPE.format(pattern=pattern))
    (matcher,) = load_recipe(tmp_path / "r.yaml").matchers
    assert matcher.matches("decoder." + "x" * 936) and not matcher.matches("decoder.y")


# --- 5. one escaping for every printed string ----------------------------------------------

EVIL = "evil\u202e\x1b[31mred\x1b]0;title\x07\r\x9b\ud800"


def evil_report(tmp_path: Path) -> tuple[Path, Path]:
    """A clean report and one whose every string field an attacker could write is hostile."""
    import json

    code, out, err = cli("check", CONFIG, "--steps", "1", "--microbatches", "1", "-f", "json")
    assert code == 0, err
    clean = json.loads(out)
    evil = json.loads(out)
    for row in evil["modules"][:3]:
        for key in ("name", "precision", "recipe", "accumulation", "type"):
            if isinstance(row.get(key), str):
                row[key] = EVIL + row[key]
    evil.update(config=EVIL + ".yaml", recipe=EVIL, runtime=EVIL, policy=evil["policy"])
    evil["findings"] = [{"rule": "QA001", "severity": "error", "module": EVIL,
                         "message": EVIL, "file": EVIL, "line": 3, "fix": EVIL}]
    (tmp_path / "base.json").write_text(json.dumps(clean))
    (tmp_path / "head.json").write_text(json.dumps(evil))
    return tmp_path / "base.json", tmp_path / "head.json"


def shown_safely(text: str) -> None:
    assert all(c.isprintable() or c == "\n" for c in text), \
        sorted({c for c in text if not (c.isprintable() or c == "\n")})


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_diff_escapes_every_string_of_a_report(tmp_path, fmt, monkeypatch):
    base, head = evil_report(tmp_path)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")  # the annotations on stderr too
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    code, out, err = cli("diff", str(base), str(head), "-f", fmt,
                         "-o", f"markdown={tmp_path / 'd.md'}")
    assert code in (0, 1), err
    for text in (out, err, (tmp_path / "d.md").read_text(), (tmp_path / "summary.md").read_text()):
        shown_safely(text)
    assert "\\u202e" in out and ("\\x1b" in out or "\\u001b" in out)


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "sarif", "github", "svg"])
def test_every_check_format_escapes_the_same_way(tmp_path, fmt):
    from qaudit.render import render
    from qaudit.render.load import load_report

    _, head = evil_report(tmp_path)
    report = load_report(str(head))
    shown_safely(render(report, 1, fmt))
    if fmt == "table":  # with colour: only qaudit's own sequences
        from qaudit.render.table import COLOR_SEQUENCES

        text = render(report, 1, fmt, color=True)
        for sequence in COLOR_SEQUENCES:
            text = text.replace(sequence, "")
        shown_safely(text)


def test_a_lone_surrogate_in_a_report_never_exits_3(tmp_path):
    base, head = evil_report(tmp_path)
    for fmt in ("table", "markdown", "json"):
        code, out, err = cli("diff", str(base), str(head), "-f", fmt)
        assert code in (0, 1) and "internal error" not in err
        assert "\\ud800" in out


def test_diff_of_a_hostile_baseline_and_report_as_check_inputs(tmp_path):
    """check --baseline with hostile fingerprints: still one escaped line or a report."""
    import json

    (tmp_path / "b.json").write_text(json.dumps({"schema": "qaudit-baseline/1", "findings": [
        {"fingerprint": EVIL, "rule": EVIL, "module": EVIL}]}))
    code, out, err = cli("check", CONFIG, "--steps", "1", "--microbatches", "1",
                         "--baseline", str(tmp_path / "b.json"))
    shown_safely(out)
    shown_safely(err)
    assert "internal error" not in err


def test_env_output_escapes_installed_metadata(monkeypatch):
    from qaudit.commands import env

    original = env.collect

    def hostile():
        report = original()
        report.torch = EVIL
        return report

    monkeypatch.setattr(env, "collect", hostile)
    for fmt in ("table", "json"):
        code, out, err = cli("env", "-f", fmt)
        assert code == 0, err
        shown_safely(out)


def test_error_lines_escape_too(tmp_path):
    (tmp_path / "cfg.yaml").write_text(BASE + f"{EVIL}: 1\n".replace("\ud800", ""))
    code, out, err = cli("check", str(tmp_path / "cfg.yaml"))
    assert code == 2 and err.count("\n") == 1
    shown_safely(err)


# --- 6. unencodable characters never crash an output ---------------------------------------

def _without_utf8(kind: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONIOENCODING", "PYTHONUTF8", "LANG", "LC_CTYPE", "LC_ALL")}
    if kind == "posix":
        environ.update(LC_ALL="POSIX", PYTHONUTF8="0")
    else:
        environ.update(PYTHONIOENCODING="ascii")
    return environ


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
@pytest.mark.parametrize("kind", ["posix", "ascii"])
def test_a_non_utf8_stdout_gets_escapes_not_a_crash(tmp_path, kind):
    base, head = evil_report(tmp_path)
    (tmp_path / "cfg.yaml").write_text(BASE)
    qaudit = [sys.executable, "-m", "qaudit"]
    commands = [
        ["check", str(tmp_path / "cfg.yaml"), "--steps", "1", "--microbatches", "1",
         "-f", "markdown", "-o", f"markdown={tmp_path / 'r.md'}"],
        ["diff", str(base), str(head), "-f", "markdown"],
        ["diff", str(base), str(head), "-f", "table"],
        ["env"],
        ["rules", "-f", "markdown"],
        ["explain", "QA001"],
    ]
    for command in commands:
        result = subprocess.run(qaudit + command, capture_output=True, env=_without_utf8(kind),
                                cwd=tmp_path, timeout=600)
        assert result.returncode in (0, 1), (command, result.stderr[-500:])
        assert b"internal error" not in result.stderr and result.stdout
        result.stdout.decode("ascii")  # every character escaped, none lost
    assert (tmp_path / "r.md").read_text(encoding="utf-8").startswith("\u2705")  # files: UTF-8
