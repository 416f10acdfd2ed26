"""Every file of the shared Megatron-Bridge corpus (`../shared/corpus/bridge`, see its
SOURCE.md), read in place: audited, or refused with exit 2 in one line naming file, line and key;
never exit 3. The Nemotron-3.5-Lightning recipes (repeated MTP) fail with QA001 on their MTP
modules; the same models as a TransformerConfig YAML and a launch script give the same rows.
Slow: about a hundred audits of real-size layer counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_helpers import run_in_process

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "bridge"
DUMPS = CORPUS / "dumps"
FILES = sorted(p for p in CORPUS.rglob("*") if p.is_file()) if CORPUS.is_dir() else []
EQUIVALENTS = Path(__file__).resolve().parent / "bridge_equivalents"

pytestmark = [pytest.mark.skipif(not FILES, reason=f"corpus not found at {CORPUS}"),
              pytest.mark.slow]

LIGHTNING = sorted(p for p in DUMPS.rglob("nemotron_3_5_lightning*.yaml")) if FILES else []
# Override files that change a model whose dump the corpus has: applied with --override.
OVERRIDE_BASES = {
    "nemotron_3/config/": "nemotron_3_nano_pretrain_config.yaml",
    "nemotronh/config/": "nemotronh_8b_pretrain_config.yaml",
    "mamba/conf/": "nemotronh_8b_pretrain_config.yaml",
    "quantization/conf/": "gpt3_175b_pretrain_32gpu_h100_bf16_config.yaml",
    "tutorials/recipes/llama/": "gemma3_1b_pretrain_config.yaml",
}
ONE_LINE_REFUSAL = re.compile(r"^error: \S.*?(:\d+)?: (key '[^']+': )?\S")


def check(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    return run_in_process(monkeypatch, capsys, "check", *args, cwd=None)


def report_of(monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    code, out, err = check(monkeypatch, capsys, *args, "--format", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def name_of(path: Path) -> str:
    return str(path.relative_to(CORPUS))


@pytest.mark.parametrize("path", FILES, ids=name_of)
def test_every_file_is_audited_or_refused_in_one_line(path, monkeypatch, capsys):
    code, out, err = check(monkeypatch, capsys, str(path))
    assert code in (0, 1, 2), err
    if code == 2:
        assert err.count("\n") == 1 and ONE_LINE_REFUSAL.match(err), err
        assert str(path) in err
    else:
        assert "source: Bridge ConfigContainer" in out


@pytest.mark.parametrize("path", LIGHTNING, ids=name_of)
def test_lightning_recipes_lose_mtp_gradients(path, monkeypatch, capsys):
    """Written without TE (gradient_accumulation_fusion: false in every dump): the fusion the
    GPU job uses is audited, and repeated MTP overwrites its own gradients; under
    Megatron-FSDP so does the output layer, called once per MTP depth."""
    code, report = report_of(monkeypatch, capsys, str(path))
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 1 and {f["rule"] for f in errors} == {"QA001"}
    expected = {"mtp", "output_layer"} if "fsdp" in path.name else {"mtp"}
    assert {f["module"].split(".")[0] for f in errors} == expected
    assert any("reported: true" in line for line in report["source"])


BF16_LIGHTNING = [p for p in LIGHTNING if "bf16" in p.name or p.name.endswith(
    "pretrain_config.yaml") or "_8k" in p.name]


@pytest.mark.parametrize("path", [p for p in BF16_LIGHTNING if "fsdp" not in p.name],
                         ids=name_of)
def test_bf16_lightning_passes_with_megatron_main(path, monkeypatch, capsys):
    code, report = report_of(monkeypatch, capsys, str(path), "--megatron", "main")
    assert code == 0, [f["message"] for f in report["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("path", [p for p in BF16_LIGHTNING if "fsdp" in p.name], ids=name_of)
def test_bf16_lightning_under_megatron_fsdp_fails_even_with_main(path, monkeypatch, capsys):
    """optim_grads_params sharding gives every weight overwrite_main_grad: each of the two
    MTP backwards overwrites, whatever is_first_microbatch says (#6965 does not help); and
    Megatron's own output layer, called once per depth, overwrites a Megatron-FSDP
    parameter's main_grad on every backward."""
    code, report = report_of(monkeypatch, capsys, str(path), "--megatron", "main")
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 1 and {f["rule"] for f in errors} == {"QA001"}
    assert all("overwrite_main_grad" in f["message"] for f in errors
               if not f["module"].startswith("output_layer"))
    assert any(f["module"] == "output_layer" and "Megatron's own linear" in f["message"]
               for f in errors)


def test_mxfp8_with_mtp_forced_bf16_fails_under_both(monkeypatch, capsys):
    composed = next((DUMPS / "composed").glob("*.yaml"))
    for megatron in ("auto", "main"):
        code, report = report_of(monkeypatch, capsys, str(composed), "--megatron", megatron)
        mtp = {r["name"]: r for r in report["modules"] if r["name"].startswith("mtp.")}
        assert code == 1 and {r["precision"] for r in mtp.values()} == {"bf16"}
        assert {r["recipe"] for r in mtp.values()} == {"bf16"}
        assert report["recipe"] == str(composed)


def test_te_quant_cfg_files_audit_as_recipes(monkeypatch, capsys):
    base = DUMPS / "nemotron_3_5_lightning_pretrain_8gpu_gb200_fp8mx_config.yaml"
    for recipe in sorted(CORPUS.rglob("te_quant.cfg")):
        code, report = report_of(monkeypatch, capsys, str(base), "--recipe", str(recipe))
        mtp = [r for r in report["modules"] if r["name"].startswith("mtp.")]
        assert code == 1 and mtp and {r["precision"] for r in mtp} == {"bf16"}


QUANTIZED_DUMPS = [p for p in sorted(DUMPS.rglob("*.yaml"))
                   if re.search(r"fp8|nvfp4|fp4", p.name)] if FILES else []


@pytest.mark.parametrize("path", QUANTIZED_DUMPS, ids=name_of)
def test_a_quantized_recipe_never_audits_as_bf16(path, monkeypatch, capsys):
    code, report = report_of(monkeypatch, capsys, str(path))
    labels = {r["precision"] for r in report["modules"]}
    wanted = "fp4/nvfp4" if "fp4" in path.name else "fp8/mxfp8" if "fp8mx" in path.name \
        else "fp8/tensorwise"
    assert wanted in labels, labels


@pytest.mark.parametrize("override", sorted(p for p in CORPUS.rglob("*.yaml")
                                            if any(k in str(p) for k in OVERRIDE_BASES)),
                         ids=name_of)
def test_override_files_audit_on_their_models_dump(override, monkeypatch, capsys):
    base = next(DUMPS / dump for key, dump in OVERRIDE_BASES.items() if key in str(override))
    code, out, err = check(monkeypatch, capsys, str(base), "--override", str(override))
    if "quantization/conf/" in str(override):
        # Written for a Llama-3 8B recipe, applied here to gpt3_175b, whose comm_overlap
        # defers the embedding wgrad: the file's gradient_accumulation_fusion False makes a
        # run megatron-core refuses at start-up (issue 48), which is what qaudit says.
        assert code == 2 and "Cannot defer embedding wgrad compute when gradient " \
            "accumulation fusion is not used" in err, err
        return
    assert code in (0, 1), err


def test_override_lines_from_the_docs(monkeypatch, capsys):
    """overrides.txt's model.* lines that apply to a GPT dump, as trailing arguments."""
    lines = (CORPUS / "overrides.txt").read_text().splitlines()
    pairs = sorted({word for line in lines for word in line.split()
                    if re.match(r"^model\.(tensor|pipeline|context|sequence)\w*=\d+$", word)})
    base = DUMPS / "gemma3_1b_pretrain_config.yaml"
    for word in pairs[:6]:
        code, out, err = check(monkeypatch, capsys, str(base), word)
        assert code in (0, 1, 2) and (code != 2 or word.split("=")[0] in err), err


EQUIVALENT_MODELS = sorted(p.stem for p in EQUIVALENTS.glob("*.yaml"))


def comparable(report: dict) -> tuple:
    """Rows, and the module findings: QA090 and QA091 name settings as each route wrote them
    (the equivalents carry the model, not the dump's ddp/optimizer sections); QA052 names
    Bridge #6103 on the dump only, a bug in Bridge's own training step, which only a run from
    the dump goes through."""
    findings = sorted((f["rule"], f["severity"], f["module"] or "") for f in report["findings"]
                      if f["rule"] not in ("QA090", "QA091", "QA052"))
    return report["modules"], findings


@pytest.mark.parametrize("model", EQUIVALENT_MODELS)
def test_a_dump_a_yaml_and_a_launch_script_give_the_same_audit(model, monkeypatch, capsys):
    _, dump = report_of(monkeypatch, capsys, str(DUMPS / f"{model}.yaml"))
    _, yaml_route = report_of(monkeypatch, capsys, str(EQUIVALENTS / f"{model}.yaml"))
    _, script = report_of(monkeypatch, capsys, str(EQUIVALENTS / f"{model}.sh"))
    assert comparable(dump) == comparable(yaml_route) == comparable(script)


def test_cross_check_of_a_bridge_gpt_dump(megatron, forget_megatron, monkeypatch, capsys):
    """vanilla_gpt ships zeros for its sizes (filled by CLI overrides); with them, the
    installed Megatron builds and trains the same modules."""
    code, report = report_of(monkeypatch, capsys, str(DUMPS / "vanilla_gpt_pretrain_config.yaml"),
                             "model.num_layers=2", "model.hidden_size=64",
                             "model.num_attention_heads=4", "model.ffn_hidden_size=256",
                             "--cross-check")
    assert report["cross_check"]["differences"] == [] and code == 0
    assert report["cross_check"]["modules_compared"] > 0


@pytest.mark.parametrize("name", ["gemma3_1b_pretrain_1gpu_h100_bf16_config",
                                  "olmoe_7b_pretrain_config"])
def test_cross_check_of_the_gpt_provider_dumps(name, megatron, forget_megatron, monkeypatch,
                                               capsys):
    """Gemma3 (a (local, global) RoPE base pair) and OLMoE (MoE): the installed Megatron builds
    and trains the same modules as qaudit's model of the dump."""
    code, report = report_of(monkeypatch, capsys, str(DUMPS / f"{name}.yaml"), "--cross-check")
    assert report["cross_check"]["differences"] == [] and code == 0
    assert report["cross_check"]["modules_compared"] > 0
