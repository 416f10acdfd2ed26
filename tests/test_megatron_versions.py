"""--megatron: the Megatron a verdict is for (installed, named or assumed) and its behaviour."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from cli_helpers import run_in_process
from qaudit.errors import InputError
from qaudit.plan.policies import POLICIES
from qaudit.plan.upstream.detect import locate_megatron, read_behaviour
from qaudit.plan.upstream.releases import (FIELD_SINCE, KNOWN, MAIN, NEWEST_RELEASE, RELEASES,
                                           YANKED, version_key)
from qaudit.plan.upstream.target import resolve_megatron

# --- a Megatron source tree, small and written here, in the shapes upstream's code has taken --

REARM_GUARDS = {
    "always": None,
    "fp8": "self.config.fp8 is not None",
    "0.19": ("self.config.fp8 is not None or self.config.fp4 is not None\n"
             "            or getattr(self.config, 'use_kitchen', False)\n"
             "            or getattr(self.config, 'quant_recipe', None) is not None"),
    "helper": "quantization_is_tracked(self.config)",
}
PASSING = {
    "flag": "x_flag = self.is_first_microbatch",
    "legacy": "x_flag = None if self.disable_parameter_transpose_cache else self.is_first_microbatch",
    "config": ("x_flag = (None if self.disable_parameter_transpose_cache\n"
               "                  or not quantization_is_tracked(self.config)\n"
               "                  else self.is_first_microbatch)"),
    "module": "x_flag = self._flag_for_te()",
}
MODULE_HELPERS = '''
def quantization_is_tracked(config, module=None, context=None):
    tracked = config.fp8 is not None or config.fp4 is not None or config.use_kitchen \\
        or config.quant_recipe is not None
    if not tracked or module is None:
        return tracked
    answer = getattr(module, "will_execute_quantized", None)
    return True if answer is None else answer(context)
'''


def write_megatron(root: Path, rearm: str = "0.19", passing: str = "legacy",
                   version: str | None = None, fields: tuple[str, ...] = tuple(FIELD_SINCE),
                   init_raises: bool = True) -> Path:
    core = root / "megatron" / "core"
    (core / "transformer").mkdir(parents=True)
    (core / "extensions").mkdir()
    # Importing this tree would fail loudly: detection must only read it.
    (core / "__init__.py").write_text("raise RuntimeError('megatron.core was imported')\n"
                                      if init_raises else "")
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 20\nPATCH = 0\nPRE_RELEASE = 'rc1'\n")
    guard = REARM_GUARDS[rearm]
    arm = ["for m in self.modules():", "    m.is_first_microbatch = True"]
    body = arm if guard is None else [f"if ({guard}):"] + ["    " + line for line in arm]
    (core / "transformer" / "module.py").write_text(
        MODULE_HELPERS + "\nclass MegatronModule:\n    def set_is_first_microbatch(self):\n"
        '        """Re-arm."""\n' + "".join(f"        {line}\n" for line in body))
    (core / "transformer" / "transformer_config.py").write_text(
        "class TransformerConfig:\n" + "".join(f"    {name}: object = None\n" for name in fields))
    forward = textwrap.indent(PASSING[passing], "        ")
    (core / "extensions" / "transformer_engine.py").write_text(
        "from megatron.core.transformer.module import quantization_is_tracked\n\n"
        "class TEQuantizationParams:\n    pass\n\n"
        + "".join(textwrap.dedent(f'''
        class {cls}:
            def will_execute_quantized(self, context):
                return bool(context)

            def _flag_for_te(self):
                if not quantization_is_tracked(self.config, self, None):
                    return None
                return self.is_first_microbatch

            def forward(self, x):
        ''') + forward + "\n        out = super().forward(x, is_first_microbatch=x_flag)\n"
                  "        self.is_first_microbatch = False\n        return out\n"
                  for cls in ("TELinear", "TELayerNormColumnParallelLinear", "TEGroupedLinear")))
    if version is not None:
        info = root / f"megatron_core-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: megatron-core\nVersion: {version}\n")
    return root


@pytest.mark.parametrize("rearm,passing,policy,rearm_on", [
    ("0.19", "legacy", "legacy", ("fp8", "fp4", "use_kitchen", "quant_recipe")),
    ("fp8", "legacy", "pre-5642", ("fp8",)),
    ("always", "flag", "always-rearm", None),
    ("helper", "config", "config", ("fp8", "fp4", "use_kitchen", "quant_recipe")),
    ("helper", "module", "module", ("fp8", "fp4", "use_kitchen", "quant_recipe")),
])
def test_behaviour_is_read_from_the_code(tmp_path, rearm, passing, policy, rearm_on):
    before = set(sys.modules)
    location = locate_megatron([str(write_megatron(tmp_path, rearm, passing))])
    behaviour = read_behaviour(location)
    assert (behaviour.policy, behaviour.rearm_on) == (policy, rearm_on)
    assert behaviour.te_recipes and behaviour.will_execute_quantized
    assert not {m for m in set(sys.modules) - before if m.startswith("megatron")}  # never imported


def test_location_follows_import_order_and_skips_the_working_directory(tmp_path):
    first = write_megatron(tmp_path / "a", version="0.19.2")
    second = write_megatron(tmp_path / "b")
    found = locate_megatron(["", ".", str(tmp_path / "empty"), str(first), str(second)])
    assert (found.root, found.version, found.kind) == (first, "0.19.2", "package")
    checkout = locate_megatron([str(second)])
    assert (checkout.version, checkout.kind) == ("0.20.0rc1", "checkout")
    # A regular `megatron` package without core hides the later entries, as import does.
    (tmp_path / "shadow" / "megatron").mkdir(parents=True)
    (tmp_path / "shadow" / "megatron" / "__init__.py").write_text("")
    assert locate_megatron([str(tmp_path / "shadow"), str(first)]) is None


def test_fields_the_installed_code_lacks_are_read_from_its_config(tmp_path):
    root = write_megatron(tmp_path, fields=("num_layers",))
    behaviour = read_behaviour(locate_megatron([str(root)]))
    assert behaviour.missing_fields == set(FIELD_SINCE)


def test_named_versions_and_unknown_ones():
    assert resolve_megatron("main").behaviour.policy == "config"
    named = resolve_megatron("v0.16.1")
    assert (named.source, named.version, named.behaviour.policy) == ("named", "0.16.1", "pre-5642")
    assert "mtp_use_repeated_layer" in named.behaviour.missing_fields
    with pytest.raises(InputError) as refused:
        resolve_megatron("0.4.0")
    assert "main" in str(refused.value) and "0.5.0" in str(refused.value) \
        and NEWEST_RELEASE in str(refused.value)


def test_every_known_megatron_has_a_policy_and_releases_are_in_order():
    assert all(behaviour.policy in POLICIES for behaviour in KNOWN.values())
    assert list(RELEASES) == sorted(RELEASES, key=version_key) and NEWEST_RELEASE == "0.19.2"
    assert KNOWN["0.19.2"].policy == "legacy" and KNOWN[MAIN].policy == "config"
    assert KNOWN["0.18.2"].policy == "pre-5642" and KNOWN["0.8.0"].policy == "always-rearm"


def test_nothing_importable_assumes_the_newest_release_and_says_so(tmp_path):
    target = resolve_megatron("auto", [str(tmp_path)])
    assert (target.source, target.version, target.behaviour.policy) == ("assumed", "0.19.2", "legacy")
    assert "--megatron main" in target.note


def test_unreadable_code_falls_back_and_says_why(tmp_path):
    root = write_megatron(tmp_path)
    (root / "megatron/core/transformer/module.py").write_text("def broken(:\n")
    target = resolve_megatron("auto", [str(root)])
    assert (target.source, target.version) == ("assumed", NEWEST_RELEASE)
    assert "could not read" in target.note and "module.py" in target.note


def test_a_patched_release_is_audited_as_its_code_reads(tmp_path):
    root = write_megatron(tmp_path, rearm="helper", passing="config", version="0.19.2")
    target = resolve_megatron("auto", [str(root)])
    assert (target.source, target.version, target.behaviour.policy) == ("installed", "0.19.2", "config")
    assert "differs from the released 0.19.2" in target.note


def test_yanked_releases_are_known_and_say_so_when_named_or_installed(tmp_path):
    # The index's yanks (pip download: "Reason for being yanked: wrong version"); their code
    # is audited as read, like any release's.
    assert YANKED == {"0.18.1": "wrong version", "0.19.1": "wrong version"}
    assert set(YANKED) <= set(RELEASES)
    named = resolve_megatron("0.19.1")
    assert named.behaviour == KNOWN["0.19.1"]
    assert named.note == 'yanked on the package index ("wrong version")'
    assert resolve_megatron("0.19.2").note is None
    root = write_megatron(tmp_path, version="0.18.1", rearm="0.19")
    installed = resolve_megatron("auto", [str(root)])
    assert installed.source == "installed" and "yanked on the package index" in installed.note


# --- the command line ----------------------------------------------------------------------

def test_default_without_megatron_fails_the_bf16_repeated_mtp_example(monkeypatch, capsys):
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml")
    assert code == 1
    assert "megatron: megatron-core 0.19.2 (assumed: no Megatron importable" in out
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--megatron", "main")
    assert code == 0 and "megatron: Megatron-LM main (d98e8a64 + PR #6965) (named with --megatron)" in out


def test_a_yanked_release_says_so_in_the_header_and_in_env(monkeypatch, capsys, tmp_path):
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "--megatron", "0.19.1", "--format", "json")
    assert code == 0 and json.loads(out)["megatron"]["note"] == (
        'yanked on the package index ("wrong version")')
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "--megatron", "0.19.1")
    assert "megatron: megatron-core 0.19.1 (named with --megatron; yanked on the package" in out
    monkeypatch.syspath_prepend(str(write_megatron(tmp_path, version="0.19.1")))
    code, out, _ = run_in_process(monkeypatch, capsys, "env")
    assert "megatron-core 0.19.1" in out and "yanked on the package index" in out


def test_policy_wins_over_megatron_and_says_so(monkeypatch, capsys):
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--megatron", "0.19.2", "--policy", "config")
    assert code == 0
    assert "policy: config (--policy; megatron-core 0.19.2 behaves as legacy)" in out


def test_installed_megatron_is_used_by_default(monkeypatch, capsys, tmp_path):
    root = write_megatron(tmp_path, rearm="helper", passing="config")
    monkeypatch.syspath_prepend(str(root))
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["policy"] == "config"
    assert data["megatron"]["source"] == "installed" and data["megatron"]["location"] == str(root)
    assert "megatron" not in sys.modules


def test_every_format_names_the_megatron(monkeypatch, capsys, tmp_path):
    outputs = {fmt: tmp_path / f"r.{fmt}" for fmt in ("markdown", "json", "sarif")}
    args = [arg for fmt, path in outputs.items() for arg in ("-o", f"{fmt}={path}")]
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml", *args)
    assert code == 0 and "megatron: megatron-core 0.19.2 (assumed" in out
    assert "for megatron-core 0.19.2 (assumed" in outputs["markdown"].read_text()
    assert json.loads(outputs["json"].read_text())["megatron"]["version"] == "0.19.2"
    sarif = json.loads(outputs["sarif"].read_text())
    assert sarif["runs"][0]["properties"]["megatron"]["source"] == "assumed"


def test_unknown_version_exits_2_listing_the_known_ones(monkeypatch, capsys):
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--megatron", "1.0")
    assert (code, out) == (2, "") and "0.19.2" in err and "main" in err and "Traceback" not in err


def test_a_setting_the_named_release_lacks_is_refused(monkeypatch, capsys):
    code, _, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--megatron", "0.16.1")
    assert code == 2
    assert "configs/gpt-mtp-bf16.yaml:9" in err and "mtp_use_repeated_layer" in err \
        and "0.17.0" in err
    code, _, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-fp8-attention-bf16.yaml",
                                  "--megatron", "0.15.3")
    assert code == 2 and "quant_recipe" in err and "0.16.0" in err


def test_values_qaudit_derives_are_not_settings_an_old_release_lacks(monkeypatch, capsys):
    # moe_ffn_hidden_size (0.10.0) is derived from ffn_hidden_size, not written by the user.
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "--megatron", "0.5.0")
    assert code == 0 and "policy: always-rearm" in out


def test_a_launch_flag_the_named_release_lacks_is_refused(monkeypatch, capsys, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 \\\n"
                      "  --num-attention-heads 4 --mtp-num-layers 2 --mtp-use-repeated-layer\n")
    code, _, err = run_in_process(monkeypatch, capsys, "check", str(script), "--megatron", "0.16.1")
    assert code == 2 and "mtp_use_repeated_layer" in err and "0.17.0" in err
    code, _, _ = run_in_process(monkeypatch, capsys, "check", str(script), "--megatron", "0.17.0")
    assert code == 1  # BF16 repeated MTP under 0.17.0 (pre-5642): stale flag, QA001


def test_diff_takes_megatron_too(monkeypatch, capsys):
    code, out, _ = run_in_process(monkeypatch, capsys, "diff", "configs/gpt-small-bf16.yaml",
                                  "configs/gpt-mtp-bf16.yaml", "--megatron", "main", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["head"]["megatron"]["version"] == "main"


# --- the real released package ----------------------------------------------------------------

def test_installed_megatron_core_0_19_2_is_read_as_legacy(monkeypatch, capsys, megatron):
    root = megatron  # on sys.path, as a user's install would be
    target = resolve_megatron("auto", [str(root)])
    assert (target.source, target.version, target.kind) == ("installed", "0.19.2", "package")
    assert target.behaviour == KNOWN["0.19.2"] and target.note is None
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml")
    assert code == 1 and "megatron: megatron-core 0.19.2 (installed:" in out
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-mtp-bf16.yaml",
                                  "--format", "json")
    assert code == 1 and json.loads(out)["megatron"] == {
        "source": "installed", "version": "0.19.2", "policy": "legacy",
        "label": "megatron-core 0.19.2", "location": str(root), "note": None,
        "startup_checks": "accepted"}  # its own checks ran in the fenced worker, not here:
    assert not any(name == "megatron" or name.startswith("megatron.") for name in sys.modules)
