"""Precision map (SVG): decoder layers down, module kinds across, MTP and output rows at the
bottom; each cell coloured by the precision the module executed in. Cells of modules called
more than once per microbatch show `xN`; cells whose verdict is not `ok` get a red outline
and the rule IDs. Hovering a cell shows its full row. Stable bytes: no timestamps, fixed order.
"""

from __future__ import annotations

from html import escape as _xml

from qaudit.render.common import layer_parts
from qaudit.judge.report import ModuleRow, Report

# Known module kinds, in column order: (name suffix, column label).
KINDS = (
    ("eh_proj", "eh_proj"),
    ("self_attention.linear_qkv", "qkv"),
    ("self_attention.linear_q_proj", "q"),
    ("self_attention.linear_kv_proj", "kv"),
    ("self_attention.linear_qkv_down_proj", "qkv down"),  # mla_down_proj_fusion
    ("self_attention.linear_q_down_proj", "q down"),
    ("self_attention.linear_q_up_proj", "q up"),
    ("self_attention.linear_kv_down_proj", "kv down"),
    ("self_attention.linear_kv_up_proj", "kv up"),
    ("self_attention.linear_proj", "proj"),
    ("mlp.linear_fc1", "fc1"),
    ("mlp.linear_fc2", "fc2"),
    ("mlp.experts.linear_fc1", "experts fc1"),
    ("mlp.experts.linear_fc2", "experts fc2"),
    ("mlp.shared_experts.linear_fc1", "shared fc1"),
    ("mlp.shared_experts.linear_fc2", "shared fc2"),
    ("output_layer", "output"),
)
_KIND_ORDER = {suffix: i for i, (suffix, _) in enumerate(KINDS)}
_KIND_LABEL = dict(KINDS)

# Executed precision -> (fill, text colour). Colour-blind-safe (Okabe-Ito) hues.
PALETTE = {
    "bf16": ("#d4d4d4", "#1a1a1a"),
    "fp8/delayed": ("#56b4e9", "#1a1a1a"),
    "fp8/tensorwise": ("#0072b2", "#ffffff"),
    "fp8/blockwise": ("#009e73", "#ffffff"),
    "fp8/mxfp8": ("#e69f00", "#1a1a1a"),
    "fp8/custom": ("#f0e442", "#1a1a1a"),
    "fp4/nvfp4": ("#cc79a7", "#1a1a1a"),
    "-": ("#ffffff", "#1a1a1a"),
}
_EXTRA = (("#8c564b", "#ffffff"), ("#bcbd22", "#1a1a1a"), ("#17becf", "#1a1a1a"),
          ("#7f7f7f", "#ffffff"), ("#9467bd", "#ffffff"))

CELL_W, CELL_H, GAP = 88, 18, 2
LEFT, TOP = 96, 74
FAIL = "#d00000"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


def _kind(rest: str) -> str:
    if rest.startswith("mtp_model_layer."):
        rest = rest[len("mtp_model_layer."):]
    return rest


def _label(kind: str) -> str:
    return _KIND_LABEL.get(kind, kind.replace("linear_", "").replace("self_attention.", "attn ")
                           .replace("mlp.", "").replace("_", " "))


def _colours(precisions: list[str]) -> dict[str, tuple[str, str]]:
    colours = {p: PALETTE[p] for p in precisions if p in PALETTE}
    extra = sorted(p for p in precisions if p not in PALETTE)
    for i, p in enumerate(extra):
        colours[p] = _EXTRA[i % len(_EXTRA)]
    return colours


def _row_key(row: ModuleRow) -> tuple[tuple[int, int, str], str, str]:
    """(sort key, row label, kind) for a module."""
    parts = layer_parts(row.name)
    if parts is not None:
        prefix, idx, rest = parts
        if prefix == "decoder.layers":
            return (0, idx, ""), f"layer {idx}", _kind(rest)
        if prefix == "mtp.layers":
            return (1, idx, ""), f"mtp {idx}", _kind(rest)
        return (2, idx, prefix), f"{prefix.split('.')[0]} {idx}", _kind(rest)
    if row.name == "output_layer":
        return (4, 0, ""), "output", "output_layer"
    return (3, 0, row.name), row.name.split(".")[-1], row.name


def _cell_text(row: ModuleRow) -> str:
    bits = []
    if row.calls_per_microbatch > 1:
        bits.append(f"x{row.calls_per_microbatch}")
    if row.verdict != "ok":
        rules = row.verdict.split(",")
        bits.append(rules[0] + (f"+{len(rules) - 1}" if len(rules) > 1 else ""))
    return " ".join(bits)


def _tooltip(row: ModuleRow) -> str:
    text = (f"{row.name}\n{row.type}\nprecision {row.precision}   recipe {row.recipe}\n"
            f"tracked {row.tracked}   accumulation {row.accumulation}\n"
            f"calls/microbatch {row.calls_per_microbatch}   verdict {row.verdict}")
    error = getattr(row, "grad_rel_error", None)
    if isinstance(error, (int, float)) and not isinstance(error, bool):
        text += f"\ngrad_rel_error {error:.2e}"
    return text


def render_svg(report: Report, exit_code: int) -> str:
    rows: dict[tuple, str] = {}
    cells: dict[tuple, dict[str, ModuleRow]] = {}
    kinds: list[str] = []
    for module in report.modules:
        key, label, kind = _row_key(module)
        rows.setdefault(key, label)
        cells.setdefault(key, {})[kind] = module
        if kind not in kinds:
            kinds.append(kind)
    first_seen = {k: i for i, k in enumerate(kinds)}
    kinds.sort(key=lambda k: (_KIND_ORDER.get(k, len(_KIND_ORDER) - 0.5), first_seen[k]))
    row_keys = sorted(rows)
    precisions = sorted({m.precision for m in report.modules})
    colours = _colours(precisions)

    grid_w = len(kinds) * (CELL_W + GAP)
    width = max(LEFT + grid_w + 16, 560)
    legend_top = TOP + len(row_keys) * (CELL_H + GAP) + 18
    legend_rows = (len(precisions) + 3) // 4
    height = legend_top + legend_rows * 20 + 70
    failing = sum(1 for m in report.modules if m.verdict != "ok")
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{FONT}" font-size="11">',
        f"<title>qaudit precision map: {_xml(report.config)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="12" y="22" font-size="15" font-weight="bold">Precision map: '
        f"{_xml(report.config)}</text>",
        '<text x="12" y="40" fill="#444444">'
        + _xml(f"{'recipe ' + report.recipe if report.recipe else 'no recipe'} · "
               f"policy {report.policy} · {_megatron_label(report)}"
               f"{len(report.modules)} modules, {failing} failing · exit {exit_code}")
        + "</text>",
    ]
    for c, kind in enumerate(kinds):
        x = LEFT + c * (CELL_W + GAP) + CELL_W / 2
        out.append(f'<text x="{x:g}" y="{TOP - 8}" text-anchor="middle" font-weight="bold">'
                   f"{_xml(_label(kind))}</text>")
    for r, key in enumerate(row_keys):
        y = TOP + r * (CELL_H + GAP)
        if r and key[0] != row_keys[r - 1][0]:
            out.append(f'<line x1="8" x2="{LEFT + grid_w:g}" y1="{y - GAP / 2 - 1:g}" '
                       f'y2="{y - GAP / 2 - 1:g}" stroke="#888888" stroke-dasharray="3 2"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + CELL_H - 5}" text-anchor="end">'
                   f"{_xml(rows[key])}</text>")
        for c, kind in enumerate(kinds):
            module = cells[key].get(kind)
            if module is None:
                continue
            x = LEFT + c * (CELL_W + GAP)
            fill, ink = colours[module.precision]
            bad = module.verdict != "ok"
            stroke = (f' stroke="{FAIL}" stroke-width="3"' if bad
                      else ' stroke="#999999" stroke-width="0.5"')
            dash = ' stroke-dasharray="3 2"' if module.precision == "-" and not bad else ""
            out.append(f"<g><title>{_xml(_tooltip(module))}</title>"
                       f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" rx="2" '
                       f'fill="{fill}"{stroke}{dash}/>')
            text = _cell_text(module)
            if text:
                out.append(f'<text x="{x + CELL_W / 2:g}" y="{y + CELL_H - 5}" font-size="10" '
                           f'text-anchor="middle" fill="{ink}">{_xml(text)}</text>')
            out.append("</g>")
    # Legend: precisions, then the marks.
    out.append(f'<text x="12" y="{legend_top}" font-weight="bold">executed precision</text>')
    for i, precision in enumerate(precisions):
        x = 12 + (i % 4) * 150
        y = legend_top + 8 + (i // 4) * 20
        fill, _ = colours[precision]
        out.append(f'<rect x="{x}" y="{y}" width="22" height="14" rx="2" fill="{fill}" '
                   f'stroke="#999999" stroke-width="0.5"/>')
        out.append(f'<text x="{x + 28}" y="{y + 11}">{_xml(precision)}</text>')
    marks_y = legend_top + 8 + legend_rows * 20 + 8
    out.append(f'<rect x="12" y="{marks_y}" width="22" height="14" rx="2" fill="#ffffff" '
               f'stroke="{FAIL}" stroke-width="3"/>')
    out.append(f'<text x="40" y="{marks_y + 11}">verdict not ok (rule IDs in the cell)</text>')
    out.append(f'<text x="12" y="{marks_y + 32}">xN: called N times per microbatch · '
               "empty cell: no such module in that layer</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _megatron_label(report: Report) -> str:
    target = getattr(report, "megatron", None)
    te = getattr(report, "te", None)
    return ((f"for {target.get('label')} · " if isinstance(target, dict) else "")
            + (f"{te.get('label')} · " if isinstance(te, dict) else ""))
