"""The tree is the audit's pipeline: a stage never imports a later one (docs/design.md).

Every `qaudit` import in every module counts, at module level or inside a function: a lazy
import of a later stage is still a dependency on it.
"""

from __future__ import annotations

import ast
import functools
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


@functools.cache
def parsed(path: Path) -> ast.Module:
    """Each module's tree, parsed once for every test here (they only read it)."""
    return ast.parse(path.read_text())


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(path: Path, name: str, run_time: bool = False,
               annotations: bool = True) -> set[str]:
    """Every module `name` names in an import. `run_time`: `from package import submodule`
    counted as the submodule alone (the package is imported first either way: what the
    module uses is the submodule). `annotations=False`: annotation-only imports (under `if
    TYPE_CHECKING:`) left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = parsed(path)
    skipped = {id(inner) for node in ast.walk(tree) if not annotations
               and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
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


def _imports_used(name: str) -> set[str]:
    """The qaudit modules `name` uses: every import, at module level, inside a function or
    under `if TYPE_CHECKING:` (a type named in an annotation is a dependency too)."""
    found = imports_of(MODULES[name], name, run_time=True)
    return {m for m in found if m in MODULES and m != name} - ENTRY_IMPORTS.get(name, set())


def first_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path that comes back to where it started, or None: depth-first, in name order."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
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


def test_no_import_circle():
    """No module reaches itself through what it imports: lazy imports inside functions and
    annotation-only imports (`if TYPE_CHECKING:`) included. A type two stages or two rooms
    need lives below both (e.g. qaudit/load/model_config.py, qaudit/load/sources/flag_state.py),
    so each module reads top-down and none is half-initialised when another uses it."""
    circle = first_circle({name: _imports_used(name) for name in MODULES})
    assert circle is None, " -> ".join(circle)


def test_the_circle_test_sees_annotation_and_function_imports():
    """The graph the circle test walks holds the edges a circle could hide in: an import under
    `if TYPE_CHECKING:` (the family hooks name ModelConfig only there) and one inside a
    function (the cross-check's builder imports upstream_build only when it builds)."""
    assert "qaudit.load.model_config" in _imports_used("qaudit.families.protocols")
    assert "qaudit.crosscheck.upstream_build" in _imports_used("qaudit.crosscheck")
    assert first_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert first_circle({"a": {"b"}, "b": set()}) is None


# The room for what stands in for upstream's CUDA-only pieces on a CPU (docs/design.md): the
# cross-check, the te runtime on a CPU and the guard's --cpu are its users.
ROOM = "qaudit.runtime.standin"
BOOT = "qaudit.runtime.standin.boot"
# The boot's parts, which only its `enter` may call from outside the room.
BOOT_PARTS = {BOOT: {"_process_stand_ins", "_megatron_stand_ins", "_boot_te_on_cpu"},
              "qaudit.runtime.standin.te_python": {"boot"}}
ROOM_ENTERED_BY = ("qaudit.crosscheck.build_scope", "qaudit.guard.cpu", "qaudit.runtime")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _room() -> list[str]:
    room = [name for name in MODULES if _within(name, ROOM)]
    assert BOOT in room and len(room) > 5, room  # the room is there to be checked
    return room


def test_the_room_imports_none_of_its_users():
    """The stand-ins know nothing of who uses them: no import of the cross-check, the guard
    or the commands from the room, lazy and annotation-only ones included."""
    users = ("qaudit.crosscheck", "qaudit.guard", "qaudit.commands", "qaudit.cli")
    reached = {name: sorted(m for m in _imports_used(name)
                            if any(_within(m, user) for user in users)) for name in _room()}
    assert not {name: used for name, used in reached.items() if used}


@pytest.mark.parametrize("user", ["qaudit.guard", "qaudit.runtime.te", "qaudit.runtime"])
def test_the_guard_and_the_te_runtime_reach_the_stand_ins_only_through_the_room(user):
    """The guard's --cpu and the te runtime take what they stand in from the room, never from
    the cross-check (where the boot used to live)."""
    names = [name for name in MODULES
             if name == user or (user == "qaudit.guard" and _within(name, user))]
    reached = {name: sorted(m for m in _imports_used(name) if _within(m, "qaudit.crosscheck"))
               for name in names}
    assert names and not {name: used for name, used in reached.items() if used}


def _bound_to(tree: ast.AST, module: str) -> set[str]:
    """The local names an import binds to `module` (`from a import b [as c]`,
    `import a.b as c`)."""
    parent, _, leaf = module.rpartition(".")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == parent and not node.level:
            names |= {alias.asname or alias.name for alias in node.names if alias.name == leaf}
        elif isinstance(node, ast.Import):
            names |= {alias.asname for alias in node.names if alias.name == module
                      and alias.asname}
    return names


def _attributes_used(tree: ast.AST, module: str, attributes: set[str]) -> set[str]:
    """Which of `attributes` of `module` the code names (`module.x`, `from module import x`)."""
    bound = _bound_to(tree, module)
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id in bound
            and node.attr in attributes}
    return used | {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.module == module for alias in node.names
                   if alias.name in attributes}


def test_the_room_has_one_boot_entry_that_its_three_users_call():
    """Every user comes in through `boot.enter`; no module outside the room boots TE on the
    kernel stand-in or enters the stand-ins for Megatron by itself."""
    room = set(_room())
    past_the_entry = {name: sorted(used) for name, path in MODULES.items() if name not in room
                      for module, parts in BOOT_PARTS.items()
                      if (used := _attributes_used(parsed(path), module, parts))}
    assert not past_the_entry
    for name in ROOM_ENTERED_BY:
        assert _attributes_used(parsed(MODULES[name]), BOOT, {"enter"}), name


def test_the_boot_entry_check_sees_aliases_and_from_imports():
    tree = ast.parse("from qaudit.runtime.standin import boot as room, te_python\n"
                     "from qaudit.runtime.standin.boot import _process_stand_ins\n"
                     "room.enter(side)\nte_python.boot()\n")
    assert _attributes_used(tree, BOOT, {"enter", "_process_stand_ins"}) == {
        "enter", "_process_stand_ins"}
    assert _attributes_used(tree, "qaudit.runtime.standin.te_python", {"boot"}) == {"boot"}


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
    from qaudit.families import protocols as hooks

    protocols = {"fields": hooks.FamilyFields, "flags": hooks.FamilyFlags,
                 "sizes": hooks.FamilySizes}
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
