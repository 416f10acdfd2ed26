"""Bad input: every failure is ONE `InputError` naming file, line and key; the CLI prints it as
a single `error: FILE:LINE: key 'KEY': message` line on stderr and exits 2, never a traceback.

Most cases call the loaders in process (`load_inputs`; recipe payloads through
`QuantRecipe.match` + `config_for`, which is where upstream checks them). The few cases that need
a fresh interpreter (the CLI itself, and inputs that could exhaust memory) run as subprocesses,
all started at once by the `background` fixture so that their start-up overlaps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from qaudit.errors import InputError
from qaudit.load.recipe import QuantRecipe

REPO = Path(__file__).resolve().parent.parent
BASE = "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\n"
QKV = "decoder.layers.0.self_attention.linear_qkv"
GOOD_RECIPE = """\
configs:
  bf16:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {}
matchers:
  attention: {type: glob, pattern: "*.self_attention.*", config: bf16, enabled: true}
"""


# --- helpers --------------------------------------------------------------------------------

def load_inputs(config: str | Path, recipe: str | Path | None = None):
    # Imported here, not at module level: qaudit.run.audit imports torch (~3 s), and the background
    # subprocesses should already be starting while that happens.
    from qaudit.commands.check import load_inputs as load

    return load(str(config), None if recipe is None else str(recipe))


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line of (dedented) `text` containing `needle`."""
    hits = [i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line]
    assert len(hits) >= nth, f"{needle!r} not in test YAML"
    return hits[nth - 1]


def check_error(err: InputError, *, file: str, line: int | None, key: str | None,
                words: tuple[str, ...] = ()) -> None:
    """The error names exactly this file/line/key, renders as the CLI prints it, and says why."""
    assert (err.file, err.line, err.key) == (file, line, key), str(err)
    prefix = file + (f":{line}" if line else "") + ": " + (f"key '{key}': " if key else "")
    text = str(err)
    assert text.startswith(prefix), text
    assert "\n" not in text and len(text) < 400, text
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


def config_error(write_yaml, text: str) -> tuple[str, InputError]:
    path = write_yaml("cfg.yaml", text)
    with pytest.raises(InputError) as info:
        load_inputs(path)
    return path, info.value


def recipe_error(write_yaml, text: str) -> tuple[str, InputError]:
    config, recipe = write_yaml("cfg.yaml", BASE), write_yaml("recipe.yaml", text)
    with pytest.raises(InputError) as info:
        load_inputs(config, recipe)
    return recipe, info.value


def bind_error(write_yaml, text: str, fqn: str = QKV) -> tuple[str, InputError]:
    """Payload errors surface when a module binds its matcher's config (docs/semantics.md §3.4)."""
    config, path = write_yaml("cfg.yaml", BASE), write_yaml("recipe.yaml", text)
    _, recipe = load_inputs(config, path)  # loads: an unbound payload is not checked yet
    assert isinstance(recipe, QuantRecipe)
    matcher = recipe.match(fqn)
    assert matcher is not None, f"no matcher for {fqn}"
    with pytest.raises(InputError) as info:
        recipe.config_for(matcher)
    return path, info.value


# --- subprocess cases, all started together ----------------------------------------------------

class Job:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def finish(self, timeout: float = 600) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
_JOBS: dict[str, Callable[[Path], Job]] = {}


def job(name: str):
    def register(start: Callable[[Path], Job]) -> Callable[[Path], Job]:
        _JOBS[name] = start
        return start
    return register


def _popen(args: list[str], cwd: Path) -> Job:
    return Job(subprocess.Popen(args, cwd=cwd, env=_ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True))


def _cli(cwd: Path, *args: str) -> Job:
    return _popen([sys.executable, "-m", "qaudit", "check", *args], cwd)


# A child that loads one config under hard limits (512 MiB address space, 1 s of CPU), so that an
# input which makes the loader run away is killed instead of eating the machine. It imports only
# qaudit.load.config (no torch), prints the message's length and its start, and exits 2 on InputError.
_GUARDED_LOAD = """\
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
resource.setrlimit(resource.RLIMIT_CPU, (1, 1))
from pathlib import Path
from qaudit.load.config import load_model_config
from qaudit.errors import InputError
try:
    load_model_config(Path(sys.argv[1]), sys.argv[1])
except InputError as exc:
    message = f"error: {exc}"
    print(len(message))
    print(message[:300])
    sys.exit(2)
"""


def _guarded_load(cwd: Path, config: str) -> Job:
    return _popen([sys.executable, "-c", _GUARDED_LOAD, config], cwd)


@job("cli_missing_config")
def _start_cli_missing_config(cwd: Path) -> Job:
    return _cli(cwd, "missing.yaml")


@job("cli_bad_recipe")
def _start_cli_bad_recipe(cwd: Path) -> Job:
    (cwd / "cfg.yaml").write_text(BASE)
    (cwd / "recipe.yaml").write_text(
        "configs: {}\nmatchers:\n  m: {type: regex, pattern: '.*', config: x, enabled: true}\n")
    return _cli(cwd, "cfg.yaml", "--recipe", "recipe.yaml")


def billion_laughs(levels: int = 9) -> str:
    """The classic bomb: 8 x 9 = 72 aliases (under the 100-alias cap) expand to 9**9 strings."""
    names = "abcdefghij"
    lines = ["bomb:", '  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"  {names[i]}: &{names[i]} [{', '.join([f'*{names[i - 1]}'] * 9)}]"
              for i in range(1, levels)]
    return "\n".join(lines) + f"\nmodel:\n  num_layers: *{names[levels - 1]}\n"


@job("bomb_in_field_value")
def _start_bomb_in_field_value(cwd: Path) -> Job:
    (cwd / "bomb.yaml").write_text(billion_laughs())
    return _guarded_load(cwd, "bomb.yaml")


@job("dev_zero")
def _start_dev_zero(cwd: Path) -> Job:
    return _guarded_load(cwd, "/dev/zero")


@pytest.fixture(scope="module", autouse=True)
def background(tmp_path_factory):
    """Start every subprocess case before the first test; each case's test collects its result."""
    jobs: dict[str, Job] = {}
    for name, start in _JOBS.items():
        cwd = tmp_path_factory.mktemp(name)
        jobs[name] = start(cwd)
    yield jobs
    for running in jobs.values():
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.communicate()


# --- the file itself -----------------------------------------------------------------------------

def test_missing_config_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(InputError) as info:
        load_inputs(path)
    check_error(info.value, file=path, line=None, key=None, words=("file not found",))


def test_directory_as_config(tmp_path):
    with pytest.raises(InputError) as info:
        load_inputs(tmp_path)
    check_error(info.value, file=str(tmp_path), line=None, key=None, words=("is a directory",))


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank", "comment"])
def test_empty_config(write_yaml, text):
    path, err = config_error(write_yaml, text)
    check_error(err, file=path, line=None, key=None, words=("empty file",))


def test_non_utf8_bytes_point_at_their_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"num_layers: 4\n# caf\xe9\nhidden_size: 64\n")
    with pytest.raises(InputError) as info:
        load_inputs(path)
    check_error(info.value, file=str(path), line=2, key=None, words=("not UTF-8",))


def test_binary_nul(tmp_path):
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"num_layers: 4\n\x00\x01\x02")
    with pytest.raises(InputError) as info:
        load_inputs(path)
    check_error(info.value, file=str(path), line=None, key=None, words=("NUL",))


def test_oversized_file(tmp_path):
    from qaudit.load.yamlio import MAX_FILE_BYTES

    path = tmp_path / "huge.yaml"
    path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(InputError) as info:
        load_inputs(path)
    check_error(info.value, file=str(path), line=None, key=None, words=("refused",))


@pytest.mark.parametrize("text, line, words", [
    ("num_layers: 4\nhidden_size: 64\n  bad: indent\n", 3, ("mapping values are not allowed",)),
    ("num_layers: 4\nhidden_size: [64\nnum_attention_heads: 4\n", 3, ("']'",)),
    ("num_layers: 4\nhidden_size: 'unterminated\n", 3, ("end of stream",)),
    ("num_layers: 4\n---\nhidden_size: 64\n", 2, ("another document",)),
    ("num_layers: !!python/object/apply:os.system ['true']\n", 1, ("constructor",)),
], ids=["indent", "unclosed-list", "unclosed-quote", "two-documents", "python-tag"])
def test_invalid_yaml_points_at_line(write_yaml, text, line, words):
    path, err = config_error(write_yaml, text)
    check_error(err, file=path, line=line, key=None, words=("invalid YAML",) + words)


def test_deep_nesting(write_yaml):
    path, err = config_error(write_yaml, "num_layers: " + "[" * 400 + "]" * 400 + "\n")
    check_error(err, file=path, line=1, key=None, words=("nested too deeply",))


def test_alias_bomb_over_the_cap_is_refused_before_expanding(write_yaml, monkeypatch):
    from qaudit.load import yamlio
    from work_counts import count_calls

    # 11 lines of 10 aliases each, every level nesting the one before: 110 aliases.
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 12)]
    constructed = count_calls(monkeypatch, yamlio._LineLoader, "construct_object")
    path, err = config_error(write_yaml, "\n".join(lines) + "\n")
    assert constructed.calls == 0  # refused while composing: no value was built
    check_error(err, file=path, line=12, key=None, words=("more than 100 YAML aliases",))


@pytest.mark.parametrize("text, line, words", [
    ("- num_layers: 4\n- hidden_size: 64\n", 1, ("expected a mapping", "got list")),
    ("just a string\n", 1, ("expected a mapping", "got string")),
    ("? [a, b]\n: 1\n", 1, ("mapping keys must be plain scalars",)),
], ids=["list", "scalar", "list-key"])
def test_document_not_a_mapping(write_yaml, text, line, words):
    path, err = config_error(write_yaml, text)
    check_error(err, file=path, line=line, key=None, words=words)


# --- config fields ---------------------------------------------------------------------------

FIELD_CASES = [
    # id, yaml, (line needle, nth), key, words
    ("model-not-mapping", "# Megatron-Bridge style\nmodel: 4\n", "model:", "model",
     ("under 'model'", "got integer")),
    ("model-list", "model:\n  - num_layers: 4\n", "model:", "model", ("got list",)),
    ("unknown-key", "num_layer: 4\nhidden_size: 64\nnum_attention_heads: 4\n", "num_layer:",
     "num_layer", ("unknown field", "did you mean 'num_layers'?")),
    ("unknown-key-under-model", "model:\n  num_layers: 4\n  hidden_sise: 64\n"
     "  num_attention_heads: 4\n", "hidden_sise", "hidden_sise",
     ("unknown field", "did you mean 'hidden_size'?")),
    ("non-string-key", BASE + "1: 2\n", "1: 2", "1", ("must be strings",)),
    ("num_layers-string", 'num_layers: "four"\nhidden_size: 64\nnum_attention_heads: 4\n',
     "num_layers", "num_layers", ("expected an integer", "string 'four'")),
    ("num_layers-float", "num_layers: 4.0\nhidden_size: 64\nnum_attention_heads: 4\n",
     "num_layers", "num_layers", ("expected an integer", "number 4.0")),
    ("num_layers-bool", "num_layers: true\nhidden_size: 64\nnum_attention_heads: 4\n",
     "num_layers", "num_layers", ("expected an integer", "boolean")),
    ("fp8-true", BASE + "fp8: true\n", "fp8:", "fp8", ("expected one of e4m3, hybrid, null", "True")),
    ("moe_layer_freq-not-0-1", BASE + "num_moe_experts: 4\nmoe_layer_freq: [0, 2]\n",
     "moe_layer_freq", "moe_layer_freq", ("only 0 and 1", "got 2")),
    ("bool-as-string", BASE + 'gated_linear_unit: "true"\n', "gated_linear_unit",
     "gated_linear_unit", ("expected true or false", "string 'true'")),
    ("quant_recipe-not-string", BASE + "quant_recipe: 3\n", "quant_recipe", "quant_recipe",
     ("expected a path string",)),
    ("num_layers-zero", "num_layers: 0\nhidden_size: 64\nnum_attention_heads: 4\n", "num_layers",
     "num_layers", ("must be >= 1, got 0",)),
    ("hidden_size-negative", "num_layers: 4\nhidden_size: -64\nnum_attention_heads: 4\n",
     "hidden_size", "hidden_size", ("must be >= 1",)),
    ("hidden_size-implausible", "num_layers: 4\nhidden_size: 10000000\nnum_attention_heads: 4\n",
     "hidden_size", "hidden_size", ("not a plausible size",)),
    ("fp8-e5m2", BASE + "fp8: e5m2\n", "fp8:", "fp8", ("expected one of e4m3, hybrid", "'e5m2'")),
    ("fp8_recipe-typo", BASE + "fp8: e4m3\nfp8_recipe: delay\n", "fp8_recipe", "fp8_recipe",
     ("'delay'", "did you mean 'delayed'?")),
    ("fp4-format", BASE + "fp4: nvfp4\n", "fp4:", "fp4", ("expected one of e2m1",)),
    ("missing-hidden_size", "num_layers: 4\nnum_attention_heads: 4\n", "num_layers", "hidden_size",
     ("required field is missing",)),
    ("missing-under-model", "# comment\nmodel:\n  num_layers: 4\n  hidden_size: 64\n",
     "num_layers", "num_attention_heads", ("required field is missing",)),
    ("duplicate-key", BASE + "fp8: e4m3\nfp8: hybrid\n", ("fp8:", 2), "fp8", ("duplicate key",)),
    ("duplicate-nested", "model:\n  num_layers: 4\n  hidden_size: 64\n  num_layers: 8\n",
     ("num_layers", 2), "num_layers", ("duplicate key",)),
    # contradictions upstream rejects at construction: reported at the offending key
    ("fp8-and-fp4", BASE + "fp8: e4m3\nfp8_recipe: tensorwise\nfp4: e2m1\n", "fp4:", "fp4",
     ("fp8 and fp4 cannot both be set",)),
    ("fp8_output_proj-needs-mxfp8", BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n"
     "fp8_output_proj: true\nshare_embeddings_and_output_weights: false\n", "fp8_output_proj",
     "fp8_output_proj", ("mxfp8",)),
    ("fp8_output_proj-without-fp8", BASE + "fp8_output_proj: true\n", "fp8_output_proj",
     "fp8_output_proj", ("needs fp8",)),
    ("first_last_bf16-delayed-default", BASE + "fp8: e4m3\nfirst_last_layers_bf16: true\n",
     "first_last", "first_last_layers_bf16", ("delayed",)),
    ("first_last_bf16-too-many", BASE + "fp8: e4m3\nfp8_recipe: mxfp8\nfirst_last_layers_bf16: "
     "true\nnum_layers_at_end_in_bf16: 5\n", "num_layers_at_end", "num_layers_at_end_in_bf16",
     ("at most num_layers // pipeline_model_parallel_size (4)",)),
    ("moe_layer_freq-length", BASE + "num_moe_experts: 4\nmoe_layer_freq: [1, 0, 1]\n",
     "moe_layer_freq", "moe_layer_freq", ("3 given, num_layers is 4",)),
    ("mtp-repeated-without-depths", BASE + "mtp_use_repeated_layer: true\n", "mtp_use_repeated",
     "mtp_use_repeated_layer", ("needs mtp_num_layers",)),
    ("heads-not-multiple-of-groups", "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 6\n"
     "num_query_groups: 4\n", "num_query_groups", "num_query_groups",
     ("num_attention_heads (6) must be a multiple of num_query_groups (4)",)),
    ("topk-over-experts", BASE + "num_moe_experts: 2\nmoe_router_topk: 4\n", "moe_router_topk",
     "moe_router_topk", ("cannot exceed num_moe_experts (2)",)),
    ("global-custom-recipe", BASE + "fp8: e4m3\nfp8_recipe: custom\n", "fp8_recipe", "fp8_recipe",
     ("quantizer factory",)),
    ("quant_recipe-with-kitchen", BASE + "use_kitchen: true\nquant_recipe: r.yaml\n",
     "quant_recipe", "quant_recipe", ("use_kitchen",)),
]


@pytest.mark.parametrize("text, where, key, words", [c[1:] for c in FIELD_CASES],
                         ids=[c[0] for c in FIELD_CASES])
def test_config_field_error(write_yaml, text, where, key, words):
    path, err = config_error(write_yaml, text)
    needle, nth = where if isinstance(where, tuple) else (where, 1)
    check_error(err, file=path, line=line_of(text, needle, nth), key=key, words=words)


def test_missing_quant_recipe_points_at_config_line(write_yaml):
    text = BASE + "fp8: e4m3\nfp8_recipe: tensorwise\nquant_recipe: recipes/nope.yaml\n"
    path = write_yaml("sub/cfg.yaml", text)
    with pytest.raises(InputError) as info:
        load_inputs(path)
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), "recipes", "nope.yaml"))
    check_error(info.value, file=path, line=line_of(text, "quant_recipe"), key="quant_recipe",
                words=(repr(resolved), "relative to the config file"))


def test_quant_recipe_is_resolved_next_to_the_config_and_blamed_for_its_errors(write_yaml):
    config = write_yaml("sub/cfg.yaml", BASE + "quant_recipe: recipes/r.yaml\n")
    recipe = write_yaml("sub/recipes/r.yaml", "configs: {}\nmatchers: [m]\n")
    with pytest.raises(InputError) as info:
        load_inputs(config)
    check_error(info.value, file=os.path.normpath(recipe), line=2, key="matchers",
                words=("expected a mapping",))


def test_missing_recipe_option_file(write_yaml, tmp_path):
    config, recipe = write_yaml("cfg.yaml", BASE), str(tmp_path / "nope.yaml")
    with pytest.raises(InputError) as info:
        load_inputs(config, recipe)
    check_error(info.value, file=recipe, line=None, key=None, words=("file not found",))


# --- recipe: checked at load -----------------------------------------------------------------

RECIPE_LOAD_CASES = [
    ("configs-not-mapping", "configs: [bf16]\nmatchers: {}\n", "configs", "configs",
     ("expected a mapping", "got list")),
    ("matchers-not-mapping", "configs: {}\nmatchers:\n  - {type: glob}\n", "matchers",
     "matchers", ("expected a mapping", "got list")),
    ("matcher-not-mapping", "configs: {}\nmatchers:\n  attention: '*.self_attention.*'\n",
     "attention", "attention", ("matcher 'attention' must be a mapping", "got string")),
    ("matcher-missing-pattern", "configs: {}\nmatchers:\n"
     "  attention: {type: glob, config: bf16, enabled: true}\n", "attention", "pattern",
     ("'attention' lacks required field",)),
    ("matcher-missing-type", "configs: {}\nmatchers:\n  attention:\n    pattern: '*'\n"
     "    config: bf16\n    enabled: true\n", "pattern:", "type", ("lacks required field",)),
    ("matcher-pattern-not-string", "configs: {}\nmatchers:\n  attention:\n    type: glob\n"
     "    pattern: [1, 2]\n    config: bf16\n    enabled: true\n", "pattern:", "pattern",
     ("expected a string", "got list")),
    ("matcher-type-regex", "configs: {}\nmatchers:\n  attention:\n    type: regex\n"
     "    pattern: '.*attention.*'\n    config: bf16\n    enabled: true\n", "type: regex", "type",
     ("'regex' is not supported", "only 'glob'")),
]


@pytest.mark.parametrize("text, needle, key, words", [c[1:] for c in RECIPE_LOAD_CASES],
                         ids=[c[0] for c in RECIPE_LOAD_CASES])
def test_recipe_load_error(write_yaml, text, needle, key, words):
    path, err = recipe_error(write_yaml, text)
    check_error(err, file=path, line=line_of(text, needle), key=key, words=words)


def test_disabled_matcher_with_garbage_values_loads(write_yaml):
    # Upstream skips a matcher without `enabled: true` before looking at anything else in it.
    text = """\
        configs:
          bf16:
            transformer_engine_config_type: TEQuantizationParams
            training_recipe: {}
          broken: 17
        matchers:
          draft:
            type: regex
            pattern: [1, 2]
            config: 42
          skipped: {enabled: false, type: layer_number, config: nowhere}
          attention: {type: glob, pattern: "*.self_attention.*", config: bf16, enabled: true}
        """
    _, recipe = load_inputs(write_yaml("cfg.yaml", BASE), write_yaml("recipe.yaml", text))
    assert [(m.name, m.explicit) for m in recipe.disabled_matchers] == [("draft", False), ("skipped", True)]
    assert [m.name for m in recipe.matchers] == ["attention"]
    assert recipe.match(QKV).name == "attention"
    assert recipe.config_for(recipe.match(QKV)).training.quant is None
    assert recipe.match("decoder.layers.0.mlp.linear_fc1") is None


# --- recipe: checked when a module binds its matcher's config ----------------------------------

def payload(training: str = "{}", extra: str = "") -> str:
    """GOOD_RECIPE with the `bf16` payload's training_recipe (and extra payload lines) replaced."""
    return ("configs:\n  bf16:\n    transformer_engine_config_type: TEQuantizationParams\n"
            f"    training_recipe: {training}\n{extra}"
            "matchers:\n  attention: {type: glob, pattern: \"*.self_attention.*\", config: bf16, "
            "enabled: true}\n")


BIND_CASES = [
    ("config-not-defined", GOOD_RECIPE.replace("config: bf16", "config: bf61"), "attention:",
     "config", ("matcher 'attention' names config 'bf61'", "not defined under 'configs'",
                "did you mean 'bf16'?")),
    ("payload-not-mapping", "configs:\n  bf16: 3\nmatchers:\n"
     "  attention: {type: glob, pattern: '*attention*', config: bf16, enabled: true}\n",
     "bf16: 3", "bf16", ("config 'bf16' must be a mapping",)),
    ("wrong-payload-type", payload().replace("TEQuantizationParams", "TEQuantisationParams"),
     "transformer_engine_config_type", "transformer_engine_config_type",
     ("needs transformer_engine_config_type: TEQuantizationParams", "'TEQuantisationParams'")),
    ("missing-payload-type", "configs:\n  bf16:\n    training_recipe: {}\nmatchers:\n"
     "  attention: {type: glob, pattern: '*attention*', config: bf16, enabled: true}\n",
     "training_recipe", "transformer_engine_config_type", ("got None",)),
    ("missing-training_recipe", "configs:\n  bf16:\n"
     "    transformer_engine_config_type: TEQuantizationParams\n    evaluation_recipe: {}\n"
     "matchers:\n  attention: {type: glob, pattern: '*attention*', config: bf16, enabled: true}\n",
     "transformer_engine_config_type", "training_recipe", ("config 'bf16' lacks required field",)),
    ("extra-payload-key", payload(extra="    training_recipes: {}\n"), "training_recipes:",
     "training_recipes", ("unknown field in config 'bf16'", "did you mean 'training_recipe'?")),
    ("training_recipe-not-mapping", payload("[fp8]"), "training_recipe", "training_recipe",
     ("expected a mapping", "got list")),
    ("unknown-recipe-field", payload("{fp8_quantisation_recipe: tensorwise}"), "training_recipe",
     "fp8_quantisation_recipe", ("unknown recipe field", "did you mean 'fp8_quantization_recipe'?")),
    ("fp8-delayed", payload("{fp8_quantization_recipe: delayed}"), "training_recipe",
     "fp8_quantization_recipe", ("'delayed'", "per-module recipe")),
    ("fp8-unknown-recipe", payload("{fp8_quantization_recipe: tensorwize}"), "training_recipe",
     "fp8_quantization_recipe", ("expected one of", "did you mean 'tensorwise'?")),
    ("fp8-and-fp4", payload("\n      fp8_quantization_recipe: mxfp8\n"
                            "      fp4_quantization_recipe: nvfp4"), "fp4_quantization_recipe",
     "fp4_quantization_recipe", ("cannot set both",)),
    ("custom-without-factory", payload("\n      fp8_format: hybrid\n"
                                       "      fp8_quantization_recipe: custom"),
     "fp8_quantization_recipe", "fp8_quantization_recipe", ("needs custom_recipe_factory",)),
    ("override-flag-not-bool", payload("{override_nonquantized_autocast: 1}"), "training_recipe",
     "override_nonquantized_autocast", ("expected true or false", "integer 1")),
    ("bad-evaluation-recipe", payload(extra="    evaluation_recipe:\n"
                                            "      fp8_format: e5m2\n"), "fp8_format",
     "fp8_format", ("expected one of e4m3, hybrid", "'e5m2'")),
]


@pytest.mark.parametrize("text, needle, key, words", [c[1:] for c in BIND_CASES],
                         ids=[c[0] for c in BIND_CASES])
def test_recipe_payload_error_when_bound(write_yaml, text, needle, key, words):
    path, err = bind_error(write_yaml, text)
    check_error(err, file=path, line=line_of(text, needle), key=key, words=words)


# --- subprocess cases (last, so that the in-process tests run while they start) ------------

def check_cli_error(result: tuple[int, str, str], prefix: str) -> str:
    code, out, err = result
    assert "Traceback" not in err, err
    assert (code, out) == (2, ""), err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith(prefix), err
    return lines[0]


def test_cli_missing_config_file(background):
    line = check_cli_error(background["cli_missing_config"].finish(), "error: missing.yaml: ")
    assert line == "error: missing.yaml: file not found"


def test_cli_recipe_error_names_recipe_file_line_and_key(background):
    line = check_cli_error(background["cli_bad_recipe"].finish(),
                           "error: recipe.yaml:3: key 'type': ")
    assert "'regex'" in line and "glob" in line


def test_billion_laughs_bomb_in_a_field_is_refused_quickly(background):
    code, out, err = background["bomb_in_field_value"].finish(timeout=600)
    assert code == 2, f"exit {code}: {err[-300:]}"
    length, message = out.split("\n", 1)
    assert message.startswith("error: bomb.yaml") and int(length) < 400, message


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_device_file_is_refused(background):
    code, out, err = background["dev_zero"].finish(timeout=600)
    assert code == 2, f"exit {code}: {err[-300:]}"
    assert out.split("\n", 1)[1].startswith("error: /dev/zero: "), out
