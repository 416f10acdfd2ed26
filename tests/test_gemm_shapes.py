"""GEMM shapes at real width and TE's alignment rules (rule QA040, docs/gemm-shapes.md).

Each rule test names the TE file and function the rule was read in; each split test one
parallel setting. The plan code is torch-free: these run without building a model, except the
rule tests at the end, which audit a small config.
"""

from __future__ import annotations

from dataclasses import replace

from pathlib import Path

import pytest

from qaudit.commands.inputs import load_inputs
from qaudit.load.precision import Quant
from qaudit.plan import shapes
from qaudit.plan.shapes import Parallel, check_gemm_shape, gemm_shape, padded_vocab, parallel_of
from qaudit.plan.te_alignment import GROUPED, LAYERNORM_LINEAR, LINEAR, alignment_rules, \
    token_multiple

REPO = Path(__file__).resolve().parents[1]
TENSORWISE, BLOCKWISE = Quant("fp8", "tensorwise"), Quant("fp8", "blockwise")
MXFP8, NVFP4, DELAYED = Quant("fp8", "mxfp8"), Quant("fp4", "nvfp4"), Quant("fp8", "delayed")
NEW = "2.20.2"


def _config(write_yaml, text: str):
    return load_inputs(str(write_yaml("config.yaml", text)))[0]


def _shape(m, k, n, kind=LINEAR, per_expert=False, m_in=None):
    return shapes.GemmShape("decoder.layers.0.mlp.linear_fc1", kind, shapes.COLUMN,
                            None if per_expert else m, None if per_expert else (m_in or m),
                            k, n, per_expert=per_expert)


def _broken(shape, quant, version=NEW, config=None, parallel=Parallel()):
    return {(p.rule.name, p.check.gemm, p.check.dim) if p.check else (p.rule.name, "pad")
            for p in check_gemm_shape(config, shape, quant, version, parallel)}


DENSE = "num_layers: 2\nhidden_size: 1024\nffn_hidden_size: 4096\nnum_attention_heads: 16\n"


# --- the rules, one per TE check and recipe ------------------------------------------------


def test_fp8_exec_dims_every_recipe():
    """transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec (from module/linear.py
    _Linear.forward): input rows % 8, in_features % 16, out_features % 8, any recipe."""
    for quant in (TENSORWISE, DELAYED, BLOCKWISE, MXFP8):
        assert ("fp8-exec-dims", "input", "K") in _broken(_shape(4096, 1000, 1024), quant)
        assert ("fp8-exec-dims", "input", "N") in _broken(_shape(4096, 1024, 1004), quant)
        assert ("fp8-exec-dims", "input", "M_in") in _broken(_shape(4100, 1024, 1024), quant)
        assert not _broken(_shape(4096, 1024, 1024), quant)


def test_fp8_exec_dims_versions_per_module():
    """assert_dim_for_fp8_exec: te.Linear's call absent in v2.0 only (module/linear.py);
    _LayerNormLinear.forward always; _GroupedLinear.forward up to v2.4."""
    names = lambda kind, version: {r.name for r in alignment_rules("mxfp8", kind, version)}
    assert "fp8-exec-dims" not in names(LINEAR, "2.0")
    assert "fp8-exec-dims" in names(LINEAR, "2.1") and "fp8-exec-dims" in names(LINEAR, "1.9")
    assert "fp8-exec-dims" in names(LAYERNORM_LINEAR, "2.0")
    assert "fp8-exec-dims" in names(GROUPED, "2.4")
    assert "fp8-exec-dims" not in names(GROUPED, "2.5")
    # Each expert's split % 8 up to v2.4; MXFP8's quantizer asks 32 of every row count anyway.
    assert token_multiple("delayed", GROUPED, "2.4") == 8
    assert token_multiple("delayed", GROUPED, "2.5") == 1
    assert token_multiple("mxfp8", GROUPED, "2.5") == 32


def test_tensor_scaling_leading_dim_from_2_9():
    """transformer_engine/common/gemm/cublaslt_gemm.cu CanonicalizeGemmInput: "Leading
    dimension requirement on A/B for FP8 GEMM" (lda, ldb % 16; TN: the reduction dim), v2.9+."""
    shape = _shape(4096, 1024, 1000)  # N % 8 passes assert_dim_for_fp8_exec, N % 16 does not
    for quant in (TENSORWISE, DELAYED):
        assert _broken(shape, quant, "2.9") == {("fp8-gemm-leading-dim", "dgrad", "N")}
        assert not _broken(shape, quant, "2.8")
    assert ("fp8-gemm-leading-dim", "wgrad", "M") in _broken(_shape(4104, 1024, 1024), TENSORWISE)
    # MXFP8's GEMM branch checks no dimension; its quantizer does (next test).
    assert _broken(shape, MXFP8) == {("mxfp8-quantize-dims", "fprop", "N")}


def test_mxfp8_quantizer_dims_from_2_0():
    """transformer_engine/pytorch/csrc/quantizer.cpp MXFP8Quantizer::create_tensor ("MXFP8
    requires tensor dims that are divisible by 32"; extensions/quantizer.cpp before v2.4) and
    TE's Python MXFP8Quantizer.make_empty (v2.0-v2.15): rows and columns of X, W, dY % 32.
    docs/gemm-shapes.md said MXFP8's quantizer had no check; TE's code contradicts it."""
    for dims, dim in (((4096, 1040, 1024), "K"), ((4096, 1024, 1040), "N"),
                      ((4112, 1024, 1024), "M")):
        assert _broken(_shape(*dims), MXFP8) == {("mxfp8-quantize-dims", "fprop", dim)}, dims
        assert not _broken(_shape(*dims), MXFP8, "1.13")
    assert not _broken(_shape(4096, 1024, 1024), MXFP8)
    assert {r.source for r in alignment_rules("mxfp8", LINEAR, "2.3")} >= {
        "transformer_engine/pytorch/csrc/extensions/quantizer.cpp: MXFP8Quantizer"}


def test_block_scaling_gemm_dims_from_2_3():
    """cublaslt_gemm.cu CanonicalizeGemmInput, NVTE_BLOCK_SCALING branch: lda % 16,
    A's outer dim % 8, B's (1D) outer dim % 8; since v2.3 (the recipe's first release)."""
    shape = _shape(4096, 1024, 1000)
    assert _broken(shape, BLOCKWISE) == {("block-scaling-gemm-dims", "dgrad", "N")}
    assert not _broken(shape, BLOCKWISE, "2.2")
    # Not a multiple of the 128-block: accepted (partial blocks get ceildiv scales).
    assert not _broken(_shape(4096, 7168, 576), BLOCKWISE)


def test_nvfp4_quantize_dims_from_2_8():
    """transformer_engine/common/cast/nvfp4/quantize_transpose_nvfp4.cuh quantize_transpose
    (common/util/nvfp4_transpose.cuh in v2.8, v2.9): rows and cols % 32 on X, W and dY."""
    assert _broken(_shape(4096, 1040, 1024), NVFP4) == {("nvfp4-quantize-dims", "fprop", "K")}
    assert ("nvfp4-quantize-dims", "fprop", "N") in _broken(_shape(4096, 1024, 1040), NVFP4)
    assert ("nvfp4-quantize-dims", "fprop", "M") in _broken(_shape(4112, 1024, 1024), NVFP4)
    assert {r.source.split(":")[0] for r in alignment_rules("nvfp4", LINEAR, "2.8")
            if r.name == "nvfp4-quantize-dims"} == {"transformer_engine/common/util/nvfp4_transpose.cuh"}
    assert not any(r.name == "nvfp4-quantize-dims" for r in alignment_rules("nvfp4", LINEAR, "2.7"))


def test_forward_only_skips_backward_gemms():
    shape = _shape(4096, 1024, 1000)
    assert not check_gemm_shape(None, shape, TENSORWISE, NEW, Parallel(), backward=False)


# --- tokens per expert --------------------------------------------------------------------


def test_tokens_per_expert_padded_by_megatron_when_fp8_is_set(write_yaml):
    moe = DENSE + "num_moe_experts: 8\nmoe_ffn_hidden_size: 1024\n"
    shape = _shape(None, 1024, 2048, kind=GROUPED, per_expert=True)
    padded = _config(write_yaml, moe + "fp8: e4m3\nfp8_recipe: tensorwise\n")
    assert not _broken(shape, TENSORWISE, config=padded)
    unpadded = _config(write_yaml, moe)  # experts quantized only by a recipe matcher
    assert ("fp8-exec-dims", "pad") in _broken(shape, TENSORWISE, "2.4", config=unpadded)
    problems = check_gemm_shape(unpadded, shape, TENSORWISE, NEW, Parallel())
    assert [(p.required_multiple, p.padding) for p in problems] == [(16, 0)]
    # Padding to 16 under FP8 does not meet NVFP4's 32 (experts in NVFP4 by a matcher).
    assert [(p.required_multiple, p.padding) for p in
            check_gemm_shape(padded, shape, NVFP4, NEW, Parallel())] == [(32, 16)]


# --- the parallel splits ------------------------------------------------------------------


def test_tensor_parallel_splits_column_n_and_row_k(write_yaml):
    config = _config(write_yaml, DENSE)
    fc1 = gemm_shape(config, "decoder.layers.0.mlp.linear_fc1", "TELayerNormColumnParallelLinear",
                     Parallel(tp=8, seq_length=4096))
    fc2 = gemm_shape(config, "decoder.layers.1.mlp.linear_fc2", "TERowParallelLinear",
                     Parallel(tp=8, seq_length=4096))
    assert (fc1.m, fc1.k, fc1.n) == (4096, 1024, 512)
    assert (fc2.m, fc2.k, fc2.n) == (4096, 512, 1024)


def test_expert_tensor_and_expert_parallel(write_yaml):
    config = _config(write_yaml, DENSE + "num_moe_experts: 8\nmoe_ffn_hidden_size: 1024\n"
                     "gated_linear_unit: true\n")
    name = "decoder.layers.0.mlp.experts.linear_fc1"
    by_etp = gemm_shape(config, name, "TEColumnParallelGroupedLinear", Parallel(tp=4, etp=2, ep=4))
    assert (by_etp.k, by_etp.n, by_etp.per_expert) == (1024, 1024, True)  # 2 x 1024 / ETP 2
    by_ep = gemm_shape(config, name, "TEColumnParallelGroupedLinear", Parallel(tp=1, etp=1, ep=8))
    assert (by_ep.k, by_ep.n) == (1024, 2048)  # EP changes how many experts, not their width
    local = gemm_shape(config, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2",
                       "TERowParallelLinear", Parallel(tp=4, etp=4))
    assert (local.k, local.n, local.per_expert) == (256, 1024, True)


def test_context_parallel_divides_tokens(write_yaml):
    config = _config(write_yaml, DENSE)
    shape = gemm_shape(config, "decoder.layers.0.self_attention.linear_qkv",
                       "TELayerNormColumnParallelLinear", Parallel(cp=4, seq_length=8192))
    assert shape.m == 2048
    # 8200 / CP 4 = 2050 tokens: not a multiple of 8 for assert_dim_for_fp8_exec.
    odd = gemm_shape(config, "decoder.layers.0.self_attention.linear_qkv",
                     "TELayerNormColumnParallelLinear", Parallel(cp=4, seq_length=8200))
    assert ("fp8-exec-dims", "input", "M_in") in _broken(odd, MXFP8)


def test_sequence_parallel_shards_a_column_input_and_mla_down_projections(write_yaml):
    config = _config(write_yaml, DENSE + "multi_latent_attention: true\n")
    p = Parallel(tp=8, sequence_parallel=True, seq_length=4096)
    qkv = gemm_shape(config, "decoder.layers.0.mlp.linear_fc1",
                     "TELayerNormColumnParallelLinear", p)
    assert (qkv.m, qkv.m_in) == (4096, 512)  # gathered GEMM, local input
    proj = gemm_shape(config, "decoder.layers.0.self_attention.linear_proj", "TERowParallelLinear", p)
    assert (proj.m, proj.m_in) == (4096, 4096)
    down = gemm_shape(config, "decoder.layers.0.self_attention.linear_kv_down_proj", "TELinear", p)
    assert (down.m, down.k, down.n) == (512, 1024, 512 + 64)  # duplicated: never split


def test_vocabulary_padding_by_divisible_by_times_tp(write_yaml):
    assert padded_vocab(129280, 128, 8) == 130048
    config = _config(write_yaml, DENSE + "vocab_size: 50257\n")
    for tp, divisible_by, n in ((1, 128, 50304), (4, 128, 12672), (8, 1, 6283)):
        out = gemm_shape(config, "output_layer", "TELMHeadColumnParallelLinear",
                         Parallel(tp=tp, vocab_divisible_by=divisible_by))
        assert out.n == n
    unpadded = gemm_shape(config, "output_layer", "TELMHeadColumnParallelLinear",
                          Parallel(tp=8, vocab_divisible_by=1))
    assert ("fp8-exec-dims", "input", "N") in _broken(unpadded, MXFP8)


def test_parallel_sizes_read_from_yaml_and_flags(write_yaml, tmp_path):
    config = _config(write_yaml, DENSE + "tensor_model_parallel_size: 4\nsequence_parallel: true\n"
                     "context_parallel_size: 2\nseq_length: 8192\nmake_vocab_size_divisible_by: 64\n")
    p = parallel_of(config)
    assert (p.tp, p.etp, p.cp, p.sequence_parallel, p.seq_length, p.vocab_divisible_by) == \
        (4, 4, 2, True, 8192, 64)
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 1024 "
                      "--num-attention-heads 16 --tensor-model-parallel-size 2 "
                      "--expert-tensor-parallel-size 1 --sequence-parallel --seq-length 4096\n")
    p = parallel_of(load_inputs(str(script))[0])
    assert (p.tp, p.etp, p.sequence_parallel, p.seq_length) == (2, 1, True, 4096)


# --- the bundled DeepSeek-V3 --------------------------------------------------------------

DEEPSEEK_MODULES = {
    "decoder.layers.3.self_attention.linear_q_down_proj": "TELinear",
    "decoder.layers.3.self_attention.linear_kv_down_proj": "TELinear",
    "decoder.layers.3.self_attention.linear_q_up_proj": "TELayerNormColumnParallelLinear",
    "decoder.layers.3.self_attention.linear_kv_up_proj": "TELayerNormColumnParallelLinear",
    "decoder.layers.3.self_attention.linear_proj": "TERowParallelLinear",
    "decoder.layers.0.mlp.linear_fc1": "TELayerNormColumnParallelLinear",
    "decoder.layers.0.mlp.linear_fc2": "TERowParallelLinear",
    "decoder.layers.3.mlp.shared_experts.linear_fc1": "TEColumnParallelLinear",
    "decoder.layers.3.mlp.shared_experts.linear_fc2": "TERowParallelLinear",
    "decoder.layers.3.mlp.experts.linear_fc1": "TEColumnParallelGroupedLinear",
    "decoder.layers.3.mlp.experts.linear_fc2": "TERowParallelGroupedLinear",
    "mtp.layers.0.eh_proj": "TEColumnParallelLinear",
    "output_layer": "TELMHeadColumnParallelLinear",
}


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_deepseek_v3_shapes_pass_every_recipe(tp):
    """docs/gemm-shapes.md's table: kv_down_proj's N = 576 included, nothing TE refuses."""
    config = load_inputs(str(REPO / "configs" / "deepseek-v3-mtp-fp8.yaml"))[0]
    p = Parallel(tp=tp, etp=tp, seq_length=4096, sequence_parallel=tp > 1)
    for name, cls in DEEPSEEK_MODULES.items():
        shape = gemm_shape(config, name, cls, p)
        assert shape is not None, name
        for quant in (TENSORWISE, BLOCKWISE, MXFP8, NVFP4 if "experts." not in name else MXFP8):
            # Megatron pads tokens per expert for the config's own recipe (MXFP8: 32).
            run = replace(config, fp8_recipe=quant.recipe) if quant.fmt == "fp8" else config
            assert not check_gemm_shape(run, shape, quant, NEW, p), (name, quant)
    kv = gemm_shape(config, "decoder.layers.3.self_attention.linear_kv_down_proj", "TELinear", p)
    assert kv.n == 576


# --- the rule, end to end -----------------------------------------------------------------


def _qa040(report):
    return [f for f in report.findings if f.rule == "QA040"]


def test_qa040_fires_naming_module_dimension_rule_and_fix(write_yaml):
    from qaudit.commands.check import audit_files
    from qaudit.run.options import AuditOptions

    text = (DENSE.replace("4096", "1000") + "fp8: e4m3\nfp8_recipe: tensorwise\n"
            "tensor_model_parallel_size: 8\nseq_length: 4096\n")
    report = audit_files(write_yaml("config.yaml", text), None, AuditOptions(te="2.20.2"))
    found = _qa040(report)
    assert {f.module for f in found} == {"decoder.layers.0.mlp.linear_fc1",
                                          "decoder.layers.0.mlp.linear_fc2"}
    fc2 = next(f for f in found if f.module.endswith("linear_fc2"))
    assert "K=125 is not a multiple of 16" in fc2.message and "1 more like it" in fc2.message
    assert "assert_dim_for_fp8_exec" in fc2.message and "BF16 with a recipe matcher" in fc2.fix
    assert report.exit_code() == 1
    clean = audit_files(write_yaml("config.yaml", text.replace("1000", "1024")), None,
                        AuditOptions(te="2.20.2"))
    assert not _qa040(clean)


def test_qa040_counted_work_is_one_shape_per_quantized_module(write_yaml, monkeypatch):
    """The shape check's work is one shape and one rule lookup per quantized module and recipe,
    shared by the rule and the report's table
    (it adds under 5 % to an audit: scripts/bench measures the time)."""
    from qaudit.commands.check import audit_files
    from qaudit.judge.rules import qa040_gemm_shape
    from qaudit.run.options import AuditOptions

    calls = {"shape": 0, "check": 0}
    real_shape, real_check = qa040_gemm_shape.gemm_shape, qa040_gemm_shape.check_gemm_shape

    def count(name, real):
        def counted(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return counted

    monkeypatch.setattr(qa040_gemm_shape, "gemm_shape", count("shape", real_shape))
    monkeypatch.setattr(qa040_gemm_shape, "check_gemm_shape", count("check", real_check))
    report = audit_files(write_yaml("config.yaml", DENSE + "fp8: e4m3\nfp8_recipe: tensorwise\n"),
                         None, AuditOptions())
    quantized = [r for r in report.modules if r.precision != "bf16"]
    assert calls["shape"] == len(quantized) == 8 and calls["check"] == 8


CORPUS = REPO.parent / "shared" / "corpus" / "megatron"
CORPUS_FILES = sorted(p for folder in ("functional_tests", "launch_scripts")
                      for p in (CORPUS / folder).glob("*") if p.is_file()) \
    if CORPUS.is_dir() else []


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS_FILES, reason="corpus not found")
def test_corpus_shape_check():
    """Every corpus file the corpus test audits: the audit, QA040 included, ends without an
    internal error, and QA040 finds nothing there (docs/gemm-shapes.md, "The corpus")."""
    import sys

    from qaudit.commands.check import audit_config
    from qaudit.errors import InputError
    from qaudit.run.options import AuditOptions

    sys.path.insert(0, str(REPO / "tests"))
    from test_corpus import MAX_MODULES, te_modules

    audited = 0
    for path in CORPUS_FILES:
        try:
            config, recipe = load_inputs(str(path))
            if te_modules(config) > MAX_MODULES:
                continue
            report = audit_config(config, recipe, AuditOptions(steps=1, microbatches=1))
        except InputError:
            continue  # test_corpus.py checks what a refusal says
        assert report.exit_code() in (0, 1), path.name
        assert not _qa040(report), (path.name, [f.message for f in _qa040(report)])
        audited += 1
    assert audited > 250
