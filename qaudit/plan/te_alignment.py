"""The shape rules TE enforces on a quantized GEMM, per recipe and per TE version, as TE's own
code states them (docs/gemm-shapes.md quotes each check and the tags it was read at).

A Linear computes three GEMMs; in TE's row-major terms, with X the input (M x K), W the weight
(N x K) and dY the output gradient (M x N):

- fprop: Y = X W^T, reduction over K;
- dgrad: dX = dY W, reduction over N;
- wgrad: dW = dY^T X, reduction over M.

On Hopper every FP8 GEMM runs TN, so the reduction dimension is each operand's leading
dimension, the one cuBLAS needs aligned. The rules below name the dimension (M, K, N; `M_in`
is the rows the module's own input has before a sequence-parallel all-gather) and the multiple.
Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# The files the rules come from (paths inside NVIDIA/TransformerEngine).
UTILS_FP8_EXEC = "transformer_engine/pytorch/utils.py: assert_dim_for_fp8_exec"
GEMM_CANONICALIZE = "transformer_engine/common/gemm/cublaslt_gemm.cu: CanonicalizeGemmInput"
NVFP4_QUANTIZE_OLD = "transformer_engine/common/util/nvfp4_transpose.cuh: quantize_transpose"
NVFP4_QUANTIZE = ("transformer_engine/common/cast/nvfp4/quantize_transpose_nvfp4.cuh: "
                  "quantize_transpose")
MXFP8_QUANTIZER_OLD = "transformer_engine/pytorch/csrc/extensions/quantizer.cpp: MXFP8Quantizer"
MXFP8_QUANTIZER = "transformer_engine/pytorch/csrc/quantizer.cpp: MXFP8Quantizer::create_tensor"

LINEAR = "linear"  # te.Linear (TEColumnParallelLinear, TERowParallelLinear, TELinear)
LAYERNORM_LINEAR = "layernorm_linear"  # te.LayerNormLinear
GROUPED = "grouped"  # te.GroupedLinear: M is per expert, known only at run time

TENSOR_SCALING = ("delayed", "tensorwise")


@dataclass(frozen=True)
class DimCheck:
    gemm: str  # "fprop" | "dgrad" | "wgrad" | "input" (checked before any GEMM)
    dim: str  # "M" | "M_in" | "K" | "N"
    multiple: int
    what: str  # the operand and its role, as TE's message names it


@dataclass(frozen=True)
class AlignmentRule:
    name: str
    source: str  # TE file and function
    since: str  # first TE release with the check as stated
    checks: tuple[DimCheck, ...]


def _key(version: str) -> tuple[int, ...]:
    from qaudit.plan.upstream.te import NEWEST_TE, te_version_key

    return te_version_key(version) or te_version_key(NEWEST_TE)


# assert_dim_for_fp8_exec(inputmat, weight): every leading dimension's product % 8 and the
# last % 16, for the module's input (before the sequence-parallel all-gather) and its weight.
_FP8_EXEC_CHECKS = (
    DimCheck("input", "M_in", 8, "input rows (product of leading dims)"),
    DimCheck("input", "K", 16, "input's last dim (in_features)"),
    DimCheck("input", "N", 8, "weight rows (out_features)"),
)
# GroupedLinear (up to v2.4) ran it on every expert's split of the input: M per expert.
_FP8_EXEC_GROUPED_CHECKS = (
    DimCheck("input", "M", 8, "tokens of each expert's split"),
    DimCheck("input", "K", 16, "input's last dim (in_features)"),
    DimCheck("input", "N", 8, "weight rows (out_features)"),
)


def _fp8_exec_applies(module: str, key: tuple[int, ...]) -> bool:
    """Which modules call assert_dim_for_fp8_exec, per the tags read: Linear from v1.9 except
    v2.0 (its rewrite dropped the call, v2.1 restored it); LayerNormLinear always; GroupedLinear
    up to v2.4 (v2.5 removed it)."""
    if module == LINEAR:
        return not (2, 0) <= key < (2, 1)
    if module == GROUPED:
        return key < (2, 5)
    return True


def _tensor_scaling_gemm() -> tuple[DimCheck, ...]:
    # "Leading dimension requirement on A/B for FP8 GEMM. Caller must pad.": lda and ldb % 16;
    # in TN layout both are the reduction dimension.
    return (DimCheck("fprop", "K", 16, "leading dim of W and X (reduction K)"),
            DimCheck("dgrad", "N", 16, "leading dim of W^T and dY (reduction N)"),
            DimCheck("wgrad", "M", 16, "leading dim of X^T and dY^T (reduction M)"))


def _blockwise_gemm() -> tuple[DimCheck, ...]:
    # NVTE_BLOCK_SCALING: lda % 16 and ldb % 16 (the reduction dim), A's outer dim m % 8, and
    # B's outer dim n % 8 when B is 1D-scaled (activations and gradients are; weights 2D).
    # fprop: A = W (m = N), B = X (n = M); dgrad: A = W^T (m = K), B = dY (n = M);
    # wgrad: A = X^T (m = K), B = dY^T (n = N).
    return (DimCheck("fprop", "K", 16, "leading dim (reduction K)"),
            DimCheck("fprop", "N", 8, "outer dim of A (weight rows)"),
            DimCheck("fprop", "M", 8, "outer dim of B (input rows)"),
            DimCheck("dgrad", "N", 16, "leading dim (reduction N)"),
            DimCheck("dgrad", "K", 8, "outer dim of A (weight columns)"),
            DimCheck("dgrad", "M", 8, "outer dim of B (gradient rows)"),
            DimCheck("wgrad", "M", 16, "leading dim (reduction M)"),
            DimCheck("wgrad", "K", 8, "outer dim of A (input columns)"),
            DimCheck("wgrad", "N", 8, "outer dim of B (gradient columns)"))


def _nvfp4_quantize() -> tuple[DimCheck, ...]:
    # "Number of tensor rows/cols must be a multiple of 32" (16-byte TMA alignment of 4-bit
    # values), on every operand quantized: X (M x K), W (N x K), dY (M x N).
    return (DimCheck("fprop", "M", 32, "rows of X and dY"),
            DimCheck("fprop", "K", 32, "columns of X and W"),
            DimCheck("fprop", "N", 32, "rows of W, columns of dY"))


def _mxfp8_quantize() -> tuple[DimCheck, ...]:
    # "MXFP8 requires tensor dims that are divisible by 32": the flattened rows and the last
    # dim of every tensor the MXFP8 quantizer allocates (TE's Python MXFP8Quantizer.make_empty
    # asserts the same up to v2.15): X (M x K), W (N x K), dY (M x N). A sequence-parallel
    # input whose local shard is not quantizable is gathered first, so M is the gathered rows.
    return (DimCheck("fprop", "M", 32, "rows of X and dY"),
            DimCheck("fprop", "K", 32, "columns of X and W"),
            DimCheck("fprop", "N", 32, "rows of W, columns of dY"))


def alignment_rules(recipe: str, module: str, te_version: str) -> list[AlignmentRule]:
    """The rules a quantized GEMM of `module` kind (LINEAR, LAYERNORM_LINEAR, GROUPED) meets
    under TE recipe `recipe` (tensorwise, delayed, blockwise, mxfp8, nvfp4) in `te_version`."""
    key = _key(te_version)
    rules: list[AlignmentRule] = []
    if _fp8_exec_applies(module, key):
        checks = _FP8_EXEC_GROUPED_CHECKS if module == GROUPED else _FP8_EXEC_CHECKS
        called = {LINEAR: "module/linear.py _Linear.forward",
                  LAYERNORM_LINEAR: "module/layernorm_linear.py _LayerNormLinear.forward",
                  GROUPED: "module/grouped_linear.py _GroupedLinear.forward"}[module]
        rules.append(AlignmentRule("fp8-exec-dims", f"{UTILS_FP8_EXEC} (from {called})",
                                   "1.9", checks))
    if recipe in TENSOR_SCALING and key >= (2, 9):
        rules.append(AlignmentRule("fp8-gemm-leading-dim", GEMM_CANONICALIZE, "2.9",
                                   _tensor_scaling_gemm()))
    if recipe == "blockwise" and key >= (2, 3):
        rules.append(AlignmentRule("block-scaling-gemm-dims", GEMM_CANONICALIZE, "2.3",
                                   _blockwise_gemm()))
    if recipe == "mxfp8" and key >= (2, 0):
        source = MXFP8_QUANTIZER if key >= (2, 4) else MXFP8_QUANTIZER_OLD
        rules.append(AlignmentRule("mxfp8-quantize-dims", source, "2.0", _mxfp8_quantize()))
    if recipe == "nvfp4" and key >= (2, 8):
        source = NVFP4_QUANTIZE if key >= (2, 10) else NVFP4_QUANTIZE_OLD
        rules.append(AlignmentRule("nvfp4-quantize-dims", source, "2.8", _nvfp4_quantize()))
    return rules


def token_multiple(recipe: str, module: str, te_version: str) -> int:
    """The multiple every data-dependent M (tokens per expert) must be for these rules."""
    multiple = 1
    for current in alignment_rules(recipe, module, te_version):
        for check in current.checks:
            if check.dim in ("M", "M_in"):
                multiple = max(multiple, check.multiple)
    return multiple
