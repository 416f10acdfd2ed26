"""TE's own Python shape checks, run on the GEMM shapes at the run's real widths (issue 24,
docs/gemm-shapes.md "TE's own checks").

qaudit's table of TE's rules (qaudit/plan/te_alignment.py) decides QA040 on every runtime.
Where the te runtime already has TE's Python imported in this process (on CUDA, or on the CPU
kernel stand-in), the checks TE's Python makes are also called on each quantized module's
real-width shapes, on meta tensors (no memory, no kernel), and their answers compared with
the table's:

- `transformer_engine.pytorch.utils.assert_dim_for_fp8_exec(inputmat, weight)`, for the
  module kinds whose forward calls it in this release (read in the module's source);
- the asserts of `MXFP8Quantizer.make_empty` and `NVFP4Quantizer.make_empty`
  (`tensor/mxfp8_tensor.py`, `tensor/nvfp4_tensor.py`), in the releases whose Python has
  them (to v2.15; later ones allocate in C++ only), on X (M x K), W (N x K) and, with a
  backward, dY (M x N).

What TE checks in C++ (cuBLAS's leading dimensions, the quantize kernels, the C++
allocators) cannot run without TE's compiled extension; the table alone covers those.
Nothing here is imported unless the te runtime is, and it never imports TE itself.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from qaudit.load.precision import Quant
from qaudit.plan.shapes import GemmShape, ShapeProblem
from qaudit.plan.te_alignment import GROUPED, LAYERNORM_LINEAR, LINEAR

# Rows standing in for a dimension only known at run time (tokens per expert): a multiple of
# every rule's, so TE's answer is about the other dimension; the table pads those separately.
NEUTRAL_ROWS = 4096
FP8_EXEC = "assert_dim_for_fp8_exec"
_MODULE_FILES = {LINEAR: "linear", LAYERNORM_LINEAR: "layernorm_linear", GROUPED: "grouped_linear"}
# Per TE check: the table rule that transcribes it, and whether the two must agree both ways
# ("exact") or TE's refusal must only be among the table's (the table's rule is stricter: the
# NVFP4 quantize kernel asks 32 where the Python allocator asks 16).
_TABLE_RULE = {FP8_EXEC: ("fp8-exec-dims", True),
               "MXFP8Quantizer.make_empty": ("mxfp8-quantize-dims", True),
               "NVFP4Quantizer.make_empty": ("nvfp4-quantize-dims", False)}
# Which of the table's dimensions each operand's rows and columns are.
_OPERAND_DIMS = {"input": ("M_in", "K"), "weight": ("N", "K"), "X": ("M", "K"),
                 "W": ("N", "K"), "dY": ("M", "N")}


@dataclass(frozen=True)
class TEAnswer:
    """One TE check on one operand: refused (with TE's message) or not; None: it could not
    run (TE's signature differs), said so rather than read as a pass."""

    check: str
    operand: str  # "input", "weight" (assert_dim_for_fp8_exec); "X", "W", "dY" (quantizers)
    shape: tuple[int, int]
    refused: bool | None
    message: str = ""


class TEShapeChecks:
    """The checks the imported TE's Python makes, callable on a GemmShape."""

    def __init__(self, te_pytorch: Any) -> None:
        # A TE without the function (or a stand-in package) has no such check: none is run.
        self._assert_fp8_exec = getattr(_module(te_pytorch, "utils"), FP8_EXEC, None)
        self._fp8_exec_kinds = set() if self._assert_fp8_exec is None else {
            kind for kind, name in _MODULE_FILES.items()
            if _calls(te_pytorch, f"module.{name}", f"{FP8_EXEC}(")}
        self._quantizers: dict[str, Callable[[tuple[int, int]], None]] = {}
        for recipe, module, cls in (("mxfp8", "tensor.mxfp8_tensor", "MXFP8Quantizer"),
                                    ("nvfp4", "tensor.nvfp4_tensor", "NVFP4Quantizer")):
            check = _python_shape_assert(te_pytorch, module, cls)
            if check is not None:
                self._quantizers[recipe] = check
        self._seen: dict[tuple, list[TEAnswer]] = {}

    def answers(self, shape: GemmShape, quant: Quant, backward: bool) -> list[TEAnswer]:
        key = (shape.kind, shape.m, shape.m_in, shape.k, shape.n, shape.per_expert,
               quant.recipe, backward)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = self._answers(shape, quant, backward)
        return found

    def disagreements(self, shape: GemmShape, quant: Quant, backward: bool,
                      problems: list[ShapeProblem]) -> list[str]:
        """Where TE's own answers on `shape` differ from the table's `problems` (QA040)."""
        return disagreements(problems, self.answers(shape, quant, backward))

    def _answers(self, shape: GemmShape, quant: Quant, backward: bool) -> list[TEAnswer]:
        out = []
        if shape.kind in self._fp8_exec_kinds:
            operands = [("weight", (shape.n, shape.k))]
            if shape.m_in is not None:
                operands.insert(0, ("input", (shape.m_in, shape.k)))
            for operand, dims in operands:
                out.append(_answer(FP8_EXEC, operand, dims, self._fp8_exec))
        quantizer = self._quantizers.get(quant.recipe)
        if quantizer is not None:
            rows = NEUTRAL_ROWS if shape.m is None else shape.m
            operands = [("X", (rows, shape.k)), ("W", (shape.n, shape.k))]
            if backward:
                operands.append(("dY", (rows, shape.n)))
            name = f"{'MXFP8' if quant.recipe == 'mxfp8' else 'NVFP4'}Quantizer.make_empty"
            out.extend(_answer(name, operand, dims, quantizer) for operand, dims in operands)
        return out

    def _fp8_exec(self, dims: tuple[int, int]) -> None:
        self._assert_fp8_exec(torch.empty(dims, device="meta"))


def _module(te_pytorch: Any, name: str) -> Any:
    try:
        return importlib.import_module(f"{te_pytorch.__name__}.{name}")
    except ImportError:
        return None


def _calls(te_pytorch: Any, module: str, text: str) -> bool:
    found = _module(te_pytorch, module)
    try:
        return found is not None and text in inspect.getsource(found)
    except (OSError, TypeError):
        return False


def _python_shape_assert(te_pytorch: Any, module: str, cls: str):
    """A callable running `cls.make_empty`'s own shape assert, where TE's Python has one."""
    try:
        quantizer_class = getattr(_module(te_pytorch, module), cls)
        source = inspect.getsource(quantizer_class.make_empty)
    except (AttributeError, OSError, TypeError):
        return None
    if "Incorrect shape" not in source:
        return None  # this release allocates in C++: its check cannot run here
    parameters = inspect.signature(quantizer_class.make_empty).parameters
    if not {"shape", "dtype", "device"} <= set(parameters):
        return None  # a signature this code was not checked against: no answer, not a pass
    # The assert comes first and reads only `shape`; the instance is never used before it,
    # so an uninitialised one keeps TE's quantizer constructors (their arguments differ per
    # release) out of it. Anything after a passing assert (allocation on meta) is discarded.
    bare = object.__new__(quantizer_class)

    def check(dims: tuple[int, int]) -> None:
        try:
            quantizer_class.make_empty(bare, dims, dtype=torch.float32,
                                       device=torch.device("meta"))
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - past the assert: the shape was accepted
            return
    return check


def _answer(check: str, operand: str, dims: tuple[int, int],
            call: Callable[[tuple[int, int]], None]) -> TEAnswer:
    try:
        call(dims)
    except (AssertionError, ValueError) as exc:
        return TEAnswer(check, operand, dims, True, " ".join(str(exc).split()))
    except Exception as exc:  # noqa: BLE001 - named, never read as a pass
        return TEAnswer(check, operand, dims, None, f"{type(exc).__name__}: {exc}")
    return TEAnswer(check, operand, dims, False)


def disagreements(problems: list[ShapeProblem], answers: list[TEAnswer]) -> list[str]:
    """Where TE's own answer and qaudit's table differ on one shape, both sides named."""
    out = []
    for answer in answers:
        rule, exact = _TABLE_RULE[answer.check]
        dims = _OPERAND_DIMS[answer.operand]
        table = [p for p in problems if p.check is not None and p.rule.name == rule
                 and _same_dim(p.check.dim, dims)]
        where = f"{answer.operand} {answer.shape[0]} x {answer.shape[1]}"
        if answer.refused is None:
            out.append(f"TE's {answer.check} could not run on {where}: {answer.message}")
        elif answer.refused and not table:
            out.append(f"TE's {answer.check} refuses {where} ({answer.message}); qaudit's "
                       f"table ({rule}) accepts it")
        elif exact and not answer.refused and table:
            broken = ", ".join(f"{p.check.dim}={p.value} not a multiple of {p.check.multiple}"
                               for p in table)
            out.append(f"qaudit's table ({rule}) refuses {where} ({broken}); TE's "
                       f"{answer.check} accepts it")
    return out


def _same_dim(table_dim: str, operand_dims: tuple[str, str]) -> bool:
    # The table checks the input's rows as M_in, the gathered rows as M.
    return table_dim in operand_dims


def shape_checks_for(runtime: Any) -> TEShapeChecks | None:
    """TE's checks where the te runtime has TE's Python imported, else None (the reference
    runtime never imports TE for this: docs/te-runtime.md, "Limits")."""
    if getattr(runtime, "name", None) != "te":
        return None
    return TEShapeChecks(runtime.api.pytorch)
