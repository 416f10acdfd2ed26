"""Hostile and broken inputs: qaudit is safe by default.

- A property-based test mutates the bundled configs and recipes (tests/mutations.py, shared
  with scripts/fuzz) and runs each through the console entry point in process: exit 0, 1 or 2,
  never a traceback; exit 2 is one `error: FILE...` line; no file appears anywhere; YAML tags
  never run; a recipe's custom factory is never imported.
- Regression tests for what scripts/fuzz found.
- YAML safety: Python tags, tag directives, a 1 KB alias bomb refused in well under a second.
- Custom recipes: `custom_recipe_factory` is imported only with --allow-import.
- Resource guards: a huge but otherwise valid model is refused before anything is built,
  while the biggest real models still load; internal errors exit 3; nothing is written.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

import mutations as m
from qaudit.errors import InputError

# Hypothesis keeps caches in ./.hypothesis; keep the working tree clean (database=None below
# covers the example database, this the rest).
_HYPOTHESIS_HOME = tempfile.TemporaryDirectory(prefix="qaudit-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME.name)

BASE = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
FP8 = BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n"


def load_inputs(config, recipe=None):
    from qaudit.commands.check import load_inputs as load

    return load(str(config), None if recipe is None else str(recipe))


def cli(*args: str) -> tuple[int, str, str]:
    return m.run_cli([*args])


def check_one_error_line(result: tuple[int, str, str], prefix: str, *words: str) -> str:
    code, out, err = result
    assert "Traceback" not in err and "internal error" not in err, err
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"error: {prefix}"), err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    return err


@contextlib.contextmanager
def small_limits():
    """The build-size guard at the fuzzing limits, so that every mutated model is small."""
    import qaudit.load.config as config

    saved = config.MAX_BUILT_LAYERS, config.MAX_BUILT_EXPERTS
    config.MAX_BUILT_LAYERS, config.MAX_BUILT_EXPERTS = m.FUZZ_MAX_LAYERS, m.FUZZ_MAX_EXPERTS
    try:
        yield
    finally:
        config.MAX_BUILT_LAYERS, config.MAX_BUILT_EXPERTS = saved


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory):
    """A real module named by the custom recipes: importing it would leave a file."""
    directory = m.install_marker_module(tmp_path_factory.mktemp("marker"))
    yield directory
    sys.path.remove(str(directory))
    sys.modules.pop(m.MARKER_MODULE, None)


# --- the property ---------------------------------------------------------------------------

PLANS = st.builds(
    m.Plan,
    config=st.integers(0, len(m.BASE_CONFIGS) - 1),
    recipe=st.integers(-1, len(m.BASE_RECIPES) - 1),
    via=st.sampled_from(("option", "config")),
    ops=st.lists(st.tuples(st.sampled_from(m.OPS), st.sampled_from(("config", "recipe")),
                           st.integers(0, 2**32 - 1)), min_size=1, max_size=4).map(tuple),
    args=st.sampled_from(m.EXTRA_ARGS),
)


@pytest.mark.slow  # a campaign: 150 mutated inputs (CI runs it)
# 150 examples: most fail while loading (milliseconds), the rest audit a model of at most
# 4 layers x 8 experts for one step: ~15-50 s in all, depending on the machine's load. scripts/fuzz runs long campaigns.
# derandomize: the same examples on every run (CI stays deterministic); database=None: no
# .hypothesis folder is written into the working directory.
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=PLANS)
def test_mutated_inputs_exit_cleanly(plan, marker_dir, monkeypatch_env):
    with tempfile.TemporaryDirectory() as folder, small_limits():
        directory = Path(folder)
        case = m.build_case(plan, directory)
        outcome = m.run_case(case, directory, marker_dir)
    assert not outcome.problems, (
        f"{outcome.problems}\nplan: {plan.describe()}\nexit {outcome.code}\n"
        f"stderr: {outcome.stderr[-2000:]}")


@pytest.fixture(scope="module")
def monkeypatch_env():
    """No GitHub Actions extras (job summary files) while the property runs."""
    saved = os.environ.pop("GITHUB_ACTIONS", None)
    yield
    if saved is not None:
        os.environ["GITHUB_ACTIONS"] = saved


def test_every_mutation_is_exercised():
    """Each op runs on each base without raising and changes something at least once."""
    import random

    for op in m.OPS:
        changed = False
        for index in range(len(m.BASE_CONFIGS)):
            plan = m.Plan(index, len(m.BASE_RECIPES) - 1, "config",
                          ((op, "config", 7 + index),))
            plain = m.build_case(m.Plan(index, len(m.BASE_RECIPES) - 1, "config", ()))
            changed |= m.build_case(plan).config != plain.config
        assert changed, op
    assert len({m.random_plan(random.Random(i)) for i in range(50)}) == 50


# --- regressions found by scripts/fuzz ----------------------------------------------------------

REGRESSIONS = [
    # id, config text, line, words
    ("control-character", "num_layers: 4\x07\nhidden_size: 64\n", 1,
     ("unacceptable character #x0007",)),
    ("escape-character", "num_layers: 4\nhidden_size: 64\x1b[2J\n", 2, ("#x001b",)),
    ("int-over-4300-digits", "num_layers: " + "1" * 5000 + "\n", 1,
     ("integer with more than 4300 digits",)),
    ("base-60-integer", "num_layers: " + ":".join(["59"] * 3000) + "\n", 1,
     ("integer with more than 100 digits",)),
    ("hex-integer", "hidden_size: 0x" + "f" * 400 + "\n", 1, ("more than 100 digits",)),
    ("bad-timestamp", "num_layers: !!timestamp 2001-13-45\n", 1,
     ("invalid YAML value", "month must be in 1..12")),
    ("map-tag-on-a-list", "num_layers: 4\nhidden_size: !!map [1, 2]\n", 2,
     ("tag !!map does not fit a list",)),
    ("bool-tag-on-a-word", "num_layers: 4\ngated_linear_unit: !!bool maybe\n", 2,
     ("tag !!bool does not accept 'maybe'",)),
]


@pytest.mark.parametrize("text, line, words", [c[1:] for c in REGRESSIONS],
                         ids=[c[0] for c in REGRESSIONS])
def test_fuzz_regressions_are_input_errors(write_yaml, text, line, words):
    path = write_yaml("cfg.yaml", text)
    with pytest.raises(InputError) as info:
        load_inputs(path)
    err = info.value
    assert (err.file, err.line) == (path, line), str(err)
    assert "\n" not in str(err) and len(str(err)) < 400, str(err)
    for word in words:
        assert word in str(err), str(err)


@pytest.mark.parametrize("depth", [400, 5000, 30000])
def test_deep_nesting_through_the_cli(tmp_path, depth):
    # Before the fix the MODEL_ARGS sniffing parse (qaudit.load.sources) hit RecursionError: exit 3.
    config = tmp_path / "cfg.yaml"
    config.write_text("num_layers: " + "[" * depth + "]" * depth + "\n")
    check_one_error_line(cli("check", str(config)), str(config), "nested too deeply")


def test_control_character_through_the_cli(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE + "fp8: e4m3\x07\n")
    check_one_error_line(cli("check", str(config)), f"{config}:4: ", "#x0007")


def test_quant_recipe_name_too_long_is_not_found(write_yaml):
    # os.stat raises ENAMETOOLONG; it was an OSError escaping load_inputs (exit 3).
    text = BASE + "quant_recipe: " + " x" * 3000 + "\n"
    path = write_yaml("cfg.yaml", text)
    with pytest.raises(InputError) as info:
        load_inputs(path)
    assert (info.value.file, info.value.line, info.value.key) == (path, 4, "quant_recipe")
    assert "not found" in str(info.value) and len(str(info.value)) < 1200


def test_recipe_option_name_too_long(write_yaml, tmp_path):
    config = write_yaml("cfg.yaml", BASE)
    long_name = str(tmp_path / ("r" * 5000 + ".yaml"))
    with pytest.raises(InputError) as info:
        load_inputs(config, long_name)
    assert "cannot open file" in str(info.value)


def test_config_argument_name_too_long(tmp_path):
    name = str(tmp_path / ("c" * 5000 + ".yaml"))
    check_one_error_line(cli("check", name), name[:50], "cannot open file", "name too long")


def test_error_line_escapes_control_characters_and_stays_short(write_yaml):
    path = write_yaml("cfg.yaml", BASE + '"evil\\n\\u001b[2Jkey": 1\n')
    with pytest.raises(InputError) as info:
        load_inputs(path)
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text, text
    assert "evil\\n\\x1b[2Jkey" in text


def test_long_key_is_clipped(write_yaml):
    path = write_yaml("cfg.yaml", BASE + "? " + "k" * 5000 + "\n: 1\n")  # explicit key: no 1024 cap
    with pytest.raises(InputError) as info:
        load_inputs(path)
    assert len(str(info.value)) < 300 and "unknown field" in str(info.value)


@pytest.mark.parametrize("fmt", ["table", "markdown", "github", "sarif"])
def test_names_from_the_input_cannot_inject_escapes_or_lines(tmp_path, fmt):
    # A matcher and a config named with a terminal escape and a newline that would start a
    # GitHub workflow command: findings and rows carry the escape escaped; the GitHub format
    # encodes the newline.
    config, recipe = tmp_path / "cfg.yaml", tmp_path / "r.yaml"
    config.write_text(FP8)
    recipe.write_text(textwrap.dedent("""\
        configs:
          "hp\\e[31m\\n::error::config":
            transformer_engine_config_type: TEQuantizationParams
            training_recipe: {}
        matchers:
          "evil\\e[2J\\n::error::pwned": {type: glob, pattern: "nothing", config: x}
          used: {type: glob, pattern: "*linear_proj", config: "hp\\e[31m\\n::error::config", enabled: true}
        """))
    code, out, err = cli("check", str(config), "--recipe", str(recipe), "--format", fmt,
                         "--steps", "1", "--microbatches", "1")
    assert code == 0, err
    assert "\x1b" not in out + err
    if fmt in ("github", "sarif"):  # a newline must not start a workflow command
        assert not [line for line in (out + err).splitlines()
                    if line.lstrip().startswith("::error::")]
    assert "pwned" in out  # still reported (QA010), escaped as each format escapes


# --- YAML safety ------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [
    "!!python/object/apply:os.system ['touch {dir}/PWNED']",
    "!!python/object/new:os.system ['touch {dir}/PWNED']",
    "!<tag:yaml.org,2002:python/object/apply:os.system> ['touch {dir}/PWNED']",
    "!!python/name:os.system",
], ids=["apply", "new", "verbatim-tag", "name"])
@pytest.mark.parametrize("where", ["config", "recipe"])
def test_python_tags_are_refused_and_never_run(tmp_path, payload, where):
    value = payload.format(dir=tmp_path)
    config, recipe = tmp_path / "cfg.yaml", tmp_path / "r.yaml"
    config.write_text(FP8 + (f"vocab_size: {value}\n" if where == "config" else ""))
    recipe.write_text("configs: {}\nmatchers: {}\n" if where == "config" else
                      f"configs:\n  x: {value}\nmatchers: {{}}\n")
    result = cli("check", str(config), "--recipe", str(recipe))
    target = config if where == "config" else recipe
    line = 6 if where == "config" else 2
    check_one_error_line(result, f"{target}:{line}: ", "invalid YAML", "constructor")
    assert not (tmp_path / "PWNED").exists()


def test_tag_directive_cannot_smuggle_a_python_tag(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("%TAG !py! tag:yaml.org,2002:python/object/apply:\n---\n" + BASE
                      + f"vocab_size: !py!os.system ['touch {tmp_path}/PWNED']\n")
    check_one_error_line(cli("check", str(config)), f"{config}:6: ", "constructor")
    assert not (tmp_path / "PWNED").exists()


def small_bomb() -> str:
    """Under 1 KB; 8 aliases per level x 9 levels (72, under the alias cap) reach 9**9 values."""
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    return "\n".join(lines) + "\n" + BASE


@pytest.mark.parametrize("where", ["config", "recipe"])
def test_one_kilobyte_bomb_is_refused_after_counting_each_node_once(write_yaml, monkeypatch,
                                                                   where):
    text = small_bomb()
    assert len(text.encode()) <= 1024
    if where == "config":
        config, recipe = write_yaml("cfg.yaml", text), None
    else:
        config = write_yaml("cfg.yaml", BASE)
        recipe = write_yaml("r.yaml", text.replace(BASE, "configs: *i\nmatchers: {}\n"))
    from qaudit.load import yamlio
    from work_counts import count_calls

    # Shared values are counted once each: the work is the document's nodes, not 9**9.
    sized = count_calls(monkeypatch, yamlio, "_expanded_size")
    constructed = count_calls(monkeypatch, yamlio._LineLoader, "construct_object")
    with pytest.raises(InputError) as info:
        load_inputs(config, recipe)
    # Linear in the text (a few passes over its ~100 words, whichever readers look at it),
    # where expanding the aliases would be 9**9 values.
    words = len(text.split())
    assert sized.calls < 20 * words and constructed.calls < 20 * words, (sized.calls,
                                                                        constructed.calls)
    assert "aliases expand this document" in str(info.value) and "refused" in str(info.value)
    assert info.value.file == (config if recipe is None else recipe)


def test_self_referencing_alias_is_refused(write_yaml):
    path = write_yaml("cfg.yaml", BASE + "loop: &loop [1, *loop]\n")
    with pytest.raises(InputError) as info:
        load_inputs(path)
    assert info.value.file == path
    assert "recursive" in str(info.value) or "refused" in str(info.value), str(info.value)


# --- custom recipes: never imported without --allow-import -------------------------------------

def custom_recipe(factory: str, fmt: str = "fp8") -> str:
    return textwrap.dedent(f"""\
        configs:
          mine:
            transformer_engine_config_type: TEQuantizationParams
            training_recipe:
              {fmt}_quantization_recipe: custom
              custom_recipe_factory: {factory}
        matchers:
          attention: {{type: glob, pattern: "*.self_attention.*", config: mine, enabled: true}}
        """)


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """`hostile_factory_mod` on sys.path: importing it writes IMPORTED, calling it CALLED."""
    name = "hostile_factory_mod"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        Path(__file__).with_name("IMPORTED").write_text("imported")


        class FakeQuantizer:
            pass


        def factory(role):
            Path(__file__).with_name("CALLED").write_text(role)
            return None if role == "linear_output" else FakeQuantizer()


        def broken(role):
            raise RuntimeError("no CUDA here")


        NOT_CALLABLE = 3
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, tmp_path
    sys.modules.pop(name, None)


def run_json(*args: str) -> tuple[int, dict, str]:
    import json

    code, out, err = cli(*args, "--steps", "1", "--microbatches", "1", "--format", "json")
    assert "Traceback" not in err, err
    return code, (json.loads(out) if out else {}), err


def test_os_system_factory_is_not_imported_or_called(write_yaml, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    config, recipe = write_yaml("cfg.yaml", FP8), write_yaml("r.yaml", custom_recipe("os.system"))
    code, report, _ = run_json("check", config, "--recipe", recipe)
    assert code == 0 and calls == []
    rows = {r["name"]: r for r in report["modules"]}
    assert rows["decoder.layers.0.self_attention.linear_qkv"]["precision"] == "fp8/custom (not executed)"
    assert rows["decoder.layers.0.mlp.linear_fc1"]["precision"] == "fp8/tensorwise"
    (finding,) = [f for f in report["findings"] if f["rule"] == "QA020"]
    assert finding["severity"] == "info" and finding["file"] == recipe and finding["line"] == 4
    assert "'os.system' is Python code and was not imported" in finding["message"]
    assert "--allow-import" in finding["fix"]


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_marker_module_is_never_imported_without_allow_import(write_yaml, factory_module, fmt):
    name, folder = factory_module
    config = write_yaml("cfg.yaml", BASE)  # no global fp8: the recipe needs its override flag
    recipe = write_yaml("r.yaml", custom_recipe(f"{name}.factory", fmt).replace(
        "custom_recipe_factory", "override_nonquantized_autocast: true\n      custom_recipe_factory"))
    code, report, _ = run_json("check", config, "--recipe", recipe)
    assert code == 0
    assert not (folder / "IMPORTED").exists() and name not in sys.modules
    precisions = {r["precision"] for r in report["modules"] if "self_attention" in r["name"]}
    assert precisions == {f"{fmt}/custom (not executed)"}
    assert any(f["rule"] == "QA020" for f in report["findings"])


def test_allow_import_imports_and_calls_the_factory(write_yaml, factory_module):
    name, folder = factory_module
    config, recipe = write_yaml("cfg.yaml", FP8), write_yaml("r.yaml", custom_recipe(f"{name}.factory"))
    code, report, _ = run_json("check", config, "--recipe", recipe, "--allow-import")
    assert code == 0
    assert (folder / "IMPORTED").exists() and name in sys.modules
    assert (folder / "CALLED").read_text() == "linear_grad_input"  # called for every role
    (finding,) = [f for f in report["findings"] if f["rule"] == "QA020"]
    assert "imported and called; it returns FakeQuantizer, None" in finding["message"]
    assert "per-tensor FP8 fake quantization as a stand-in" in finding["message"]
    precisions = {r["precision"] for r in report["modules"] if "self_attention" in r["name"]}
    assert precisions == {"fp8/custom (not executed)"}


@pytest.mark.parametrize("factory, words", [
    ("no_such_module_for_qaudit.factory", ("cannot import 'no_such_module_for_qaudit'",
                                           "ModuleNotFoundError")),
    ("{mod}.missing", ("has no attribute 'missing'",)),
    ("{mod}.NOT_CALLABLE", ("is a int, not a callable",)),
    ("{mod}.broken", ("raised RuntimeError for role 'linear_input': no CUDA here",)),
    ("factory", ("expected an import path like 'pkg.module.factory'",)),
], ids=["no-module", "no-attribute", "not-callable", "raises", "not-dotted"])
def test_allow_import_failures_are_input_errors(write_yaml, factory_module, factory, words):
    name, _ = factory_module
    config = write_yaml("cfg.yaml", FP8)
    recipe = write_yaml("r.yaml", custom_recipe(factory.format(mod=name)))
    result = cli("check", config, "--recipe", recipe, "--allow-import")
    check_one_error_line(result, f"{recipe}:4: key 'custom_recipe_factory': ", *words)


def test_qa020_is_documented():
    code, out, _ = cli("explain", "QA020")
    assert code == 0 and "--allow-import" in out and "not executed" in out


# --- resource guards -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, key, words", [
    ("num_layers: 100000\nhidden_size: 64\nnum_attention_heads: 4\n", "num_layers",
     ("100000 transformer layers", "the limit is 1024", "fewer layers")),
    (BASE + "mtp_num_layers: 1000000\n", "mtp_num_layers",
     ("1000002 transformer layers", "the limit is 1024")),
    (BASE.replace("2", "4", 1) + "num_moe_experts: 1000000\n", "num_moe_experts",
     ("4000000 routed experts", "1000000 in each of 4 MoE layers", "the limit is 32768",
      "fewer experts")),
    ("num_layers: 1024\nhidden_size: 64\nnum_attention_heads: 4\nnum_moe_experts: 65\n"
     "moe_layer_freq: 2\n", "num_moe_experts", ("33280 routed experts", "65 in each of 512")),
], ids=["layers", "mtp-depths", "experts", "experts-just-over"])
def test_huge_valid_model_is_refused_before_building(write_yaml, monkeypatch, text, key, words):
    def must_not_build(*args, **kwargs):
        raise AssertionError("built a model past the limits")

    monkeypatch.setattr("qaudit.run.audit.build_model", must_not_build)
    path = write_yaml("cfg.yaml", text)
    code, out, err = cli("check", path)
    check_one_error_line((code, out, err), f"{path}:", f"key '{key}'", *words)


REAL_MODELS = {
    # DeepSeek-V3: the bundled configs (61 layers, 256 experts, MTP) are checked below too.
    "qwen3-235b": "num_layers: 94\nhidden_size: 4096\nnum_attention_heads: 64\n"
                  "num_query_groups: 4\nnum_moe_experts: 128\nmoe_router_topk: 8\n",
    "llama-3.1-405b": "num_layers: 126\nhidden_size: 16384\nnum_attention_heads: 128\n"
                      "num_query_groups: 8\nffn_hidden_size: 53248\n",
    "kimi-k2": "num_layers: 61\nhidden_size: 7168\nnum_attention_heads: 64\n"
               "num_moe_experts: 384\nmoe_router_topk: 8\n"
               "moe_layer_freq: [0" + ", 1" * 60 + "]\nmtp_num_layers: 1\n",
    "at-the-limits": "num_layers: 1022\nhidden_size: 64\nnum_attention_heads: 4\n"
                     "mtp_num_layers: 2\nnum_moe_experts: 32\n",
}


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_biggest_real_models_pass_the_guard(write_yaml, name):
    config, recipe = load_inputs(write_yaml("cfg.yaml", REAL_MODELS[name]))
    assert config.num_layers > 1 and recipe is None


@pytest.mark.parametrize("name", ["deepseek-v3-mtp-fp8.yaml", "deepseek-v3-mtp-fp8-per-depth.yaml"])
def test_bundled_deepseek_configs_pass_the_guard(repo_configs, name):
    config, _ = load_inputs(repo_configs / name)
    assert (config.num_layers, config.num_moe_experts) == (61, 256)


@pytest.mark.parametrize("error", [RecursionError("deep"), MemoryError(), KeyError("x"),
                                   ZeroDivisionError("division by zero")],
                         ids=["recursion", "memory", "key", "zero-division"])
def test_internal_error_during_the_run_exits_3(write_yaml, monkeypatch, error):
    def explode(*args, **kwargs):
        raise error

    monkeypatch.setattr("qaudit.run.audit.run_training", explode)
    code, out, err = cli("check", write_yaml("cfg.yaml", BASE))
    assert (code, out) == (3, "")
    assert "Traceback" not in err and err.startswith(f"internal error: {type(error).__name__}")
    assert "bug in qaudit" in err and len(err.splitlines()) == 2


@pytest.mark.parametrize("text, expected", [(FP8, 0), (BASE + "num_layers_at_start: 1\n", 2),
                                            ("num_layers: [\n", 2)], ids=["audit", "bad-key", "bad-yaml"])
def test_a_run_writes_nothing(tmp_path, monkeypatch, text, expected):
    inputs, cwd = tmp_path / "inputs", tmp_path / "cwd"
    inputs.mkdir()
    cwd.mkdir()
    (inputs / "cfg.yaml").write_text(text)
    (inputs / "r.yaml").write_text(custom_recipe("os.system"))
    monkeypatch.chdir(cwd)
    code, _, err = cli("check", str(inputs / "cfg.yaml"), "--recipe", str(inputs / "r.yaml"),
                       "--steps", "1", "--microbatches", "1")
    assert code == expected, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cfg.yaml", "cwd", "inputs", "r.yaml"]


def test_markdown_never_lets_user_text_start_a_line():
    from qaudit.render.markdown import escape

    assert "\n" not in escape("matcher\n::error file=x::pwned")
