"""Apply a printed remedy as a user would: read the text, edit the copy of the input it names.

The helper knows only the sentence forms qaudit prints (qaudit/judge/remedies.py) and does
exactly what each says, on text: a remedy it cannot apply as printed fails the test that
asked, which is the point (issue 45: a printed remedy works when applied as printed).
"""

from __future__ import annotations

import re
from pathlib import Path


class NotApplicable(AssertionError):
    """The remedy's text does not say an edit this input can take."""


def first_remedy(fix: str) -> str:
    return fix.split("; or ")[0]


def _indent_of(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _set_under(lines: list[str], section: str, key: str, value: str) -> None:
    """`key: value` inside the top-level block `section:` (replaced where the key is there)."""
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"{section}:"), None)
    if start is None:
        raise NotApplicable(f"no top-level '{section}:' block to put {key} under")
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and not lines[i][:1].isspace()
                and not lines[i].lstrip().startswith("#")), len(lines))
    body = [i for i in range(start + 1, end)
            if lines[i].strip() and not lines[i].lstrip().startswith("#")]
    indent = _indent_of(lines[body[0]]) if body else "  "
    for i in body:
        if re.match(rf"{re.escape(indent)}{re.escape(key)}\s*:", lines[i]):
            lines[i] = f"{indent}{key}: {value}"
            return
    lines.insert(start + 1, f"{indent}{key}: {value}")


def _set_top(lines: list[str], key: str, value: str) -> None:
    for i, line in enumerate(lines):
        if re.match(rf"{re.escape(key)}\s*:", line):
            lines[i] = f"{key}: {value}"
            return
    lines.append(f"{key}: {value}")


def _line(lines: list[str], number: int, must_hold: str) -> int:
    index = number - 1
    if not 0 <= index < len(lines) or must_hold not in lines[index]:
        raise NotApplicable(f"line {number} does not hold {must_hold!r}")
    return index


def _remove_word(text: str, word: str) -> str:
    out, count = re.subn(rf"(?<![\w-]){re.escape(word)}(?![\w-])[ \t]?", "", text, count=1)
    if not count:
        raise NotApplicable(f"{word} is not on that line")
    return out


def apply(fix: str, path: Path, overrides: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Apply the first remedy of `fix` to `path` (edited in place) or to the Bridge override
    arguments; returns the overrides to audit with."""
    remedy = first_remedy(fix)
    if m := re.match(r"only together with \w+ off \([^)]*\): (.*?) \(", remedy):
        # Two edits: those at a line first, the later line first, so no edit moves another's.
        edits = m[1].split(" and ")
        at_line = [int(n[1]) if (n := re.search(r" at line (\d+)$", e)) else 0 for e in edits]
        for _, edit in sorted(zip(at_line, edits), key=lambda pair: -pair[0]):
            overrides = apply(f"{edit} (as printed)", path, overrides)
        return overrides
    lines = path.read_text(encoding="utf-8").splitlines()
    if m := re.match(r"set (\w+): (\S+) under model: \(", remedy):
        _set_under(lines, "model", m[1], m[2])
    elif m := re.match(r"set (\w+): (\S+) \(", remedy):
        _set_top(lines, m[1], m[2])
    elif m := re.match(r"remove (--[\w-]+) from MODEL_ARGS at line (\d+) \(", remedy):
        del lines[_line(lines, int(m[2]), m[1])]
    elif m := re.match(r"set (--[\w-]+): (\S+) in MODEL_ARGS at line (\d+) \(", remedy):
        index = _line(lines, int(m[3]), m[1])
        lines[index] = f"{_indent_of(lines[index])}{m[1]}: {m[2]}"
    elif m := re.match(r"add (--[\w-]+): (\S+) to MODEL_ARGS \(", remedy):
        _set_under(lines, "MODEL_ARGS", m[1], m[2])
    elif m := re.match(r"remove (--[\w-]+) from the launch command at line (\d+) \(", remedy):
        index = _line(lines, int(m[2]), m[1])
        lines[index] = _remove_word(lines[index], m[1])
    elif m := re.match(r"add (--[\w-]+(?: [^\s(]+)?) before (--[\w-]+) at line (\d+) \(", remedy):
        index = _line(lines, int(m[3]), m[2])
        lines[index] = re.sub(rf"(?<![\w-]){re.escape(m[2])}(?![\w-])",
                              lambda found: f"{m[1]} {found[0]}", lines[index], count=1)
    elif m := re.match(r"change (--[\w-]+)'s value to (\S+) at line (\d+) \(", remedy):
        index = _line(lines, int(m[3]), m[1])
        lines[index] = re.sub(rf"({re.escape(m[1])}[ =])\S+", rf"\g<1>{m[2]}", lines[index],
                              count=1)
    elif m := re.match(r"((?:\+\+)?(?:model|ddp)\.\w+=\S+) \(", remedy):
        return (*overrides, m[1])
    else:
        raise NotApplicable(f"cannot be applied as printed: {remedy!r}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return overrides


def apply_snippet(snippet: str, path: Path, bridge: bool,
                  overrides: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Apply --suggest's `change:` text: a YAML key (under `model:` when it says so), a
    launch-script or MODEL_ARGS edit (a `# ` sentence, as the fix line words it), or for a
    Bridge dump the override argument it names."""
    lines = snippet.splitlines()
    if bridge:
        m = re.search(r"# or the override argument: (\S+)$", snippet)
        if not m:
            raise NotApplicable(f"no override argument in {snippet!r}")
        return (*overrides, m[1])
    if lines[0].startswith("# needs a"):
        raise NotApplicable(f"needs a code change: {snippet!r}")
    if lines[0].startswith("# "):
        return apply(lines[0][2:] + " (", path, overrides)
    if lines[0] == "model:" and len(lines) == 2:
        key, value = lines[1].strip().split(": ", 1)
        return apply(f"set {key}: {value} under model: (", path, overrides)
    if len(lines) == 1 and ": " in lines[0]:
        key, value = lines[0].split(": ", 1)
        return apply(f"set {key}: {value} (", path, overrides)
    raise NotApplicable(f"cannot be applied as printed: {snippet!r}")
