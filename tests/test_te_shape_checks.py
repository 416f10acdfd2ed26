"""TE's own Python shape checks against qaudit's table (issue 24, qaudit/runtime/te_shapes.py).

Fast: the comparison of TE's answers with the table's, and QA040 reporting a disagreement,
with answers made here. TE's real answers, per fetched release, are compared on every bundled
config's shapes and on hand-made bad shapes by tests/test_te_standin.py (slow, one TE per
subprocess: tests/te_standin.py `shape_cases`).
"""

from __future__ import annotations

from qaudit.commands.check import load_inputs
from qaudit.judge.rules import load_rules
from qaudit.load.precision import Quant
from qaudit.plan.shapes import COLUMN, GemmShape, Parallel, check_gemm_shape
from qaudit.plan.te_alignment import LAYERNORM_LINEAR
from qaudit.run.audit import run_audit
from qaudit.run.options import AuditOptions
from qaudit.runtime.te_shapes import TEAnswer, disagreements, shape_checks_for

MXFP8, TENSORWISE = Quant("fp8", "mxfp8"), Quant("fp8", "tensorwise")


def _problems(m, k, n, quant):
    shape = GemmShape("x", LAYERNORM_LINEAR, COLUMN, m, m, k, n)
    return check_gemm_shape(None, shape, quant, "2.14.0", Parallel())


def test_agreement_both_ways_is_no_disagreement():
    refused = TEAnswer("assert_dim_for_fp8_exec", "input", (4100, 1024), True, "FP8 execution")
    assert disagreements(_problems(4100, 1024, 1024, TENSORWISE), [refused]) == []
    passed = TEAnswer("assert_dim_for_fp8_exec", "weight", (1024, 1024), False)
    assert disagreements(_problems(4096, 1024, 1024, TENSORWISE), [passed]) == []


def test_te_refusing_what_the_table_accepts_names_both_sides():
    answer = TEAnswer("MXFP8Quantizer.make_empty", "W", (1040, 1024), True,
                      "Incorrect shape (1040, 1024) for MXFP8")
    # Tensorwise: the table has no MXFP8 rule for this shape, so it accepts what TE refused.
    [line] = disagreements(_problems(4096, 1024, 1040, TENSORWISE), [answer])
    assert "TE's MXFP8Quantizer.make_empty refuses W 1040 x 1024" in line
    assert "qaudit's table (mxfp8-quantize-dims) accepts it" in line


def test_the_table_refusing_what_te_accepts_is_a_disagreement_for_a_transcribed_check():
    accepted = TEAnswer("assert_dim_for_fp8_exec", "input", (4100, 1024), False)
    [line] = disagreements(_problems(4100, 1024, 1024, TENSORWISE), [accepted])
    assert "qaudit's table (fp8-exec-dims) refuses input 4100 x 1024 (M_in=4100 not a " \
           "multiple of 8)" in line and "TE's assert_dim_for_fp8_exec accepts it" in line


def test_a_stricter_table_rule_than_te_s_python_is_no_disagreement():
    """NVFP4: the quantize kernel (C++) asks 32, TE's Python allocator 16: a 48-wide weight
    passes TE's Python and not the table, which is right."""
    accepted = TEAnswer("NVFP4Quantizer.make_empty", "W", (1072, 1024), False)
    problems = _problems(4096, 1024, 1072, Quant("fp4", "nvfp4"))
    assert problems and disagreements(problems, [accepted]) == []


def test_a_check_that_could_not_run_is_said_never_read_as_a_pass():
    broken = TEAnswer("assert_dim_for_fp8_exec", "input", (4096, 1024), None, "TypeError: x")
    [line] = disagreements([], [broken])
    assert "could not run" in line and "TypeError" in line


class _RefusesEveryWeight:
    """A TE whose checks refuse every weight: what QA040 says when TE and the table differ."""

    def disagreements(self, shape, quant, backward, problems):
        answer = TEAnswer("assert_dim_for_fp8_exec", "weight", (shape.n, shape.k), True,
                          "FP8 execution requires ...")
        return disagreements(problems, [answer])


def test_qa040_reports_a_disagreement_per_module_group(write_yaml):
    path = write_yaml("fp8.yaml", "num_layers: 2\nhidden_size: 1024\nnum_attention_heads: 16\n"
                      "fp8: e4m3\nfp8_recipe: tensorwise\nseq_length: 4096\n")
    config, recipe = load_inputs(str(path))
    facts = run_audit(config, recipe, AuditOptions(steps=1, microbatches=1)).facts
    check = load_rules()["QA040"].findings
    assert check(facts) == []  # the table: every width aligned
    facts.te_shape_checks = _RefusesEveryWeight()
    found = check(facts)
    assert found and all(f.rule == "QA040" for f in found)
    qkv = next(f for f in found if "linear_qkv" in f.module)
    assert "TE's own shape check and qaudit's table of TE's rules" in qkv.message
    assert "(and 1 more like it)" in qkv.message  # layers 0 and 1: one finding


def test_the_reference_runtime_runs_no_te_check():
    """A plain audit never imports TE for this (docs/te-runtime.md, "Limits")."""
    from qaudit.runtime.reference import ReferenceRuntime

    assert shape_checks_for(ReferenceRuntime()) is None


def test_a_te_without_the_checks_runs_none(monkeypatch):
    """A TE package lacking utils.assert_dim_for_fp8_exec or the quantizer modules (or a fake
    one) gives no answer and no error: the table alone decides, as on the reference runtime."""
    import types

    package = types.ModuleType("fake_te_pytorch_for_shapes")
    package.__path__ = []
    monkeypatch.setitem(__import__("sys").modules, package.__name__, package)
    from qaudit.runtime.te_shapes import TEShapeChecks

    checks = TEShapeChecks(package)
    shape = GemmShape("x", LAYERNORM_LINEAR, COLUMN, 4100, 4100, 1040, 1000)
    assert checks.answers(shape, MXFP8, True) == []
    assert checks.disagreements(shape, MXFP8, True, []) == []
