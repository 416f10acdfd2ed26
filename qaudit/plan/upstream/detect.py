"""Find the Megatron the audit's environment would import, and read its behaviour from its code.

Nothing of Megatron is imported or run: importing it pulls in CUDA-only and triton modules that
may be missing, and a broken install must not break the audit. The files are located the way
Python's import system would find `megatron.core` on `sys.path`, and the few functions that
decide the `is_first_microbatch` behaviour are read with `ast`:

- `MegatronModule.set_is_first_microbatch` (megatron/core/transformer/module.py): the settings
  its guard tests decide when the flags are re-armed (no guard: always);
- the `forward` of `TELinear`, `TELayerNormColumnParallelLinear` and `TEGroupedLinear`
  (megatron/core/extensions/transformer_engine.py; transformer/custom_layers/ before 0.9.0):
  the expression passed as `is_first_microbatch=` decides what TE gets. Helpers it calls that
  are defined in those two files are followed. A per-module answer (`will_execute_quantized`)
  means PR #7353; a test of the config's quantization settings means PR #6965; only
  `disable_parameter_transpose_cache` means the released behaviour.

A version string alone would not do: checkouts and dev builds carry the number of the next
release whatever they contain. docs/megatron-releases.md lists what each release has.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from qaudit.plan.policies import REARM_SETTINGS
from qaudit.plan.upstream.bounded import is_dir, is_file, parse_python, shown
from qaudit.plan.upstream.dist_info import VersionRead, dist_info_version, plausible_version
from qaudit.plan.upstream.editable import finder_roots, pth_roots
from qaudit.plan.upstream.git_head import checkout_commit
from qaudit.plan.upstream.releases import MegatronBehaviour

_MAX_SOURCE_BYTES = 8 * 1024 * 1024
_MODULE_PY = "megatron/core/transformer/module.py"
_TE_WRAPPER_FILES = ("megatron/core/extensions/transformer_engine.py",
                     "megatron/core/transformer/custom_layers/transformer_engine.py")
_CONFIG_FILES = ("megatron/core/transformer/transformer_config.py",
                 "megatron/core/model_parallel_config.py")
_WRAPPERS = ("TELinear", "TELayerNormColumnParallelLinear", "TEGroupedLinear")
# How strongly each passing rule tracks: when wrappers disagree, the one that loses the most
# gradients (the first here) is audited, so that a mixed install is never passed too easily.
_PASSING_ORDER = ("flag", "legacy", "config", "module")
# Syntax-tree nodes visited while reading one Megatron's behaviour (indexing its functions,
# following helper calls, looking for settings and names). megatron-core 0.19.2 takes 17,227;
# a file whose helpers call each other N ways deep took N^4 walks before the memo (59 s at
# N=24). Past this, "could not read its behaviour" with the reason, never minutes.
MAX_READ_NODES = 1_000_000


class UnreadableMegatron(Exception):
    """The code was found but its behaviour could not be read; the message says why."""


@dataclass(frozen=True)
class MegatronLocation:
    root: Path  # the sys.path entry holding megatron/core/
    version: str | None  # the package's own version, or package_info.py's for a checkout
    kind: str  # "package" (a megatron-core distribution is installed there) or "checkout"
    version_problem: str | None = None  # why no version could be read
    commit: str | None = None  # a git checkout's HEAD (qaudit/plan/upstream/git_head.py)
    via: str | None = None  # how Python reaches it when not a sys.path entry (editable install)

    def describe(self) -> str:
        return f"{self.kind} at {shown(self.root)}" + (f" ({self.via})" if self.via else "")


def locate_megatron(search_path: Sequence[str] | None = None) -> MegatronLocation | None:
    """The `megatron.core` that `import megatron.core` would find on `search_path` (sys.path by
    default), without importing anything. The working directory ('' entries) is skipped: qaudit
    never imports from it. After the entries, the directories `.pth` files add and the
    editable installs' finders (qaudit/plan/upstream/editable.py), as Python asks them."""
    entries = [Path(entry) for entry in (search_path if search_path is not None else sys.path)
               if isinstance(entry, str) and entry not in ("", ".")]
    for root in entries:
        package = root / "megatron"
        if is_file(package / "__init__.py") and not is_dir(package / "core"):
            return None  # a regular `megatron` package without core hides later entries
        if is_file(package / "core" / "__init__.py"):
            return megatron_at_root(root)
    for found in (pth_roots, finder_roots):
        for root in entries:
            for candidate, via in found(root):
                if is_file(candidate / "megatron" / "core" / "__init__.py"):
                    return megatron_at_root(candidate, via=via)
    return None


def megatron_at(path: Path) -> MegatronLocation | None:
    """The Megatron at `path` (`--megatron PATH`): a checkout or a directory holding
    `megatron/core/`, or `megatron/` or `megatron/core/` itself; None when there is none."""
    for root in (path, path.parent, path.parent.parent):
        if is_file(root / "megatron" / "core" / "__init__.py") \
                and (root == path or path.name in ("megatron", "core")):
            return megatron_at_root(root)
    return None


def megatron_at_root(root: Path, via: str | None = None) -> MegatronLocation:
    version, problem, kind = _version_of(root, checkout=via is not None)
    return MegatronLocation(root, version, kind, version_problem=problem,
                            commit=checkout_commit(root), via=via)


def _version_of(root: Path, checkout: bool) -> tuple[str | None, str | None, str]:
    """(version, why none, kind): the distribution's metadata beside it, else package_info.py
    (an editable install's metadata sits in site-packages, not beside its checkout)."""
    read = VersionRead(None) if checkout else dist_info_version(root, "megatron_core-")
    if read.version is not None:
        return read.version, None, "package"
    version, problem = _package_info_version(root)
    # A distribution whose METADATA cannot be read is said, even when package_info.py answers.
    problem = "; ".join(p for p in (read.problem, problem if version is None else None) if p)
    return version, problem or None, "checkout"


def _package_info_version(root: Path) -> tuple[str | None, str | None]:
    try:
        tree = _parse(root / "megatron/core/package_info.py")
    except UnreadableMegatron as exc:
        return None, str(exc)
    parts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant):
            parts[node.targets[0].id] = node.value.value
    numbers = [parts.get(k) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(isinstance(n, int) and 0 <= n < 10**6 for n in numbers):
        return None, "package_info.py has no MAJOR, MINOR, PATCH numbers"
    pre = parts.get("PRE_RELEASE")
    version = ".".join(str(n) for n in numbers) + (pre if isinstance(pre, str) else "")
    problem = plausible_version(version)
    return (None, f"package_info.py holds {problem}") if problem else (version, None)


def _parse(path: Path) -> ast.Module:
    return parse_python(path, _MAX_SOURCE_BYTES, UnreadableMegatron)


def read_behaviour(location: MegatronLocation) -> MegatronBehaviour:
    """The tracking behaviour and settings of the Megatron at `location`, read from its code."""
    root = location.root
    module_tree = _parse(root / _MODULE_PY)
    wrapper_path = next((root / f for f in _TE_WRAPPER_FILES if is_file(root / f)), None)
    if wrapper_path is None:
        raise UnreadableMegatron("no TE wrappers (megatron/core/extensions/transformer_engine.py)")
    wrapper_tree = _parse(wrapper_path)
    helpers = _Functions([wrapper_tree, module_tree])
    rearm_on = _rearm_guard(module_tree, helpers)
    passing = _passing_rule(wrapper_tree, helpers)
    if passing in ("flag", "legacy"):
        policy = ("always-rearm" if rearm_on is None
                  else "legacy" if "quant_recipe" in rearm_on else "pre-5642")
    else:
        policy = passing
    return MegatronBehaviour(
        policy=policy, passing=passing, rearm_on=rearm_on,
        te_recipes=any(isinstance(n, ast.ClassDef) and n.name == "TEQuantizationParams"
                       for n in wrapper_tree.body),
        will_execute_quantized=any(_method(wrapper_tree, cls, "will_execute_quantized")
                                   for cls in _WRAPPERS),
        missing_fields=_missing_fields(root))


def _missing_fields(root: Path) -> frozenset[str]:
    from qaudit.plan.upstream.releases import FIELD_SINCE

    present: set[str] = set()
    for relative in _CONFIG_FILES:
        path = root / relative
        if not is_file(path):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef):
                present.update(item.target.id for item in node.body
                               if isinstance(item, ast.AnnAssign)
                               and isinstance(item.target, ast.Name))
    if not present:
        raise UnreadableMegatron("no TransformerConfig fields found")
    return frozenset(name for name in FIELD_SINCE if name not in present)


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
    return None


class _Functions:
    """Functions and methods defined in the files read, by name, for following helper calls;
    also the reading's work budget (`walk` counts every node visited) and its memos."""

    def __init__(self, trees: Iterable[ast.Module]) -> None:
        self.left = self.limit = MAX_READ_NODES
        self.by_name: dict[str, ast.AST] = {}
        self._called: dict[int, list[ast.AST]] = {}
        self.decided: dict[tuple[int, frozenset[str], int], bool] = {}
        for tree in trees:
            for node in self.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.by_name.setdefault(node.name, node)

    def walk(self, node: ast.AST) -> Iterable[ast.AST]:
        """`ast.walk`, each node counted against the budget."""
        for found in ast.walk(node):
            self.left -= 1
            if self.left < 0:
                raise UnreadableMegatron(f"following its helper calls visits more than "
                                         f"{self.limit} syntax-tree nodes")
            yield found

    def called(self, node: ast.AST) -> list[ast.AST]:
        known = self._called.get(id(node))  # nodes live as long as their trees: ids hold
        if known is not None:
            return known
        found = []
        for call in self.walk(node):
            if isinstance(call, ast.Call):
                name = (call.func.id if isinstance(call.func, ast.Name)
                        else call.func.attr if isinstance(call.func, ast.Attribute) else None)
                if name in self.by_name:
                    found.append(self.by_name[name])
        self._called[id(node)] = found
        return found


def _reachable(nodes: list[ast.AST], helpers: _Functions, depth: int = 4) -> list[ast.AST]:
    """`nodes` and the bodies of the helpers they call, transitively (bounded)."""
    seen: list[ast.AST] = []
    seen_ids: set[int] = set()
    frontier = list(nodes)
    for _ in range(depth + 1):
        following = []
        for node in frontier:
            if id(node) in seen_ids:
                continue
            seen_ids.add(id(node))
            seen.append(node)
            following.extend(helpers.called(node))
        frontier = following
    return seen


def _config_settings(nodes: list[ast.AST], helpers: _Functions) -> set[str]:
    """The quantization settings read from a config: `x.config.fp8`, `config.fp4`,
    `getattr(self.config, "use_kitchen", False)`."""
    found = set()
    for root in nodes:
        for node in helpers.walk(root):
            if isinstance(node, ast.Attribute) and node.attr in REARM_SETTINGS \
                    and _is_config(node.value):
                found.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "getattr" and len(node.args) >= 2 \
                    and _is_config(node.args[0]) and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value in REARM_SETTINGS:
                found.add(node.args[1].value)
    return found


def _is_config(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "config") or \
        (isinstance(node, ast.Attribute) and node.attr == "config")


def _mentions(nodes: list[ast.AST], name: str, helpers: _Functions) -> bool:
    for root in nodes:
        for node in helpers.walk(root):
            if (isinstance(node, ast.Attribute) and node.attr == name) or \
                    (isinstance(node, ast.Constant) and node.value == name) or \
                    (isinstance(node, ast.Name) and node.id == name):
                return True
    return False


def _module_decides(node: ast.AST, module_names: set[str], helpers: _Functions,
                    depth: int = 4) -> bool:
    """Whether the module itself is asked `will_execute_quantized` on the way to the value:
    directly, or by a helper the module is passed to (followed by parameter, so that a helper
    that could take a module but is called with the config alone does not count). Each
    (node, names, depth) is decided once: helpers calling each other N ways cost N, not N^4."""
    key = (id(node), frozenset(module_names), depth)
    known = helpers.decided.get(key)
    if known is None:
        known = helpers.decided[key] = _decides(node, module_names, helpers, depth)
    return known


def _decides(node: ast.AST, module_names: set[str], helpers: _Functions, depth: int) -> bool:
    for call in helpers.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "will_execute_quantized" \
                and isinstance(func.value, ast.Name) and func.value.id in module_names:
            return True
        if isinstance(func, ast.Name) and func.id == "getattr" and len(call.args) >= 2 \
                and isinstance(call.args[0], ast.Name) and call.args[0].id in module_names \
                and isinstance(call.args[1], ast.Constant) \
                and call.args[1].value == "will_execute_quantized":
            return True
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else None
        callee = helpers.by_name.get(name or "")
        if depth == 0 or not isinstance(callee, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in callee.args.posonlyargs + callee.args.args]
        bound_method = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        offset = 1 if bound_method else 0  # `obj.method(...)`: the first parameter is obj
        passed = set()
        if bound_method and func.value.id in module_names and params:
            passed.add(params[0])
        for index, arg in enumerate(call.args):
            if isinstance(arg, ast.Name) and arg.id in module_names \
                    and index + offset < len(params):
                passed.add(params[index + offset])
        passed.update(kw.arg for kw in call.keywords
                      if kw.arg and isinstance(kw.value, ast.Name) and kw.value.id in module_names)
        if passed and _module_decides(callee, passed, helpers, depth - 1):
            return True
    return False


def _rearm_guard(tree: ast.Module, helpers: _Functions) -> tuple[str, ...] | None:
    method = _method(tree, "MegatronModule", "set_is_first_microbatch")
    if method is None:
        raise UnreadableMegatron("MegatronModule.set_is_first_microbatch not found in "
                                 f"{_MODULE_PY}")
    for statement in method.body:
        if isinstance(statement, ast.If) and _arms(statement.body, helpers):
            guard = [statement.test]
        elif isinstance(statement, ast.If) and _returns(statement.body):
            guard = [statement.test]  # an early exit tests the same settings
        else:
            if _arms([statement], helpers):
                return None  # the flags are set before any test: always re-armed
            continue
        settings = _config_settings(_reachable(guard, helpers), helpers)
        if not settings:
            raise UnreadableMegatron("the re-arm guard of set_is_first_microbatch tests no "
                                     "quantization setting qaudit knows")
        return tuple(s for s in REARM_SETTINGS if s in settings)
    raise UnreadableMegatron("set_is_first_microbatch sets no is_first_microbatch flag")


def _arms(statements: list[ast.stmt], helpers: _Functions) -> bool:
    for statement in statements:
        for node in helpers.walk(statement):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and node.value.value is True \
                    and any(isinstance(t, ast.Attribute) and t.attr == "is_first_microbatch"
                            for t in node.targets):
                return True
    return False


def _returns(statements: list[ast.stmt]) -> bool:
    return bool(statements) and isinstance(statements[-1], ast.Return)


def _passing_rule(tree: ast.Module, helpers: _Functions) -> str:
    rules = []
    for cls in _WRAPPERS:
        forward = _method(tree, cls, "forward")
        if forward is None:
            continue  # TEGroupedLinear came in 0.8.0
        rules.append(_passed_value_rule(cls, forward, helpers))
    if not rules:
        raise UnreadableMegatron("no TE wrapper forward() found")
    return min(rules, key=_PASSING_ORDER.index)


def _passed_value_rule(cls: str, forward: ast.AST, helpers: _Functions) -> str:
    values = [kw.value for node in helpers.walk(forward) if isinstance(node, ast.Call)
              for kw in node.keywords if kw.arg == "is_first_microbatch"]
    if not values:
        raise UnreadableMegatron(f"{cls}.forward passes no is_first_microbatch to TE")
    # A local variable: follow its assignments in forward().
    local = {v.id for v in values if isinstance(v, ast.Name)}
    sources: list[ast.AST] = [v for v in values if not isinstance(v, ast.Name)]
    for node in helpers.walk(forward):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in local for t in targets) and node.value:
                sources.append(node.value)
    if not sources:
        raise UnreadableMegatron(f"cannot tell what {cls}.forward passes as is_first_microbatch")
    if any(_module_decides(source, {"self"}, helpers) for source in sources):
        return "module"
    reached = _reachable(sources, helpers)
    if _config_settings(reached, helpers):
        return "config"
    if _mentions(reached, "disable_parameter_transpose_cache", helpers):
        return "legacy"
    if _mentions(reached, "is_first_microbatch", helpers):
        return "flag"
    raise UnreadableMegatron(f"unrecognised is_first_microbatch passed by {cls}.forward")
