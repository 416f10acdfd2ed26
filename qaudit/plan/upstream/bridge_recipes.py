"""Megatron-Bridge's named mixed-precision recipes, read from the user's Bridge source.

A Bridge dump may name its recipe (`mixed_precision: bf16_with_mxfp8_mixed`); what the name
means is whatever the Bridge that runs it defines in `megatron/bridge/training/mixed_precision.py`.
That file is found where Python would find it (an installed wheel, a Bridge checkout's `src/`
through an editable install, or Megatron-LM's in-tree `megatron/bridge/`, Bridge being folded
into Megatron-LM), or under `--megatron PATH`, and read as source text with `ast`: never
imported (it imports torch and megatron.core).

What is evaluated is the static shape the recipes have had since Bridge 0.1: a function that
returns `MixedPrecisionConfig(...)` with constant keywords, or starts from another recipe
(`cfg = bf16_mixed()`), assigns constant fields (`cfg.fp8 = "hybrid"`) and returns it;
registered with a decorator that stores into `MIXED_PRECISION_RECIPES`, or listed in that
dict. The dataclass's field defaults are read too, and its `__setattr__` that keeps each
`*_param` / `*_param_gather` pair equal is followed. Anything else (a condition, a loop, a
call to something else, a computed value) makes the table unreadable: the caller then uses
qaudit's own table and says why. The work is bounded by a node budget.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from qaudit.load.bridge.mixed_precision import QAUDIT_TABLE, RecipeTable
from qaudit.plan.upstream.bounded import (home_expanded, is_file, names_a_path, parse_python,
                                          shown)
from qaudit.plan.upstream.dist_info import dist_info_version
from qaudit.plan.upstream.editable import finder_roots, pth_roots

RECIPES_FILE = "megatron/bridge/training/mixed_precision.py"
_PACKAGE_INFO = "megatron/bridge/package_info.py"
_MAX_SOURCE_BYTES = 2 * 1024 * 1024
# Syntax-tree nodes visited while evaluating one file: Bridge 0.6.2's (1,455 nodes) takes 2,621.
MAX_READ_NODES = 200_000
_MAX_CHAIN = 32  # recipes starting from recipes, this many deep at most
# Field values written while evaluating (each recipe built from the class or copied from
# another before it changes a field): Bridge 0.6.2's file writes about 700. One recipe over a
# 15,000-field class under 6,001 names was copied per name (2.4 GB); names now share one
# evaluated recipe, and what is still written is counted.
MAX_FIELDS_WRITTEN = 1_000_000
_CLASS = "MixedPrecisionConfig"
_REGISTRY = "MIXED_PRECISION_RECIPES"
_PAIRS = {"fp8_param": "fp8_param_gather", "fp8_param_gather": "fp8_param",
          "fp4_param": "fp4_param_gather", "fp4_param_gather": "fp4_param"}
# torch dtypes as the other readers name them (`{_target_: torch.bfloat16}` reads "bfloat16").
_DTYPES = {"bfloat16": "bfloat16", "half": "float16", "float16": "float16",
           "float": "float32", "float32": "float32"}


class UnreadableRecipes(Exception):
    """The file was found but its table cannot be evaluated statically; the message says why."""


@dataclass(frozen=True)
class BridgeLocation:
    root: Path  # the directory holding megatron/bridge/
    version: str | None
    layout: str  # "Megatron-Bridge", "Megatron-Bridge checkout", "Megatron-LM's megatron/bridge"

    def describe(self) -> str:
        version = f" {self.version}" if self.version else " (version unknown)"
        return f"{self.layout}{version} at {shown(self.root)}"


def locate_bridge(search_path: Sequence[str] | None = None) -> BridgeLocation | None:
    """The `megatron.bridge` recipes file Python would find on `search_path` (sys.path by
    default; the working directory skipped), then through `.pth` files and editable finders."""
    entries = [Path(entry) for entry in (search_path if search_path is not None else sys.path)
               if isinstance(entry, str) and entry not in ("", ".")]
    for root in entries:
        if is_file(root / RECIPES_FILE):
            return bridge_at_root(root)
    for found in (pth_roots, finder_roots):
        for root in entries:
            for candidate, _via in found(root):
                if is_file(candidate / RECIPES_FILE):
                    return bridge_at_root(candidate)
    return None


def bridge_at(path: Path) -> BridgeLocation | None:
    """The Bridge at `--megatron PATH`: a directory holding megatron/bridge/ (an installed
    wheel's site-packages, a Megatron-LM checkout), a Bridge checkout (its src/), or
    megatron/ or megatron/bridge/ itself."""
    candidates = [path, path / "src"]
    if path.name == "megatron":
        candidates.append(path.parent)
    if path.name == "bridge" and path.parent.name == "megatron":
        candidates.append(path.parent.parent)
    for root in candidates:
        if is_file(root / RECIPES_FILE):
            return bridge_at_root(root)
    return None


def bridge_at_root(root: Path) -> BridgeLocation:
    version = _package_info_version(root) or dist_info_version(root, "megatron_bridge-").version
    if is_file(root / "megatron/core/__init__.py"):
        layout = "Megatron-LM's megatron/bridge"
    elif root.name == "src" and is_file(root.parent / "pyproject.toml"):
        layout = "Megatron-Bridge checkout"
    else:
        layout = "Megatron-Bridge"
    return BridgeLocation(root, version, layout)


def _package_info_version(root: Path) -> str | None:
    try:
        tree = _parse(root / _PACKAGE_INFO)
    except UnreadableRecipes:
        return None
    parts = {node.targets[0].id: node.value.value for node in tree.body
             if isinstance(node, ast.Assign) and len(node.targets) == 1
             and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)}
    numbers = [parts.get(k) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(isinstance(n, int) and 0 <= n < 10**6 for n in numbers):
        return None
    pre = parts.get("PRE_RELEASE")
    return ".".join(map(str, numbers)) + (pre if isinstance(pre, str) and len(pre) < 32 else "")


def recipe_table_for(megatron: object = "auto",
                     search_path: Sequence[str] | None = None) -> RecipeTable:
    """The table a verdict uses under `--megatron` (a spec, or a resolved target with a
    location): the Bridge at PATH, else the one Python would find; qaudit's own table when
    there is none or its file cannot be evaluated (the table's note says why)."""
    # A resolved target stands for its spec: PATH when `--megatron PATH` named it, else auto
    # (an installed Megatron's directory need not hold the Bridge).
    if not isinstance(megatron, str):
        location = getattr(megatron, "location", None)
        named = getattr(megatron, "source", None) == "named" and isinstance(location, str)
        megatron = location if named else "auto"
    spec = megatron
    if isinstance(spec, str) and spec != "auto" and names_a_path(spec):
        found = bridge_at(home_expanded(spec, "--megatron"))
        if found is None:
            return RecipeTable(QAUDIT_TABLE.recipes, note=f"no {RECIPES_FILE} at "
                               f"{shown(spec)}")
    else:
        found = locate_bridge(search_path)
        if found is None:
            return RecipeTable(QAUDIT_TABLE.recipes, note="no Megatron-Bridge importable")
    try:
        return read_recipe_table(found)
    except UnreadableRecipes as exc:
        return RecipeTable(QAUDIT_TABLE.recipes, note=f"found {found.describe()} but could "
                           f"not read its recipes: {exc}")


def read_recipe_table(location: BridgeLocation) -> RecipeTable:
    path = location.root / RECIPES_FILE
    defaults, recipes = evaluate(_parse(path), shown(path))
    return RecipeTable(recipes, defaults, origin=location.describe())


def _parse(path: Path) -> ast.Module:
    return parse_python(path, _MAX_SOURCE_BYTES, UnreadableRecipes)


def evaluate(tree: ast.Module, label: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the dataclass's defaults, {registered name: every field's value}) of a parsed file."""
    return _Evaluator(tree, label).run()


class _Evaluator:
    def __init__(self, tree: ast.Module, label: str) -> None:
        self.tree, self.label = tree, label
        self.left = MAX_READ_NODES
        self.written = 0
        self.spend(tree)  # the whole file once; recipes are charged again as evaluated
        self.functions = {node.name: node for node in tree.body
                          if isinstance(node, ast.FunctionDef)}
        self.memo: dict[str, dict[str, Any]] = {}

    def fail(self, node: ast.AST | None, why: str) -> UnreadableRecipes:
        line = getattr(node, "lineno", None)
        return UnreadableRecipes(f"{self.label}{':' + str(line) if line else ''}: {why}")

    def spend(self, node: ast.AST) -> None:
        for _ in ast.walk(node):
            self.left -= 1
        if self.left < 0:
            raise UnreadableRecipes(f"{self.label}: more than {MAX_READ_NODES} syntax-tree "
                                    "nodes to evaluate")

    def write(self, node: ast.AST, fields: int) -> None:
        self.written += fields
        if self.written > MAX_FIELDS_WRITTEN:
            raise self.fail(node, f"recipes that write more than {MAX_FIELDS_WRITTEN} field "
                            "values to evaluate")

    def run(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        self.order, self.defaults, self.sync = self._dataclass()
        names = self._registered()
        if not names:
            raise self.fail(None, f"no recipe registered in {_REGISTRY}")
        recipes = {}
        for name, function in names.items():
            # Several names for one function share its evaluated fields (read-only from here:
            # recipe_by_name copies what it returns).
            recipes[name] = self._recipe(function, 0)
        return dict(self.defaults), recipes

    def _dataclass(self) -> tuple[list[str], dict[str, Any], bool]:
        cls = next((node for node in self.tree.body
                    if isinstance(node, ast.ClassDef) and node.name == _CLASS), None)
        if cls is None:
            raise self.fail(None, f"no class {_CLASS}")
        self.spend(cls)
        order, defaults, sync = [], {}, False
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if item.value is None:
                    raise self.fail(item, f"{_CLASS}.{item.target.id} has no default")
                order.append(item.target.id)
                defaults[item.target.id] = self._constant(item.value)
            elif isinstance(item, ast.FunctionDef) and item.name == "__setattr__":
                # The pair kept equal: both names of a pair appear in the method.
                mentioned = {n.value for n in ast.walk(item) if isinstance(n, ast.Constant)}
                sync = {"fp8_param", "fp8_param_gather"} <= mentioned
        return order, defaults, sync

    def _registered(self) -> dict[str, ast.FunctionDef]:
        registrars = {name for name, function in self.functions.items()
                      if any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
                             and isinstance(n.value, ast.Name) and n.value.id == _REGISTRY
                             for n in ast.walk(function))}
        found: dict[str, ast.FunctionDef] = {}
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                if any(isinstance(d, ast.Name) and d.id in registrars
                       for d in node.decorator_list):
                    found[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id == _REGISTRY \
                            and isinstance(node.value, ast.Dict):
                        for key, value in zip(node.value.keys, node.value.values):
                            found[self._key(key)] = self._function(value)
                    elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                            and target.value.id == _REGISTRY:
                        found[self._key(target.slice)] = self._function(node.value)
        return found

    def _key(self, node: ast.AST | None) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        raise self.fail(node, f"a {_REGISTRY} key that is not a string constant")

    def _function(self, node: ast.AST) -> ast.FunctionDef:
        if isinstance(node, ast.Name) and node.id in self.functions:
            return self.functions[node.id]
        raise self.fail(node, f"a {_REGISTRY} entry that is not a function of this file")

    def _recipe(self, function: ast.FunctionDef, depth: int) -> dict[str, Any]:
        known = self.memo.get(function.name)
        if known is not None:
            return known  # shared: a recipe that changes it copies it first
        if depth > _MAX_CHAIN:
            raise self.fail(function, f"recipes starting from recipes more than {_MAX_CHAIN} "
                            "deep (a cycle?)")
        self.spend(function)
        if function.args.args or function.args.posonlyargs or function.args.kwonlyargs \
                or function.args.vararg or function.args.kwarg:
            raise self.fail(function, f"recipe {function.name} takes arguments")
        local: str | None = None
        values: dict[str, Any] | None = None
        owned = False  # `values` is this recipe's own (else another recipe's, shared)
        for statement in function.body:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                continue  # the docstring
            if isinstance(statement, ast.Return):
                if isinstance(statement.value, ast.Name) and statement.value.id == local:
                    break
                values = self._built(statement.value, depth)
                break
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) \
                    else [statement.target]
                if len(targets) != 1 or statement.value is None:
                    raise self.fail(statement, f"recipe {function.name}: an assignment "
                                    "qaudit cannot evaluate")
                target = targets[0]
                if isinstance(target, ast.Name) and local is None:
                    local, values = target.id, self._built(statement.value, depth)
                    owned = isinstance(statement.value, ast.Call) \
                        and isinstance(statement.value.func, ast.Name) \
                        and statement.value.func.id == _CLASS
                    continue
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == local and values is not None:
                    if target.attr not in self.defaults:
                        raise self.fail(target, f"recipe {function.name} sets {target.attr}, "
                                        f"not a field of {_CLASS}")
                    if not owned:
                        self.write(statement, len(values))
                        values, owned = dict(values), True
                    self._assign(values, target.attr, self._constant(statement.value))
                    continue
            raise self.fail(statement, f"recipe {function.name}: a statement qaudit cannot "
                            "evaluate statically")
        else:
            raise self.fail(function, f"recipe {function.name} returns nothing qaudit can read")
        if values is None:
            raise self.fail(function, f"recipe {function.name} returns nothing qaudit can read")
        self.memo[function.name] = values
        return values

    def _built(self, node: ast.AST | None, depth: int) -> dict[str, Any]:
        """`MixedPrecisionConfig(k=constant, ...)` or another recipe's `name()`."""
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            raise self.fail(node, f"expected {_CLASS}(...) or another recipe's call")
        if node.func.id == _CLASS:
            given = {}
            for keyword in node.keywords:
                if keyword.arg is None or keyword.arg not in self.defaults:
                    raise self.fail(keyword, f"{_CLASS}({keyword.arg or '**...'}=...): not a field")
                given[keyword.arg] = self._constant(keyword.value)
            self.write(node, len(self.order))
            values: dict[str, Any] = {}
            for name in self.order:  # dataclass __init__ assigns in field order
                self._assign(values, name, given.get(name, self.defaults[name]))
            return values
        function = self.functions.get(node.func.id)
        if function is None or node.keywords:
            raise self.fail(node, f"{node.func.id}(): not {_CLASS} nor a recipe of this file")
        return self._recipe(function, depth + 1)

    def _assign(self, values: dict[str, Any], name: str, value: Any) -> None:
        """Setting a field; with the pair-keeping __setattr__, its partner follows once set."""
        values[name] = value
        partner = _PAIRS.get(name)
        if self.sync and partner in values and values[partner] != value:
            values[partner] = value

    def _constant(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str,
                                                                      type(None))):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
                and isinstance(node.operand, ast.Constant) \
                and type(node.operand.value) in (int, float):
            return -node.operand.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "torch" and node.attr in _DTYPES:
            return _DTYPES[node.attr]
        raise self.fail(node, "a value that is not a constant")
