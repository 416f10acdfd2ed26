"""QA040: a quantized GEMM whose shape at the run's real widths TE refuses."""

from __future__ import annotations

from typing import Iterable, Iterator

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.load.precision import Quant
from qaudit.plan.dims import model_dims
from qaudit.plan.shapes import (GemmShape, Parallel, ShapeProblem, check_gemm_shape,
                                gemm_shape, module_pattern, parallel_of, shape_table)
from qaudit.plan.upstream.te import NEWEST_TE


@rule("QA040", "error", "a quantized GEMM's shape at real width is one TE refuses")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """qaudit runs a shrunk model, so it computes each quantized module's GEMMs at the run's
    real widths on one rank separately: M (tokens), K (in_features) and N (out_features) for
    the forward, data-gradient and weight-gradient GEMMs, after the tensor-parallel split
    (`tensor_model_parallel_size`; experts by `expert_tensor_parallel_size`), context
    parallelism (`context_parallel_size`), sequence parallelism (a column-parallel module's
    own input is the local sequence shard) and the padded vocabulary
    (`make_vocab_size_divisible_by` x TP). Each shape is checked against the rules TE's own
    code applies to the recipe the module executes in, for the TE version the verdict is for
    (`--te`): `assert_dim_for_fp8_exec` (transformer_engine/pytorch/utils.py) for every
    quantized Linear and LayerNormLinear, cuBLAS's leading-dimension and outer-dimension
    checks for tensor scaling and block scaling (`CanonicalizeGemmInput`,
    transformer_engine/common/gemm/cublaslt_gemm.cu), the MXFP8 quantizer's 32-multiple
    (`MXFP8Quantizer::create_tensor`) and the NVFP4 quantizer's
    (docs/gemm-shapes.md lists each rule, its source and the versions it holds for).

    Where the te runtime has TE's Python imported (`--runtime te`, on a GPU or on the CPU
    stand-in), TE's own Python checks are also run on each real-width shape
    (`assert_dim_for_fp8_exec`, and the MXFP8/NVFP4 quantizers' `make_empty` asserts where
    TE's Python has them), on meta tensors; a shape where TE's answer and the table's differ is
    reported with both sides named. TE's C++ checks (cuBLAS, the quantize kernels) cannot run
    without its compiled extension: the table alone covers them.

    A shape TE refuses fails at the first step on the cluster, after the queue wait. Tokens
    per expert are data-dependent: they must be padded to the recipe's multiple, which
    Megatron does when `fp8` or `fp4` is set (or `moe_router_padding_for_quantization`);
    experts quantized only by a recipe matcher are not padded. `seq_length` unset: the token
    dimension is not checked; a micro batch of 1 is assumed.

    Fix: pad the dimension (a hidden or head width, the vocabulary through
    `make_vocab_size_divisible_by`), choose another tensor-parallel size, or keep the module
    in BF16 with a recipe matcher whose config has an empty training recipe.
    """
    parallel = parallel_of(facts.config)
    if parallel is None:
        return
    te_version = facts.te_version or NEWEST_TE
    # One finding per repeated module (layer and expert indices wildcarded) and recipe.
    grouped: dict[tuple, dict[str, list[ShapeProblem]]] = {}
    disagreeing: dict[tuple, dict[str, list[str]]] = {}
    te_checks = facts.te_shape_checks
    for shape, quant, backward in quantized_shapes(facts, parallel):
        problems = check_gemm_shape(facts.config, shape, quant, te_version, parallel,
                                    backward=backward)
        if problems:
            modules = grouped.setdefault((module_pattern(shape.module), quant), {})
            modules[shape.module] = problems
        if te_checks is not None:
            differ = te_checks.disagreements(shape, quant, backward, problems)
            if differ:
                disagreeing.setdefault((module_pattern(shape.module), quant), {})[
                    shape.module] = differ
    for modules in grouped.values():
        yield _hit(facts, modules, parallel.label())
    for (_, quant), modules in disagreeing.items():
        yield _disagreement(facts, quant, modules, parallel.label())


def quantized_shapes(facts: AuditFacts, parallel: Parallel) -> list[tuple[GemmShape, Quant, bool]]:
    """(shape on one rank, recipe, whether its backward GEMMs run) of every quantized module
    call; widths from the real-size build where --full-size made one. Computed once per
    audit: the rule and the report's table both read it."""
    if "qa040_shapes" not in facts.derived:
        facts.derived["qa040_shapes"] = list(_quantized_shapes(facts, parallel))
    return facts.derived["qa040_shapes"]


def _quantized_shapes(facts: AuditFacts, parallel: Parallel) \
        -> Iterator[tuple[GemmShape, Quant, bool]]:
    dims = model_dims(facts.config, full_size=True)
    for row in facts.rows:
        records = facts.records.get(row.name, ())
        quants = sorted({r.quant for r in records if r.quant is not None})
        if not quants:
            continue
        shape = gemm_shape(facts.config, row.name, row.type, parallel, dims,
                           built=facts.built_widths.get(row.name))
        if shape is None:
            continue
        backward = not facts.evaluation and any(r.grad for r in records) \
            and row.accumulation != "frozen"
        for quant in quants:
            yield shape, quant, backward


def gemm_shapes(facts: AuditFacts) -> list[dict] | None:
    """The report's table of quantized GEMM shapes (--full-size); None when a parallel size
    comes from outside the config."""
    parallel = parallel_of(facts.config)
    if parallel is None:
        return None
    return shape_table([(shape, quant) for shape, quant, _ in quantized_shapes(facts, parallel)],
                       parallel)


def _disagreement(facts: AuditFacts, quant: Quant, modules: dict[str, list[str]],
                  split: str) -> Hit:
    """TE's own Python check (run where the te runtime imported TE) and qaudit's table of
    TE's rules answer differently on one shape: both sides named, TE's answer is the truth."""
    name, lines = next(iter(modules.items()))
    more = f" (and {len(modules) - 1} more like it)" if len(modules) > 1 else ""
    message = (f"{name}{more} in {quant.label} at {split}: TE's own shape check and qaudit's "
               f"table of TE's rules (docs/gemm-shapes.md) disagree: " + "; ".join(lines))
    return Hit(module=name, message=message, file=facts.config.file,
               line=facts.config.line_of("hidden_size"),
               fix="trust TE's answer for this shape, and report the table's error to qaudit")


_DIM_FIX = {"N": "pad out_features", "K": "pad in_features",
            "M": "choose a seq_length (or micro batch size)",
            "M_in": "choose a seq_length (or micro batch size)"}


def _hit(facts: AuditFacts, modules: dict[str, list[ShapeProblem]], split: str) -> Hit:
    name, problems = next(iter(modules.items()))
    first = problems[0]
    shape = first.shape
    more = f" (and {len(modules) - 1} more like it)" if len(modules) > 1 else ""
    where = f"{name}{more} in {first.quant.label} at {split}: {shape.text()}"
    keep = (f"or keep '{module_pattern(name)}' in BF16 with a recipe matcher (a config with "
            "training_recipe {})")
    padding = [p for p in problems if p.check is None]
    # Per dimension, the strictest multiple any rule asks, and every rule that asks it.
    strictest: dict[str, ShapeProblem] = {}
    for problem in problems:
        if problem.check is None:
            continue
        dim = problem.check.dim
        if dim == "M_in" and shape.m_in == shape.m:
            dim = "M"  # the same rows: one dimension to fix
        held = strictest.get(dim)
        if held is None or problem.check.multiple > held.check.multiple:
            strictest[dim] = problem
    broken = [f"{dim}={p.value} is not a multiple of {p.check.multiple} ({p.check.gemm}: "
              f"{p.check.what}; {p.rule.source})" for dim, p in strictest.items()]
    fixes = []
    for dim, p in strictest.items():
        target = -(-p.value // p.check.multiple) * p.check.multiple
        what = ("raise make_vocab_size_divisible_by" if name.endswith("output_layer")
                and dim == "N" else _DIM_FIX[dim])
        fixes.append(f"{what} to make {dim} a multiple of {p.check.multiple} (e.g. {target})")
    if padding:
        need = padding[0]
        pads = ("nothing pads them (neither fp8/fp4 nor moe_router_padding_for_quantization "
                "is set)" if need.padding == 0 else
                f"Megatron pads them to a multiple of {need.padding} only")
        broken.append(f"tokens per expert must be a multiple of {need.required_multiple} "
                      f"({need.rule.source}) and {pads}")
        fixes.append(f"pad tokens per expert to a multiple of {need.required_multiple} (fp8/fp4 "
                     "for the model, or moe_router_padding_for_quantization)")
    if strictest:
        fixes.append("choose another tensor-parallel size")
    message = f"{where}; TE refuses it: " + "; ".join(broken)
    return Hit(module=name, message=message, file=facts.config.file,
               line=facts.config.line_of("hidden_size"), fix=", ".join(fixes) + f", {keep}")
