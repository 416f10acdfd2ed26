"""Version detection and --megatron PATH read whatever the environment holds: only regular
files, a bounded prefix, and anything odd is "no version" plus a note (issue 21, item 3).

Every bound is checked by counted work: the bytes `bounded.read_regular` reads and the files it
opens, never by time. A FIFO test keeps a writer on the FIFO so that a regression that opened
it would read that writer's text and fail, not hang.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from cli_helpers import run_in_process
from qaudit.errors import InputError
from qaudit.plan.upstream import bounded
from qaudit.plan.upstream.detect import locate_megatron
from qaudit.plan.upstream.dist_info import dist_info_version, installed_version
from qaudit.plan.upstream.git_head import checkout_commit
from qaudit.plan.upstream.target import resolve_megatron
from qaudit.plan.upstream.te import find_te, resolve_te, te_version_key
from test_megatron_versions import write_megatron

COMMIT = "cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54"
OTHER = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def reads(monkeypatch):
    """What bounded.read_regular opened and how many bytes it read."""
    seen = {"opened": [], "bytes": 0}
    real_open, real_read = bounded._open, bounded._read

    def counting_open(path, flags, *args):
        seen["opened"].append(str(path))
        return real_open(path, flags, *args)

    def counting_read(fd, size):
        chunk = real_read(fd, size)
        seen["bytes"] += len(chunk)
        return chunk

    monkeypatch.setattr(bounded, "_open", counting_open)
    monkeypatch.setattr(bounded, "_read", counting_read)
    return seen


@pytest.fixture
def fifo_with_writer(tmp_path):
    """make(path): a FIFO at `path` with a writer waiting to hand it a version."""
    made = []

    def make(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)

        def write() -> None:
            try:
                fd = os.open(path, os.O_WRONLY)  # blocks until someone opens it for reading
                try:
                    os.write(fd, b"Version: 9.9.9\n2.20.0\n")
                finally:
                    os.close(fd)
            except OSError:
                pass

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        made.append((path, thread))
        return path

    yield make
    for path, thread in made:  # release a writer nobody read from
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        thread.join()
        os.close(fd)


def _site(tmp_path: Path, name: str = "site") -> Path:
    site = tmp_path / name
    (site / "transformer_engine").mkdir(parents=True)
    (site / "transformer_engine" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    return site


def _te_metadata(site: Path) -> Path:
    info = site / "transformer_engine-2.12.0.dist-info"
    info.mkdir()
    return info / "METADATA"


# --- the bounded reader itself ---------------------------------------------------------------

def test_a_large_regular_file_is_read_only_up_to_the_limit(tmp_path, reads):
    big = tmp_path / "METADATA"
    big.write_bytes(b"Version: 1.2.3\n" + b"x" * (4 * 1024 * 1024))
    assert len(bounded.read_regular(big, 1000)) == 1000 and reads["bytes"] == 1000
    with pytest.raises(bounded.RefusedRead, match="over 1000 bytes"):
        bounded.read_regular(big, 1000, whole=True)
    assert reads["bytes"] == 1000  # refused from its size, not read


@pytest.mark.parametrize("odd", ["fifo", "dev-zero", "loop", "directory", "long-name", "nul"])
def test_anything_but_a_regular_file_is_refused_unread(tmp_path, reads, fifo_with_writer, odd):
    path = tmp_path / "f"
    if odd == "fifo":
        fifo_with_writer(path)
    elif odd == "dev-zero":
        path.symlink_to("/dev/zero")
    elif odd == "loop":
        path.symlink_to(tmp_path / "g")
        (tmp_path / "g").symlink_to(path)
    elif odd == "directory":
        path.mkdir()
    elif odd == "long-name":
        path = tmp_path / ("x" * 5000)
    else:
        path = tmp_path / "a\0b"
    with pytest.raises(bounded.RefusedRead):
        bounded.read_regular(path, 1024)
    assert reads == {"opened": [], "bytes": 0}


def test_a_file_that_cannot_be_opened_is_refused(tmp_path, monkeypatch):
    # Tests may run as root, for whom permissions do not deny: the system call is made to.
    path = tmp_path / "METADATA"
    path.write_text("Version: 1.0\n")

    def denied(*_args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(bounded, "_open", denied)
    with pytest.raises(bounded.RefusedRead, match="Permission denied"):
        bounded.read_regular(path, 1024)


# --- installed metadata: TE, megatron-core, qaudit env ----------------------------------------

@pytest.mark.parametrize("odd,why", [
    ("fifo", "a FIFO"), ("dev-zero", "a character device"), ("loop", "Too many levels"),
    ("directory", "a directory"), ("digits", "5000 characters"), ("control", "characters no"),
    ("denied", "Permission denied"),
])
def test_odd_te_metadata_is_no_version_and_a_note(tmp_path, monkeypatch, reads, fifo_with_writer,
                                                  odd, why):
    site = _site(tmp_path)
    metadata = _te_metadata(site)
    if odd == "fifo":
        fifo_with_writer(metadata)
    elif odd == "dev-zero":
        metadata.symlink_to("/dev/zero")
    elif odd == "loop":
        metadata.symlink_to(metadata)
    elif odd == "directory":
        metadata.mkdir()
    elif odd == "digits":
        metadata.write_text("Metadata-Version: 2.1\nVersion: " + "9" * 5000 + "\n")
    elif odd == "control":
        metadata.write_text("Version: 2.12\x1b[31m\n")
    else:
        metadata.write_text("Version: 2.12.0\n")
        real_open = bounded._open

        def denied(path, *args):
            if str(path) == str(metadata):
                raise PermissionError(13, "Permission denied")
            return real_open(path, *args)

        monkeypatch.setattr(bounded, "_open", denied)
    target = resolve_te("auto", [str(site)])
    assert (target.source, target.version) == ("assumed", "2.20.2")
    assert "no version in its metadata" in target.note and why in target.note
    assert reads["bytes"] <= 64 * 1024
    if odd in ("fifo", "dev-zero", "loop", "directory"):
        assert reads["bytes"] == 0 and str(metadata) not in reads["opened"]


def test_a_5000_digit_version_is_never_turned_into_a_number():
    assert te_version_key("9" * 5000) is None and te_version_key("2." + "9" * 5000) is None
    assert te_version_key("2.20.2+cu12") == (2, 20, 2) and te_version_key("1234567.1") is None


@pytest.mark.parametrize("odd", ["fifo", "dev-zero", "long"])
def test_odd_te_version_file_is_no_version(tmp_path, reads, fifo_with_writer, odd):
    site = _site(tmp_path)
    version_file = site / "build_tools" / "VERSION.txt"
    version_file.parent.mkdir()
    if odd == "fifo":
        fifo_with_writer(version_file)
    elif odd == "dev-zero":
        version_file.symlink_to("/dev/zero")
    else:
        version_file.write_text("2" * 5000 + "\n")
    root, read = find_te([str(site)])
    assert read.version is None and read.problem and reads["bytes"] <= 256


def test_odd_megatron_metadata_is_no_version_and_a_note(tmp_path, reads, fifo_with_writer):
    root = write_megatron(tmp_path / "fifo", version="0.19.2")
    metadata = root / "megatron_core-0.19.2.dist-info" / "METADATA"
    metadata.unlink()
    fifo_with_writer(metadata)
    # No version from the package: its package_info.py number, and the note says why.
    target = resolve_megatron("auto", [str(root)])
    assert (target.source, target.version, target.kind) == ("installed", "0.20.0rc1", "checkout")
    assert str(metadata) not in reads["opened"]
    root = write_megatron(tmp_path / "digits")
    (root / "megatron/core/package_info.py").write_text(
        "MAJOR = 0\nMINOR = 19\nPATCH = 0\nPRE_RELEASE = '" + "9" * 5000 + "'\n")
    target = resolve_megatron("auto", [str(root)])
    assert target.version == "unknown" and "5006 characters" in target.note


@pytest.mark.parametrize("odd", ["fifo", "dev-zero", "huge"])
def test_odd_megatron_source_falls_back_with_a_note(tmp_path, reads, fifo_with_writer, odd):
    root = write_megatron(tmp_path)
    module = root / "megatron/core/transformer/module.py"
    module.unlink()
    if odd == "fifo":
        fifo_with_writer(module)
    elif odd == "dev-zero":
        module.symlink_to("/dev/zero")
    else:
        module.write_bytes(b"#" * (9 * 1024 * 1024))
    target = resolve_megatron("auto", [str(root)])
    assert target.source == "assumed" and "could not read" in target.note
    assert str(module) not in reads["opened"]


def test_odd_search_path_entries_are_skipped(tmp_path, reads):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    unreadable = ["x" * 5000, "/" + "y" * 5000 + "/site", str(loop), str(loop / "inside"),
                  "\udcff", "/dev/zero", "/dev/null"]
    assert locate_megatron(unreadable) is None
    assert find_te(unreadable) is None
    assert installed_version(("transformer_engine",), unreadable).version is None
    assert resolve_megatron("auto", unreadable).source == "assumed"
    assert resolve_te("auto", unreadable).source == "assumed"
    assert reads["bytes"] == 0


def test_a_directory_that_cannot_be_listed_holds_no_version(tmp_path, monkeypatch):
    def denied(*_args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(bounded.os, "scandir", denied)
    assert dist_info_version(tmp_path, "transformer_engine-").version is None


def test_check_and_env_survive_a_hostile_pythonpath(monkeypatch, capsys, tmp_path,
                                                    fifo_with_writer):
    site = _site(tmp_path)
    fifo_with_writer(_te_metadata(site))
    core = write_megatron(tmp_path / "mlm", version="0.19.2")
    (core / "megatron_core-0.19.2.dist-info" / "METADATA").unlink()
    (core / "megatron_core-0.19.2.dist-info" / "METADATA").symlink_to("/dev/zero")
    for entry in ("z" * 5000, str(site), str(core)):
        monkeypatch.syspath_prepend(entry)
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--format", "json")
    assert code in (0, 1) and "Traceback" not in err
    report = json.loads(out)
    assert report["te"]["source"] == "assumed" and "a FIFO" in report["te"]["note"]
    assert (report["megatron"]["source"], report["megatron"]["version"]) == ("installed", "0.20.0rc1")
    assert "a character device" in report["megatron"]["note"]
    code, out, err = run_in_process(monkeypatch, capsys, "env", "--format", "json")
    assert code == 0 and "Traceback" not in err
    assert json.loads(out)["transformer_engine"] is None


# --- a checkout's commit, from .git ----------------------------------------------------------

def _git(root: Path, head: str, files: dict[str, str] | None = None) -> Path:
    gitdir = root / ".git"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").write_text(head)
    for name, text in (files or {}).items():
        path = gitdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return gitdir


def test_commit_read_from_each_shape_of_git_dir(tmp_path):
    assert checkout_commit(tmp_path / "none") is None
    _git(tmp_path / "detached", COMMIT + "\n")
    assert checkout_commit(tmp_path / "detached") == COMMIT
    _git(tmp_path / "loose", "ref: refs/heads/main\n", {"refs/heads/main": COMMIT + "\n"})
    assert checkout_commit(tmp_path / "loose") == COMMIT
    _git(tmp_path / "packed", "ref: refs/heads/main\n",
         {"packed-refs": f"# pack-refs with: peeled\n{OTHER} refs/heads/other\n"
                         f"{COMMIT} refs/heads/main\n^{OTHER}\n"})
    assert checkout_commit(tmp_path / "packed") == COMMIT
    _git(tmp_path / "chained", "ref: refs/heads/a\n",
         {"refs/heads/a": "ref: refs/heads/b\n", "refs/heads/b": COMMIT + "\n"})
    assert checkout_commit(tmp_path / "chained") == COMMIT
    _git(tmp_path / "cycle", "ref: refs/heads/a\n", {"refs/heads/a": "ref: refs/heads/a\n"})
    assert checkout_commit(tmp_path / "cycle") is None
    _git(tmp_path / "escape", "ref: refs/../../../etc/passwd\n")
    assert checkout_commit(tmp_path / "escape") is None


def test_submodule_and_worktree_git_files(tmp_path):
    # Megatron-Bridge's 3rdparty/Megatron-LM: `.git` is a file naming the superproject's
    # modules/ directory, relative to the submodule.
    bridge = tmp_path / "Megatron-Bridge"
    modules = bridge / ".git" / "modules" / "3rdparty" / "Megatron-LM"
    modules.mkdir(parents=True)
    (modules / "HEAD").write_text(COMMIT + "\n")
    submodule = bridge / "3rdparty" / "Megatron-LM"
    submodule.mkdir(parents=True)
    (submodule / ".git").write_text("gitdir: ../../.git/modules/3rdparty/Megatron-LM\n")
    assert checkout_commit(submodule) == COMMIT
    # A worktree: HEAD in its own gitdir, the branch in the shared repository's packed-refs.
    main = tmp_path / "main"
    _git(main, "ref: refs/heads/main\n", {"packed-refs": f"{OTHER} refs/heads/wt\n"})
    wt_gitdir = main / ".git" / "worktrees" / "wt"
    wt_gitdir.mkdir(parents=True)
    (wt_gitdir / "HEAD").write_text("ref: refs/heads/wt\n")
    (wt_gitdir / "commondir").write_text("../..\n")
    worktree = tmp_path / "wt"
    worktree.mkdir()
    (worktree / ".git").write_text(f"gitdir: {wt_gitdir}\n")
    assert checkout_commit(worktree) == OTHER


def test_hostile_git_files_are_no_commit(tmp_path, reads, fifo_with_writer):
    fifo_with_writer(tmp_path / "fifo" / ".git")
    assert checkout_commit(tmp_path / "fifo") is None
    gitdir = tmp_path / "zero" / ".git"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").symlink_to("/dev/zero")
    assert checkout_commit(tmp_path / "zero") is None
    _git(tmp_path / "packed-zero", "ref: refs/heads/main\n")
    (tmp_path / "packed-zero" / ".git" / "packed-refs").symlink_to("/dev/zero")
    assert checkout_commit(tmp_path / "packed-zero") is None
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / ".git").write_text("gitdir: " + "d" * 5000 + "\n")
    assert checkout_commit(tmp_path / "long") is None
    _git(tmp_path / "garbage", "9" * 5000 + "\n")
    assert checkout_commit(tmp_path / "garbage") is None
    assert reads["bytes"] <= 3 * 4096 + 100


# --- --megatron PATH and editable installs ---------------------------------------------------

def _vendored(tmp_path: Path, rearm="0.19", passing="legacy") -> Path:
    """Megatron-Bridge with its Megatron-LM submodule at COMMIT."""
    bridge = tmp_path / "Megatron-Bridge"
    submodule = write_megatron(bridge / "3rdparty" / "Megatron-LM", rearm, passing)
    modules = bridge / ".git" / "modules" / "3rdparty" / "Megatron-LM"
    modules.mkdir(parents=True)
    (modules / "HEAD").write_text(COMMIT + "\n")
    (submodule / ".git").write_text("gitdir: ../../.git/modules/3rdparty/Megatron-LM\n")
    return submodule


def test_megatron_path_reads_the_code_there_and_names_its_commit(monkeypatch, capsys, tmp_path):
    submodule = _vendored(tmp_path)
    target = resolve_megatron(str(submodule))
    assert (target.source, target.kind, target.commit, target.behaviour.policy) == \
        ("named", "checkout", COMMIT, "legacy")
    assert target.label() == "Megatron-LM checkout 0.20.0rc1 at cd4afffa64 (Megatron-Bridge v0.6.0's pin)"
    assert resolve_megatron(str(submodule / "megatron" / "core")).location == str(submodule)
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--megatron", str(submodule))
    assert code == 1 and "at cd4afffa64" in out and "named with --megatron" in out
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--megatron", str(submodule), "--format", "json")
    megatron = json.loads(out)["megatron"]
    assert (megatron["commit"], megatron["location"]) == (COMMIT, str(submodule))


def test_megatron_path_that_holds_no_readable_megatron_exits_2(monkeypatch, capsys, tmp_path):
    for spec in (str(tmp_path / "missing"), str(tmp_path)):
        code, out, err = run_in_process(monkeypatch, capsys, "check",
                                        "configs/gpt-small-bf16.yaml", "--megatron", spec)
        assert (code, out) == (2, "") and "--megatron" in err and "Traceback" not in err
    root = write_megatron(tmp_path / "broken")
    (root / "megatron/core/transformer/module.py").write_text("def broken(:\n")
    with pytest.raises(InputError, match="cannot read its behaviour"):
        resolve_megatron(str(root))


def test_a_modified_pinned_checkout_says_so(tmp_path):
    submodule = _vendored(tmp_path, rearm="helper", passing="config")
    target = resolve_megatron(str(submodule))
    assert target.behaviour.policy == "config" and "differs from Megatron-Bridge" in target.note


def test_auto_finds_megatron_through_an_editable_finder(tmp_path, monkeypatch, capsys):
    submodule = _vendored(tmp_path)
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "__editable__.megatron_core-0.19.0.pth").write_text(
        "import __editable___megatron_core_0_19_0_finder; "
        "__editable___megatron_core_0_19_0_finder.install()\n")
    (site / "__editable___megatron_core_0_19_0_finder.py").write_text(
        "import sys\nMAPPING: dict[str, str] = "
        f"{{'megatron.core': {str(submodule / 'megatron' / 'core')!r}, "
        f"'megatron.training': {str(submodule / 'megatron' / 'training')!r}}}\n"
        "NAMESPACES: dict[str, list[str]] = {'megatron': []}\n"
        "raise RuntimeError('the finder was run')\n")
    info = site / "megatron_core-0.19.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Version: 0.19.0\n")
    found = locate_megatron([str(tmp_path / "empty"), str(site)])
    assert (found.root, found.kind, found.commit) == (submodule, "checkout", COMMIT)
    assert "editable install" in found.via
    target = resolve_megatron("auto", [str(site)])
    assert target.source == "installed" and "editable install" in target.note
    assert "cd4afffa64" in target.label()
    # On PYTHONPATH itself, the checkout is found first, with the same commit.
    assert locate_megatron([str(submodule), str(site)]).via is None
    monkeypatch.syspath_prepend(str(site))
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--format", "json")
    megatron = json.loads(out)["megatron"]
    assert code == 1 and (megatron["source"], megatron["commit"]) == ("installed", COMMIT)
    assert megatron["location"] == str(submodule) and "editable install" in megatron["note"]


def test_auto_finds_megatron_through_a_pth_path_line(tmp_path):
    submodule = _vendored(tmp_path)
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "megatron_core.pth").write_text(f"# vendored\n{submodule}\n")
    found = locate_megatron([str(site)])
    assert found.root == submodule and found.commit == COMMIT and "megatron_core.pth" in found.via


def test_pythonpath_entry_wins_over_an_editable_install(tmp_path):
    submodule = _vendored(tmp_path)
    other = write_megatron(tmp_path / "other", version="0.19.2")
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "vendored.pth").write_text(f"{submodule}\n")
    assert locate_megatron([str(site), str(other)]).root == other


def test_hostile_editable_files_are_ignored(tmp_path, reads, fifo_with_writer):
    site = tmp_path / "site-packages"
    site.mkdir()
    fifo_with_writer(site / "a.pth")
    (site / "b.pth").symlink_to("/dev/zero")
    fifo_with_writer(site / "__editable___megatron_x_finder.py")
    (site / "__editable___megatron_y_finder.py").write_text(
        "MAPPING = {'megatron': __import__('os')}\n")
    (site / "__editable___megatron_z_finder.py").write_text("MAPPING = " + "[" * 100_000 + "\n")
    (site / "c.pth").write_text("x" * 5000 + "\n")
    (site / "d.pth").write_text("".join(f"/nowhere/{i}\n" for i in range(5000)))
    assert locate_megatron([str(site)]) is None
    assert reads["bytes"] < 200_000
    from qaudit.plan.upstream.editable import pth_roots
    assert len(pth_roots(site)) == 1024  # path lines taken per directory


# --- known commits, main, and the Megatron a config's writer pins ---------------------------

def test_known_commits_by_name_and_by_prefix():
    for spec in ("bridge-v0.6.0", "cd4afffa64", "CD4AFFFA64", "cd4afff", COMMIT):
        target = resolve_megatron(spec)
        assert (target.source, target.version, target.commit, target.kind) == \
            ("named", "bridge-v0.6.0", COMMIT, "commit")
        assert target.behaviour.policy == "legacy" and not target.behaviour.missing_fields
    assert resolve_megatron("bridge-v0.6.0").label() == \
        "Megatron-LM cd4afffa64 (Megatron-Bridge v0.6.0's pin)"
    assert resolve_megatron("d98e8a64").behaviour.policy == "legacy"  # main as read, before #6965
    assert resolve_megatron("main").label() == "Megatron-LM main (d98e8a64 + PR #6965)"
    for unknown in ("cd4aff", "bridge-v0.5.0", "0123456789ab"):
        with pytest.raises(InputError, match="bridge-v0.6.0 .cd4afffa64."):
            resolve_megatron(unknown)


def test_auto_without_megatron_assumes_the_pin_the_config_source_names(tmp_path):
    from qaudit.commands.check import audit_inputs
    from qaudit.commands.inputs import load_inputs
    from qaudit.run.options import AuditOptions

    config, recipe = load_inputs("configs/gpt-mtp-bf16.yaml", None)
    assert resolve_megatron("auto", [str(tmp_path)], assumed=None).version == "0.19.2"
    config.source.assumed_megatron = "bridge-v0.6.0"  # as the Megatron-Bridge reader sets it
    report = audit_inputs(config, recipe, AuditOptions(steps=1))
    megatron = report.megatron
    assert (megatron["source"], megatron["version"], megatron["commit"]) == \
        ("assumed", "bridge-v0.6.0", COMMIT)
    assert megatron["label"].startswith("Megatron-LM cd4afffa64 (Megatron-Bridge v0.6.0's pin)")
    assert megatron["note"].startswith("the config's writer pins it")
    assert any(f.rule == "QA001" for f in report.findings)  # legacy: the BF16 repeated MTP fails
    # Named or importable, the Megatron is the one audited; the pin is only auto's fallback.
    assert audit_inputs(config, recipe, AuditOptions(steps=1, megatron="main")).megatron[
        "version"] == "main"
    root = write_megatron(tmp_path / "mlm", version="0.19.2")
    installed = resolve_megatron("auto", [str(root)], assumed="bridge-v0.6.0")
    assert (installed.source, installed.version) == ("installed", "0.19.2")
    unreadable = resolve_megatron("auto", [str(tmp_path / "none")], assumed="bridge-v0.6.0")
    assert "no Megatron importable" in unreadable.note


def test_te_path_reads_the_version_there(tmp_path, monkeypatch, capsys):
    site = _site(tmp_path)
    _te_metadata(site).write_text("Version: 2.12.0\n")
    target = resolve_te(str(site))
    assert (target.source, target.version, target.location) == ("named", "2.12.0", str(site))
    assert resolve_te(str(site / "transformer_engine")).version == "2.12.0"
    with pytest.raises(InputError, match="no transformer_engine"):
        resolve_te(str(tmp_path))
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--te", str(tmp_path / "missing"))
    assert (code, out) == (2, "") and "no such directory" in err
