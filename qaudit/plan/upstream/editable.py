"""Where an editable install puts `megatron.core` when no `sys.path` entry holds it.

Megatron-Bridge installs its vendored Megatron-LM (`3rdparty/Megatron-LM`) editable (uv or pip
`-e`). The build backend then writes into site-packages either a `.pth` file whose lines are
directories (site adds them to `sys.path` at startup) or a finder module
`__editable___<dist>_finder.py` whose `MAPPING` names each top-level package's directory and
which Python asks after `sys.path` (`sys.meta_path`). Both are read as data, bounded: the
`.pth` lines that are paths (an `import` line is code and is skipped), and the finder's
`MAPPING` literal (parsed with `ast`, never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

from qaudit.plan.upstream.bounded import RefusedRead, names_in, read_text, shown

_PTH_BYTES = 16 * 1024  # a .pth file is a few lines
_PTH_FILES = 256
_PTH_LINES = 1024  # path lines taken per directory, all its .pth files together
# setuptools names a finder after its distribution: megatron-core's (or a fork's) starts so.
_FINDER_PREFIX = "__editable___megatron"
_FINDER_BYTES = 256 * 1024  # the template is a few KiB, plus one line per mapped package
_FINDER_FILES = 16


def pth_roots(site_dir: Path) -> list[tuple[Path, str]]:
    """(directory, where it comes from) for each path line of the `.pth` files in
    `site_dir`, in the order site reads them."""
    found: list[tuple[Path, str]] = []
    for name in names_in(site_dir, ending=".pth", most=_PTH_FILES):
        try:
            text = read_text(site_dir / name, _PTH_BYTES)
        except RefusedRead:
            continue
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                continue
            found.append((site_dir / line, f"via {shown(site_dir / name)}"))
            if len(found) >= _PTH_LINES:
                return found
    return found


def finder_roots(site_dir: Path) -> list[tuple[Path, str]]:
    """(sys.path-like root holding `megatron/core`, where it comes from) for each editable
    finder in `site_dir` that maps `megatron` or `megatron.core`."""
    found = []
    for name in names_in(site_dir, starting=_FINDER_PREFIX, ending="_finder.py",
                         most=_FINDER_FILES):
        mapping = _mapping(site_dir / name)
        via = f"editable install, {shown(site_dir / name)}"
        for package, ups in (("megatron.core", 2), ("megatron", 1)):
            directory = mapping.get(package)
            if isinstance(directory, str) and directory:
                root = Path(directory)
                for _ in range(ups):
                    root = root.parent
                found.append((root, via))
    return found


def _mapping(path: Path) -> dict[str, object]:
    """The finder's `MAPPING = {...}` literal, or {} when there is none to read."""
    try:
        tree = ast.parse(read_text(path, _FINDER_BYTES, whole=True), filename=str(path))
    except (RefusedRead, SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in targets) \
                and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}
