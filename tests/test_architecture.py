"""The tree is the audit's pipeline: a stage never imports a later one (docs/design.md).

Every `qaudit` import in every module counts, at module level or inside a function: a lazy
import of a later stage is still a dependency on it.
"""

from __future__ import annotations

import ast
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
    if top in ("cli", "__main__"):
        return "cli"
    if top == "families":
        return FAMILY_KINDS[parts[3]] if len(parts) > 3 else "load"
    if top == "crosscheck":
        return "run"  # builds and runs the config with upstream's code: a second run
    assert top in STAGES, f"{module}: not in a stage package"
    return top


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(path: Path, name: str) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


MODULES = modules()


def qaudit_imports(name: str) -> set[str]:
    return {m for m in imports_of(MODULES[name], name) if m in MODULES}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_a_later_stage(name):
    own = STAGES.index(stage_of(name))
    later = sorted(m for m in qaudit_imports(name) if STAGES.index(stage_of(m)) > own)
    assert not later, f"{name} ({stage_of(name)}) imports later stages: {later}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if stage_of(m) in TORCH_FREE))
def test_load_and_plan_never_import_torch(name):
    imported = imports_of(MODULES[name], name)
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, name


def test_every_module_is_in_a_stage():
    assert all(stage_of(name) in STAGES for name in MODULES)
