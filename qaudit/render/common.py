"""Helpers shared by the renderers: grouping rows and findings for display, short names, paths.

Nothing here decides anything: it only groups, shortens and orders what the report says.
Every helper tolerates report fields it does not know yet (read with getattr).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from qaudit.errors import printable
from qaudit.files.paths import repo_relative  # noqa: F401  (renderers import it from here)
from qaudit.judge.report import SEVERITIES, Finding, ModuleRow, Report
from qaudit.run.rows import index_set_text

# `decoder.layers.12.mlp.linear_fc1` -> prefix `decoder.layers`, index 12, rest `mlp.linear_fc1`.
_LAYER = re.compile(r"^(?P<prefix>(?:.*\.)?layers)\.(?P<idx>\d+)\.(?P<rest>.+)$")
# Fields that describe a module's behaviour; rows collapse only when all of them are equal.
_VARYING = ("name", "grad_rel_error")


def layer_parts(name: str) -> tuple[str, int, str] | None:
    match = _LAYER.match(name)
    if not match:
        return None
    return match["prefix"], int(match["idx"]), match["rest"]


def _range(first: int, last: int) -> str:
    return str(first) if first == last else f"[{first}-{last}]"


def row_signature(row: ModuleRow) -> tuple:
    data = asdict(row) if hasattr(row, "__dataclass_fields__") else dict(vars(row))
    return tuple(sorted((k, repr(v)) for k, v in data.items() if k not in _VARYING))


@dataclass
class RowGroup:
    """One display row: a module, or the same module of consecutive identical layers."""

    name: str
    row: ModuleRow  # the first member; every member has the same signature
    members: list[ModuleRow] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.members)

    def grad_rel_error(self) -> float | None:
        """The largest relative gradient error among the members (--verify), else None."""
        values = [v for v in (getattr(m, "grad_rel_error", None) for m in self.members)
                  if isinstance(v, (int, float))]
        return max(values) if values else None


def group_rows(rows: list[Any], expand: bool = False,
               signature: Callable[[Any], Any] = None) -> list[RowGroup]:
    """Collapse runs of consecutive layers whose modules all have identical rows.

    Layers are compared whole (every module of the layer), so a block reads
    `decoder.layers.[3-60].…` for each of its modules and an odd layer splits the block.
    Module order is kept. `expand` keeps one group per module.
    """
    signature = signature or row_signature
    if expand:
        return [RowGroup(row.name, row, [row]) for row in rows]
    groups: list[RowGroup] = []
    i = 0
    while i < len(rows):
        parts = layer_parts(rows[i].name)
        if parts is None:
            groups.append(RowGroup(rows[i].name, rows[i], [rows[i]]))
            i += 1
            continue
        prefix = parts[0]
        # The run of rows under the same `…layers` prefix, split into layers in order.
        layers: list[tuple[int, list[tuple[str, ModuleRow]]]] = []
        while i < len(rows):
            parts = layer_parts(rows[i].name)
            if parts is None or parts[0] != prefix:
                break
            _, idx, rest = parts
            if not layers or layers[-1][0] != idx:
                layers.append((idx, []))
            layers[-1][1].append((rest, rows[i]))
            i += 1
        blocks: list[list[tuple[int, list[tuple[str, ModuleRow]]]]] = []
        for idx, items in layers:
            layer_signature = [(rest, signature(row)) for rest, row in items]
            if blocks:
                last_idx, last_items = blocks[-1][-1]
                last_signature = [(rest, signature(row)) for rest, row in last_items]
                if idx == last_idx + 1 and layer_signature == last_signature:
                    blocks[-1].append((idx, items))
                    continue
            blocks.append([(idx, items)])
        for block in blocks:
            label = _range(block[0][0], block[-1][0])
            for k, (rest, row) in enumerate(block[0][1]):
                members = [items[k][1] for _, items in block]
                groups.append(RowGroup(f"{prefix}.{label}.{rest}", row, members))
    return groups


def collapse_names(names: Iterable[str]) -> list[str]:
    """`a.layers.3.x`, `a.layers.4.x` -> `a.layers.[3-4].x`; other names unchanged, order kept."""
    out: list[str] = []
    runs: dict[tuple[str, str], list[int]] = {}
    order: list[Any] = []
    for name in names:
        parts = layer_parts(name)
        if parts is None:
            order.append(name)
            continue
        prefix, idx, rest = parts
        key = (prefix, rest)
        if key not in runs:
            runs[key] = []
            order.append(key)
        runs[key].append(idx)
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, rest = item
        indices = sorted(set(runs[item]))
        start = prev = indices[0]
        for idx in indices[1:] + [None]:
            if idx is not None and idx == prev + 1:
                prev = idx
                continue
            out.append(f"{prefix}.{_range(start, prev)}.{rest}")
            if idx is not None:
                start = prev = idx
    return out


# --- collapsing by index ------------------------------------------------------------------
# Modules that differ only in a number of their name (layer, expert, pipeline stage or chunk)
# and behave identically share a row: `stage[0-15]/decoder.layers.[0-5].mlp.linear_fc1`,
# `...local_experts.[0-255].linear_fc1`, a hybrid pattern's `decoder.layers.[0,2,5-7].mixer`.
# A row's index sets always cover exactly its members, and only rows with the same signature
# share one, so no behaviour is folded into another.

def name_shape(name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The text around a name's index numbers, and the numbers: `stage1/layers.3.fc1` ->
    (("stage", "/layers.", ".fc1"), (1, 3)). An index is a whole dot component or the number
    of `stage`/`chunk` in a pipelined name; `fc1`'s 1 and `0`-padded numbers are text."""
    parts = re.split(r"(\d+)", name)
    texts: list[str] = []
    indices: list[int] = []
    current = parts[0]
    for k in range(1, len(parts), 2):
        number, after = parts[k], parts[k + 1]
        opens = current == "" or current.endswith((".", "/")) or re.search(
            r"(?:^|[./])(?:stage|chunk)$", current) is not None
        closes = after == "" or after[0] in "./"
        if opens and closes and (number == "0" or not number.startswith("0")) \
                and (current != "" or after != ""):
            texts.append(current)
            indices.append(int(number))
            current = after
        else:
            current += number + after
    texts.append(current)
    return tuple(texts), tuple(indices)


def _product_blocks(tuples: list[tuple[int, ...]]) -> list[list[list[int]]]:
    """Split a set of index tuples into blocks, each the product of one set per position;
    the blocks partition the tuples exactly. Outer values whose inner sets are equal share a
    block; order is that of first appearance."""
    if not tuples or not tuples[0]:
        return [[]]
    inner: dict[int, list[tuple[int, ...]]] = {}
    for t in tuples:
        inner.setdefault(t[0], []).append(t[1:])
    by_rest: dict[frozenset, list[int]] = {}
    rests: dict[frozenset, list[tuple[int, ...]]] = {}
    for first, rest in inner.items():
        key = frozenset(rest)
        by_rest.setdefault(key, []).append(first)
        rests.setdefault(key, rest)
    blocks: list[list[list[int]]] = []
    for key, firsts in by_rest.items():
        for sub in _product_blocks(rests[key]):
            blocks.append([firsts] + sub)
    return blocks


def _shape_name(texts: tuple[str, ...], sets: list[list[int]]) -> str:
    out = texts[0]
    for values, text in zip(sets, texts[1:]):
        out += index_set_text(values) + text
    return out


def _collapsible_signature(row: Any, signature: Callable[[Any], Any]) -> Any:
    """Stage and chunk are part of the behaviour unless the name already says them."""
    stage = getattr(row, "stage", 0)
    if stage or getattr(row, "chunk", 0):
        named = row.name.startswith(f"stage{stage}/") or row.name.startswith(f"stage{stage}.")
        if not named:
            return (signature(row), stage, getattr(row, "chunk", 0))
    return signature(row)


def _signature_without_place(row: Any) -> tuple:
    data = asdict(row) if hasattr(row, "__dataclass_fields__") else dict(vars(row))
    return tuple(sorted((k, repr(v)) for k, v in data.items()
                        if k not in _VARYING and k not in ("stage", "chunk")))


def collapse_rows(rows: list[Any], expand: bool = False,
                  signature: Callable[[Any], Any] | None = None) -> list[RowGroup]:
    """One group per set of modules that behave alike and differ only in index numbers of
    their names (layers, experts, hybrid pattern positions, pipeline stages and chunks).
    Groups are ordered by their first module; `expand` keeps one group per module."""
    if expand:
        return [RowGroup(row.name, row, [row]) for row in rows]
    signature = signature or _signature_without_place
    buckets: dict[Any, list[tuple[int, tuple[int, ...], Any]]] = {}
    for position, row in enumerate(rows):
        texts, indices = name_shape(row.name)
        key = (texts, _collapsible_signature(row, signature))
        buckets.setdefault(key, []).append((position, indices, row))
    placed: list[tuple[int, RowGroup]] = []
    for (texts, _), members in buckets.items():
        by_index = {indices: (position, row) for position, indices, row in members}
        if len(by_index) < len(members):  # the same name twice: never merge those
            placed.extend((position, RowGroup(row.name, row, [row]))
                          for position, _, row in members)
            continue
        for sets in _product_blocks([indices for _, indices, _ in members]):
            chosen = [by_index[t] for t in _tuples_of(sets)]
            chosen.sort(key=lambda item: item[0])
            group_rows_ = [row for _, row in chosen]
            placed.append((chosen[0][0], RowGroup(_shape_name(texts, sets), group_rows_[0],
                                                  group_rows_)))
    placed.sort(key=lambda item: item[0])
    return [group for _, group in placed]


def _tuples_of(sets: list[list[int]]) -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.product(*sets))


def compress_names(names: Iterable[str]) -> list[str]:
    """Names that differ only in index numbers, as few patterns as cover them exactly:
    `x.layers.[1-2].experts.[0-7].fc1`; order of first appearance."""
    buckets: dict[tuple[str, ...], list[tuple[int, tuple[int, ...]]]] = {}
    seen: set[str] = set()
    for position, name in enumerate(names):
        if name in seen:
            continue
        seen.add(name)
        texts, indices = name_shape(name)
        buckets.setdefault(texts, []).append((position, indices))
    placed: list[tuple[int, str]] = []
    for texts, members in buckets.items():
        first_at = {indices: position for position, indices in members}
        for sets in _product_blocks([indices for _, indices in members]):
            start = min(first_at[t] for t in _tuples_of(sets))
            placed.append((start, _shape_name(texts, sets)))
    placed.sort(key=lambda item: item[0])
    return [name for _, name in placed]


@dataclass
class FindingGroup:
    """Findings that say the same thing about several modules (same rule, text, place, fix)."""

    first: Finding
    modules: list[str]
    text: str  # the message without its leading `module: `

    @property
    def findings_count(self) -> int:
        return max(1, len(self.modules))


def _strip_module(finding: Finding) -> str:
    if finding.module and finding.message.startswith(f"{finding.module}: "):
        return finding.message[len(finding.module) + 2:]
    return finding.message


def group_findings(findings: list[Finding], expand: bool = False) -> list[FindingGroup]:
    """Merge findings that differ only in their module; order of first appearance is kept."""
    groups: list[FindingGroup] = []
    index: dict[tuple, FindingGroup] = {}
    for finding in findings:
        text = _strip_module(finding)
        if expand or not finding.module:
            groups.append(FindingGroup(finding, [finding.module] if finding.module else [],
                                       finding.message))
            continue
        key = (finding.rule, finding.severity, text, finding.file, finding.line, finding.fix,
               getattr(finding, "evidence", None))
        if key in index:
            index[key].modules.append(finding.module)
            continue
        group = FindingGroup(finding, [finding.module], text)
        index[key] = group
        groups.append(group)
    for group in groups:
        if len(group.modules) == 1 and not expand:
            group.text = group.first.message
    return groups


# --- names -----------------------------------------------------------------------------------

_TYPE_WORDS = (("LayerNorm", "LN"), ("Column", "Col"), ("Grouped", "Grp"), ("Parallel", ""),
               ("Linear", ""))


def short_type(upstream_class: str) -> str:
    """`TELayerNormColumnParallelLinear` -> `te.LNCol`, `ColumnParallelLinear` -> `mcore.Col`."""
    if not upstream_class:
        return "-"
    te = upstream_class.startswith("TE")
    name = upstream_class[2:] if te else upstream_class
    for word, short in _TYPE_WORDS:
        name = name.replace(word, short)
    return ("te." if te else "mcore.") + (name or "Linear")


def calls_text(row: ModuleRow) -> str:
    calls = str(row.calls_per_microbatch)
    nograd = getattr(row, "nograd_calls_per_microbatch", 0)
    if nograd:
        calls += f"+{nograd} no-grad"
    return calls


def location(file: str | None, line: int | None) -> str:
    """`file:line` on one line: a newline in a file's name is written `\\n`."""
    if not file:
        return ""
    file = printable(file)
    return f"{file}:{line}" if line else file


def format_error(value: Any) -> str:
    """A relative error as `3.1e-01`; anything else as given."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, (int, float)):
        return f"{value:.1e}"
    return str(value)


# --- counts ----------------------------------------------------------------------------------

def severity_counts(report: Report) -> dict[str, int]:
    counts = report.counts()
    return {severity: counts.get(severity, 0) for severity in SEVERITIES}


def finding_text(finding: Finding, fix_label: str = "fix", evidence_label: str = "evidence") -> str:
    """The message, then the fix and the --verify evidence on lines of their own."""
    text = finding.message
    if finding.fix:
        text += f"\n{fix_label}: {finding.fix}"
    evidence = getattr(finding, "evidence", None)
    if evidence:
        text += f"\n{evidence_label}: {evidence}"
    return text


def suppressed_findings(report: Report) -> list[Finding]:
    return list(getattr(report, "suppressed", None) or [])


def summary_counts(report: Report) -> str:
    """`N error(s), N warning(s)[, N info][, N suppressed]`."""
    counts = severity_counts(report)
    parts = [f"{counts['error']} error(s)", f"{counts['warning']} warning(s)"]
    if counts["info"]:
        parts.append(f"{counts['info']} info")
    suppressed = suppressed_findings(report)
    if suppressed:
        parts.append(f"{len(suppressed)} suppressed")
    return ", ".join(parts)


def summary_line(report: Report, exit_code: int) -> str:
    return summary_counts(report) + f"   exit {exit_code}"


# --- paths -----------------------------------------------------------------------------------

def megatron_text(report: Report) -> str | None:
    """Which Megatron the verdict is for, and why that one: `megatron-core 0.19.2 (assumed:
    ...)`. None for reports written before qaudit named it."""
    return _target_text(getattr(report, "megatron", None), "--megatron")


def te_text(report: Report) -> str | None:
    """Which Transformer Engine behaviour the verdict is for: `Transformer Engine 2.20.2
    (assumed: ...)`. None for reports written before qaudit named it."""
    return _target_text(getattr(report, "te", None), "--te")


def source_lines(report: object) -> list[str]:
    """How the config was read (a Bridge ConfigContainer's provider, version, and settings
    resolved for the GPU job); empty for the other inputs."""
    return [str(line) for line in getattr(report, "source", None) or []]


def _target_text(target: object, option: str) -> str | None:
    """A report's `megatron` or `te` entry as one line: label, then installed, named or assumed."""
    if not isinstance(target, dict):
        return None
    label = str(target.get("label") or target.get("version") or "?")
    source, note = target.get("source"), target.get("note")
    if source == "installed":
        how = f"installed: {target.get('location')}" + (f"; {note}" if note else "")
        if target.get("startup_checks"):
            how += f"; its start-up checks: {target['startup_checks']}"
    elif source == "named":  # a PATH given to the option names its location
        how = f"named with {option}" + (f" {target.get('location')}" if target.get("location")
                                        else "") + (f"; {note}" if note else "")
    else:
        how = "assumed" + (f": {note}" if note else "")
        if target.get("startup_checks"):
            how += f"; start-up checks: {target['startup_checks']}"
    return printable(f"{label} ({how})")


def policy_text(report: Report) -> str:
    """The audited tracking policy; says so when --policy overrode the Megatron's own."""
    target = getattr(report, "megatron", None)
    own = target.get("policy") if isinstance(target, dict) else None
    if own and own != report.policy:
        label = target.get("label") or target.get("version")
        return printable(f"{report.policy} (--policy; {label} behaves as {own})")
    return printable(str(report.policy))


def cross_check_line(report: Report) -> str | None:
    """--cross-check: what was compared with the installed Megatron, and how many differences."""
    result = getattr(report, "cross_check", None)
    if not result:
        return None
    what = "construction and a training run" if result.get("ran") else "construction only"
    line = (f"cross-check: {result.get('modules_compared', 0)} modules compared with Megatron "
            f"{result.get('megatron', 'unknown')} ({what}): "
            f"{len(result.get('differences', []))} difference(s)")
    if result.get("te"):  # which TE Megatron's TE wrappers ran on (runtime/standin/side.py)
        line += f"; Megatron's TE: {result['te']}"
    not_covered = result.get("not_covered") or []
    return line + (f"; not covered: {'; '.join(not_covered)}" if not_covered else "")


def memory_line(report: Report) -> str | None:
    """--full-size: what one rank holds (qaudit/run/memory.py)."""
    memory = getattr(report, "memory", None)
    if not memory:
        return None
    sharded = memory.get("sharded_over_data_parallel") or []
    parts = []
    for key, label in (("weights", "weights"), ("main_grad", "main_grad"),
                       ("optimizer", "optimizer state")):
        divided = " / data-parallel ranks" if key in sharded else ""
        parts.append(f"{label} {memory[key + '_gib']:,} GiB{divided}")
    return (f"memory per rank at full size ({memory['split']}; stage {memory['stage']}): "
            f"{memory['parameters'] / 1e9:,.2f} B parameters; " + ", ".join(parts))


def observation_line(report: Report) -> str | None:
    """Modules inferred identical to an observed one (docs/observed-once.md)."""
    observation = getattr(report, "observation", None)
    if not observation:
        return None
    classes = observation["classes"]
    return (f"observed once: {observation['modules_inferred']:,} modules of "
            f"{sum(c['experts'] for c in classes):,} sequential experts inferred identical to "
            f"the expert observed in their class ({len(classes):,} classes; "
            f"{observation['modules_observed']:,} modules observed; docs/observed-once.md)")


def te_inference_lines(report: Report) -> list[str]:
    """--runtime te: which modules ran TE's code and which were inferred, per representative
    (docs/te-inference.md); the inferred names with their layer numbers as index sets."""
    inference = getattr(report, "te_inference", None)
    if not inference:
        return []
    classes = inference["classes"]
    lines = [f"te inference: TE's code ran for {inference['modules_run']:,} modules; "
             f"{inference['modules_inferred']:,} inferred from {len(classes):,} identical ones "
             f"(--no-infer runs TE's code for each; docs/te-inference.md)"]
    for entry in classes:
        lines.append(f"  {entry['representative']} -> {_compact_names(entry['inferred'])}")
    return lines


def _compact_names(names: list[str]) -> str:
    """`decoder.layers.[1-3,5].mlp.linear_fc1` for names that differ in one number only."""
    import re

    groups: dict[tuple[str, str], list[int]] = {}
    singles = []
    for name in names:
        numbers = list(re.finditer(r"(?<=\.)\d+(?=\.)", name))
        if not numbers:
            singles.append(name)
            continue
        last = numbers[0]
        key = (name[:last.start()], name[last.end():])
        groups.setdefault(key, []).append(int(last.group()))
    parts = [f"{head}{index_set_text(tuple(indices)) if len(indices) > 1 else indices[0]}{tail}"
             for (head, tail), indices in groups.items()]
    return ", ".join(parts + singles)


SHAPE_HEADERS = ["modules", "n", "precision", "M", "K", "N"]


def shape_rows(report: Report) -> tuple[str, list[list[str]]] | None:
    """Each quantized module group's GEMM on one rank at the run's real widths (rule QA040's
    shapes): (the parallel split, one row per group). None when the report has none."""
    shapes = getattr(report, "gemm_shapes", None)
    if not shapes or not isinstance(shapes, list):
        return None
    rows, splits = [], []
    for entry in shapes:
        if not isinstance(entry, dict):
            continue
        m = entry.get("m")
        m_text = "per expert" if entry.get("per_expert") else ("?" if m is None else str(m))
        rows.append([str(entry.get("modules", "?")), str(entry.get("count", "?")),
                     str(entry.get("precision", "?")), m_text,
                     str(entry.get("k", "?")), str(entry.get("n", "?"))])
        split = str(entry.get("split", "?"))
        if split not in splits:
            splits.append(split)
    return (", ".join(splits), rows) if rows else None


def shape_title(split: str, count: int) -> str:
    return (f"GEMM shapes on one rank at real width ({split}): {count} quantized module "
            "group(s); forward X is M x K, W is N x K; M '?' where seq_length is unset, "
            "'per expert' where routing decides it (docs/gemm-shapes.md)")
