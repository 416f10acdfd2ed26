"""The GEMM shapes of every TE module at the run's real widths, on one rank, checked against
the alignment rules of the recipe it executes in (qaudit/plan/te_alignment.py).

The audit builds shrunk widths; what TE refuses at real width is decided here, from the
config alone: hidden sizes, heads, MLA ranks, Mamba widths, the padded vocabulary, and the
split across ranks (tensor parallel, expert tensor parallel, context parallel, sequence
parallel). Tokens routed to an expert are known only at run time: for them the rules become
a padding requirement, met by Megatron's padding (docs/gemm-shapes.md). Pure code: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qaudit.load.config import ModelConfig
from qaudit.load.precision import Quant
from qaudit.load.upstream_checks import UNKNOWN, checked_value
from qaudit.plan.dims import Dims, model_dims
from qaudit.plan.te_alignment import (GROUPED, LAYERNORM_LINEAR, LINEAR, AlignmentRule,
                                      DimCheck, alignment_rules, token_multiple)

COLUMN, ROW, DUPLICATED = "column", "row", "duplicated"
ASSUMED_MICRO_BATCH = 1  # not a TransformerConfig field; 1 is the case least often aligned


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    etp: int = 1
    ep: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    vocab_divisible_by: int = 128
    seq_length: int | None = None
    micro_batch_size: int = ASSUMED_MICRO_BATCH
    router_padding: bool = False

    @property
    def tokens(self) -> int | None:
        """Rows of a GEMM that sees this rank's whole (gathered) sequence."""
        if self.seq_length is None:
            return None
        return self.seq_length * self.micro_batch_size // self.cp

    def label(self) -> str:
        parts = [f"TP {self.tp}"]
        if self.etp != self.tp:
            parts.append(f"ETP {self.etp}")
        if self.ep > 1:
            parts.append(f"EP {self.ep}")
        if self.cp > 1:
            parts.append(f"CP {self.cp}")
        if self.sequence_parallel:
            parts.append("sequence parallel")
        return ", ".join(parts)


def parallel_of(config: ModelConfig) -> Parallel | None:
    """The split the config states; None when a size comes from outside the file."""
    mapping = config.source.mapping if config.source is not None else None
    keys = ("tensor_model_parallel_size", "expert_tensor_parallel_size",
            "expert_model_parallel_size", "context_parallel_size", "sequence_parallel",
            "make_vocab_size_divisible_by", "seq_length", "moe_router_padding_for_fp8",
            "moe_router_padding_for_quantization")
    try:
        values = {key: checked_value(mapping, key) for key in keys}
    except ValueError:
        return None
    if any(values[key] is UNKNOWN for key in keys if key != "seq_length"):
        return None
    tp = values["tensor_model_parallel_size"]
    seq = values["seq_length"]
    return Parallel(tp=tp, etp=values["expert_tensor_parallel_size"] or tp,
                    ep=values["expert_model_parallel_size"],
                    cp=values["context_parallel_size"],
                    sequence_parallel=bool(values["sequence_parallel"]) and tp > 1,
                    vocab_divisible_by=values["make_vocab_size_divisible_by"],
                    seq_length=None if seq is UNKNOWN else seq,
                    router_padding=bool(values["moe_router_padding_for_fp8"]
                                        or values["moe_router_padding_for_quantization"]))


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron's _vocab_size_with_padding: up to a multiple of divisible_by x TP."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


@dataclass(frozen=True)
class GemmShape:
    """One module's GEMMs on one rank: X is M x K, W is N x K. `m` None: data-dependent."""

    module: str
    kind: str  # te_alignment LINEAR | LAYERNORM_LINEAR | GROUPED
    mode: str  # COLUMN | ROW | DUPLICATED
    m: int | None
    m_in: int | None  # the module's own input rows (before a sequence-parallel gather)
    k: int
    n: int
    per_expert: bool = False  # M is the tokens routed to one expert

    def dim(self, name: str) -> int | None:
        return {"M": self.m, "M_in": self.m_in, "K": self.k, "N": self.n}[name]

    def text(self) -> str:
        m = "tokens per expert" if self.per_expert else ("?" if self.m is None else str(self.m))
        return f"M={m}, K={self.k}, N={self.n}"


_KINDS = {"TELayerNormColumnParallelLinear": LAYERNORM_LINEAR,
          "TEColumnParallelGroupedLinear": GROUPED, "TERowParallelGroupedLinear": GROUPED}
_MODES = {"TELinear": DUPLICATED, "TERowParallelLinear": ROW, "TERowParallelGroupedLinear": ROW}
_INDEX = re.compile(r"\.\d+(?=\.|$)")


def _widths(leaf: str, path: str, config: ModelConfig, d: Dims, p: Parallel) \
        -> tuple[int, int, str] | None:
    """(K, N, mode) at full model width (before the tensor-parallel split) for a module whose
    name ends in `leaf`, inside `path`; None for a module this table does not know."""
    glu = 2 if config.gated_linear_unit else 1
    mla = config.multi_latent_attention and ".self_attention." in f".{path}"
    rope = d.qk_pos_emb_head_dim
    experts = ".experts." in f".{path}."
    shared = ".shared_experts." in f".{path}."
    ffn = d.moe_ffn if experts else d.shared_ffn if shared else d.ffn
    # Routed experts run at the MoE latent width when there is one (moe_latent_size).
    width = (d.moe_latent or d.hidden) if experts else d.hidden
    table = {
        "linear_qkv": (d.hidden, d.qkv_out, COLUMN),
        "linear_proj": ((d.heads * d.v_head_dim if mla else d.heads * d.kv_channels),
                        d.hidden, ROW),
        "linear_q": (d.hidden, d.heads * d.kv_channels, COLUMN),
        "linear_kv": (d.hidden, 2 * d.heads * d.kv_channels, COLUMN),
        "linear_fc1": (width, glu * ffn, COLUMN),
        "linear_fc2": (ffn, width, ROW),
        "fc1_latent_proj": (d.hidden, d.moe_latent, DUPLICATED),
        "fc2_latent_proj": (d.moe_latent, d.hidden, DUPLICATED),
        "linear_q_down_proj": (d.hidden, d.q_lora_rank or 0, DUPLICATED),
        "linear_q_up_proj": (d.q_lora_rank or 0, d.heads * (d.qk_head_dim + rope), COLUMN),
        "linear_q_proj": (d.hidden, d.heads * (d.qk_head_dim + rope), COLUMN),
        "linear_kv_down_proj": (d.hidden, d.kv_lora_rank + rope, DUPLICATED),
        "linear_kv_up_proj": (d.kv_lora_rank, d.heads * (d.qk_head_dim + d.v_head_dim), COLUMN),
        "linear_qkv_down_proj": (d.hidden, (d.q_lora_rank or 0) + d.kv_lora_rank + rope,
                                 DUPLICATED),
        "eh_proj": (2 * d.hidden, d.hidden, COLUMN),
        "output_layer": (d.hidden, padded_vocab(d.vocab, p.vocab_divisible_by, p.tp), COLUMN),
        "in_proj": (d.hidden, d.in_proj_out, COLUMN),
        "out_proj": (d.d_inner, d.hidden, ROW),
    }
    return table.get(leaf)


def module_widths(leaf: str, path: str, config: ModelConfig, d: Dims, p: Parallel) \
        -> tuple[int, int, str] | None:
    """(K, N, mode) of a module at full width before the split (`_widths`), for the other
    checks of real widths (qaudit/plan/full_size.py)."""
    return _widths(leaf, path, config, d, p)


def gemm_shape(config: ModelConfig, module: str, upstream_class: str, p: Parallel,
               dims: Dims | None = None, built: tuple[int, int] | None = None
               ) -> GemmShape | None:
    """The GEMM shape of `module` (a row name) on one rank; None for a module it cannot size.
    `built`: (in_features, out_features) of the real-width build (--full-size), which then
    stand for this table's widths before the split."""
    d = dims or model_dims(config, full_size=True)
    path = _INDEX.sub("", module)
    leaf = path.rsplit(".", 1)[-1]
    widths = _widths(leaf, path, config, d, p)
    if widths is None or widths[0] <= 0 or widths[1] <= 0:
        return None
    k, n, mode = widths
    if built is not None:
        k, n = built
    mode = _MODES.get(upstream_class, mode if mode == DUPLICATED else
                      COLUMN if "Column" in upstream_class else mode)
    experts = ".experts." in f".{path}."
    split = p.etp if experts else p.tp
    if mode == COLUMN:
        n //= split
    elif mode == ROW:
        k //= split
    kind = _KINDS.get(upstream_class, LINEAR)
    tokens = p.tokens
    sharded = tokens
    if tokens is not None and p.sequence_parallel:  # Megatron refuses a sequence TP cannot split
        sharded = tokens // p.tp if tokens % p.tp == 0 else None
    if experts:  # tokens routed to each local expert: only known at run time
        return GemmShape(module, kind, mode, None, None, k, n, per_expert=True)
    if mode == DUPLICATED:  # Megatron runs MLA's down projections on the local sequence shard
        return GemmShape(module, kind, mode, sharded, sharded, k, n)
    m_in = sharded if mode == COLUMN else tokens
    return GemmShape(module, kind, mode, tokens, m_in, k, n)


@dataclass(frozen=True)
class ShapeProblem:
    """A dimension a rule refuses (or, per expert, a padding requirement not met)."""

    shape: GemmShape
    quant: Quant
    rule: AlignmentRule
    check: DimCheck | None  # None: the data-dependent padding requirement
    value: int | None
    required_multiple: int
    padding: int = 0  # what pads tokens per expert (0: nothing)


def _padding_align(config: ModelConfig, p: Parallel) -> int:
    """The multiple Megatron pads tokens per expert to: TEGroupedMLP and SequentialMLP pad
    whenever config.fp8 or config.fp4 is set (TE's Fp8Padding aligns to the recipe: 32 for
    MXFP8 and NVFP4, 16 otherwise; megatron/core/transformer/moe/experts.py), and the router
    pads with moe_router_padding_for_quantization (get_align_size_for_quantization:
    moe_utils.py; 128 for FP4); 0 when nothing pads."""
    if config.fp8:
        return 32 if config.fp8_recipe == "mxfp8" else 16
    if config.fp4:
        return 128 if p.router_padding else 32
    return 0


def check_gemm_shape(config: ModelConfig, shape: GemmShape, quant: Quant, te_version: str,
                     p: Parallel, backward: bool = True) -> list[ShapeProblem]:
    """Every rule of `quant.recipe` the shape breaks; `backward` False: forward GEMM only."""
    problems: list[ShapeProblem] = []
    rules = alignment_rules(quant.recipe, shape.kind, te_version)
    for current in rules:
        for check in current.checks:
            if not backward and check.gemm in ("dgrad", "wgrad"):
                continue
            if shape.per_expert and check.dim in ("M", "M_in"):
                continue  # the padding requirement below
            value = shape.dim(check.dim)
            if value is not None and value % check.multiple:
                problems.append(ShapeProblem(shape, quant, current, check, value, check.multiple))
    if shape.per_expert and rules:
        need = token_multiple(quant.recipe, shape.kind, te_version) if backward else max(
            [c.multiple for r in rules for c in r.checks
             if c.dim in ("M", "M_in") and c.gemm in ("input", "fprop")] or [1])
        align = _padding_align(config, p)
        if need > 1 and (align == 0 or align % need):
            problems.append(ShapeProblem(shape, quant, rules[0], None, None, need, align))
    return problems


def module_pattern(module: str) -> str:
    """The name with layer and expert indices wildcarded: one finding per repeated module."""
    return _INDEX.sub(".*", module)


def shape_table(shapes: list[tuple[GemmShape, Quant]], p: Parallel) -> list[dict]:
    """One entry per repeated module (indices wildcarded) and recipe: its GEMM on one rank."""
    table: dict[tuple, dict] = {}
    for shape, quant in shapes:
        key = (module_pattern(shape.module), quant)
        entry = table.get(key)
        if entry is None:
            table[key] = {"modules": key[0], "count": 1, "precision": quant.label,
                          "split": p.label(), "m": shape.m, "m_in": shape.m_in, "k": shape.k,
                          "n": shape.n, "per_expert": shape.per_expert}
        else:
            entry["count"] += 1
    return list(table.values())
