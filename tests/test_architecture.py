"""The tree is the audit's pipeline: a stage never imports a later one (docs/design.md).

Every `qaudit` import in every module counts, at module level or inside a function: a lazy
import of a later stage is still a dependency on it.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "qaudit"

# Stage order: load -> plan -> runtime -> model -> run -> judge -> render -> commands -> cli.
STAGES = ("common", "load", "plan", "runtime", "model", "run", "judge", "render", "commands",
          "cli")
# A family's modules belong to the stage their name says (qaudit/families/<family>/<kind>.py).
FAMILY_KINDS = {"__init__": "load", "fields": "load", "pattern": "load", "flags": "load",
                "sizes": "plan", "layers": "model", "model": "model"}
TORCH_FREE = ("load", "plan")


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("errors", "_safepath", "files"):
        return "common"
    top = parts[1]
    if top in ("cli", "__main__", "api"):
        return "cli"  # entry points: the command line and the Python API (qaudit/api.py)
    if top == "families":
        return FAMILY_KINDS[parts[3]] if len(parts) > 3 else "load"
    if top == "crosscheck":
        return "run"  # builds and runs the config with upstream's code: a second run
    if top == "guard":
        return "commands"  # the guard: a command, and its agent inside the user's run
    assert top in STAGES, f"{module}: not in a stage package"
    return top


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(path: Path, name: str, run_time: bool = False) -> set[str]:
    """Every module `name` names in an import. `run_time`: what it imports when it runs:
    annotation-only imports (under `if TYPE_CHECKING:`) left out, and `from package import
    submodule` counted as the submodule alone (the package is imported first either way)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = {id(inner) for node in ast.walk(tree) if run_time and isinstance(node, ast.If)
               and "TYPE_CHECKING" in ast.unparse(node.test)
               for statement in node.body for inner in ast.walk(statement)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            named = {f"{base}.{alias.name}" for alias in node.names}
            submodules = named & set(MODULES) if run_time else set()
            found.update(submodules if run_time else named)
            if len(submodules) < len(node.names):
                found.add(base)
    return found


MODULES = modules()


def qaudit_imports(name: str) -> set[str]:
    return {m for m in imports_of(MODULES[name], name) if m in MODULES}


# The package root names the Python API (`from qaudit import audit`), loaded on first use.
ENTRY_IMPORTS = {"qaudit": {"qaudit.api"}}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_a_later_stage(name):
    own = STAGES.index(stage_of(name))
    later = sorted(m for m in qaudit_imports(name) - ENTRY_IMPORTS.get(name, set())
                   if STAGES.index(stage_of(m)) > own)
    assert not later, f"{name} ({stage_of(name)}) imports later stages: {later}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if stage_of(m) in TORCH_FREE))
def test_load_and_plan_never_import_torch(name):
    imported = imports_of(MODULES[name], name)
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, name


def _run_time_imports(name: str) -> set[str]:
    found = imports_of(MODULES[name], name, run_time=True)
    return {m for m in found if m in MODULES and m != name} - ENTRY_IMPORTS.get(name, set())


def test_no_import_circle():
    """No module reaches itself through what it imports (lazy imports inside functions
    included), so each reads top-down and none is half-initialised when another uses it."""
    graph = {name: _run_time_imports(name) for name in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def circle_from(start: str) -> list[str] | None:
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            name, pending = stack[-1]
            step = next(pending, None)
            if step is None:
                state[name] = 2
                stack.pop()
                path.pop()
            elif state.get(step) == 1:
                return path[path.index(step):] + [step]
            elif step not in state:
                state[step] = 1
                path.append(step)
                stack.append((step, iter(sorted(graph[step]))))
        return None

    for name in sorted(MODULES):
        if name not in state:
            circle = circle_from(name)
            assert circle is None, " -> ".join(circle)


def test_every_module_is_in_a_stage():
    assert all(stage_of(name) in STAGES for name in MODULES)


def test_bad_input_is_refused_before_torch_is_imported(tmp_path):
    """Instant answers: `qaudit check empty.yaml` never pays for importing torch. A fresh
    interpreter is what is tested (this test process has torch loaded already)."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    probe = ("import sys\nfrom qaudit.cli import app\n"
             "try:\n    app([\"check\", sys.argv[1]])\nexcept SystemExit as exc:\n"
             "    print(exc.code, \"torch\" in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(empty)], capture_output=True,
                          text=True, check=True)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert "empty file" in done.stderr


REPO = PACKAGE.parent
CITED_DOC = re.compile(r"\bdocs/[\w./-]+\.md\b")


def test_every_cited_document_exists():
    sources = sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "scripts").iterdir()) \
        + sorted((REPO / "tests").glob("*.py"))
    missing = sorted({f"{path.relative_to(REPO)}: {doc}"
                      for path in sources if path.is_file()
                      for doc in CITED_DOC.findall(path.read_text(errors="replace"))
                      if not (REPO / doc).is_file()})
    assert not missing, missing


def test_both_runtimes_implement_the_runtime_protocol():
    """The seam is typed: the wrappers only use what `Runtime` declares. TE's runtime cannot be
    built without CUDA, so its class is checked for every member."""
    from qaudit.runtime.protocol import GraphEmulating, Runtime
    from qaudit.runtime.reference import ReferenceRuntime
    from qaudit.runtime.te import TERuntime

    assert isinstance(ReferenceRuntime(), GraphEmulating)
    members = [name for name in dir(Runtime) if not name.startswith("_")]
    assert {"linear", "autocast", "plain_gemm", "current_quant"} <= set(members)
    missing = [name for name in members if name != "device" and not hasattr(TERuntime, name)]
    assert not missing, missing


def test_every_family_implements_its_protocols():
    """A family folder provides each stage's hooks (qaudit/families/__init__.py)."""
    import inspect

    from qaudit import families

    protocols = {"fields": families.FamilyFields, "flags": families.FamilyFlags,
                 "sizes": families.FamilySizes}
    for name in families.FAMILIES:
        for kind, protocol in protocols.items():
            module = importlib.import_module(f"qaudit.families.{name}.{kind}")
            for member, _ in inspect.getmembers(protocol, inspect.isfunction):
                if not member.startswith("_"):
                    assert callable(getattr(module, member, None)), f"{name}/{kind}.py: {member}"
    model = families.parts("model")
    assert all(isinstance(part.MODEL, type) for part in model) and model


@pytest.mark.parametrize("example, family", [("gpt-small-bf16", "gpt"),
                                             ("deepseek-v3-mtp-fp8", "gpt"),
                                             ("nemotron-h-8b-fp8", "hybrid")])
def test_bundled_examples_belong_to_their_family(example, family):
    from qaudit.load import load_files

    assert load_files(str(REPO / "configs" / f"{example}.yaml"))[0].family == family


def test_a_t5_config_is_of_the_t5_family(write_yaml):
    from qaudit.load import load_files

    path = write_yaml("t5.yaml", "num_layers: 2\nencoder_num_layers: 2\nhidden_size: 64\n"
                                 "num_attention_heads: 4\n")
    assert load_files(path)[0].family == "t5"
