"""Quant recipe files: Megatron's `--te-precision-config-file` format (docs/semantics.md §3).

`configs` maps a name to a `TEQuantizationParams` payload; `matchers` is an ordered mapping of
glob matchers. Upstream checks matchers when the file is loaded and a payload only once a module
matches it; we do the same, so an unmatched broken payload does not stop the audit.

What Megatron accepts but reads differently from how it looks is accepted too, as Megatron reads
it, and kept as a `RecipeNote` for rules QA018/QA019 (docs/upstream-model.md, "Recipes"): a
matcher's `enabled` taken by truthiness (the string "false" enables it), top-level and matcher
keys it ignores, and keys written twice (PyYAML keeps the last value).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qaudit.errors import InputError
from qaudit.load.precision import FP8_FORMATS, Quant
from qaudit.load.yamlio import Duplicate, YamlMap, did_you_mean, load_yaml, short_repr, type_name

PAYLOAD_TYPE = "TEQuantizationParams"
_MATCHER_FIELDS = ("type", "pattern", "config", "enabled")
_PAYLOAD_FIELDS = ("transformer_engine_config_type", "training_recipe", "evaluation_recipe")
_RECIPE_DEFAULTS: dict[str, Any] = {
    "fp8_quantization_recipe": None,
    "fp4_quantization_recipe": None,
    "custom_recipe_factory": None,
    "fp8_format": "e4m3",
    "override_quantized_autocast": True,
    "override_nonquantized_autocast": False,
    "tp_only_amax_red": False,
    "fp8_param": False,
    "fp4_param": False,
}
_FP8_RECIPE_CHOICES = ("tensorwise", "blockwise", "mxfp8", "custom")
_FP4_RECIPE_CHOICES = ("nvfp4", "custom")


@dataclass(frozen=True, kw_only=True)  # nine like-typed fields: by name only
class TERecipe:
    """One `TEQuantizationRecipe`; `{}` (no fp8/fp4 field) means high precision."""

    fp8_quantization_recipe: str | None
    fp4_quantization_recipe: str | None
    custom_recipe_factory: str | None
    fp8_format: str
    override_quantized_autocast: bool
    override_nonquantized_autocast: bool
    tp_only_amax_red: bool
    fp8_param: bool
    fp4_param: bool
    line: int | None = None

    @property
    def quant(self) -> Quant | None:
        if self.fp8_quantization_recipe:
            return Quant("fp8", self.fp8_quantization_recipe, self.fp8_format)
        if self.fp4_quantization_recipe:
            return Quant("fp4", self.fp4_quantization_recipe)
        return None


@dataclass(frozen=True)
class QuantConfig:
    name: str
    training: TERecipe
    evaluation: TERecipe | None
    line: int | None

    def recipe_for(self, training: bool) -> TERecipe:
        return self.training if training or self.evaluation is None else self.evaluation


@dataclass(frozen=True)
class Matcher:
    name: str
    pattern: str
    config: str
    line: int | None

    def matches(self, fqn: str) -> bool:
        # fnmatch's `*` also matches dots, as upstream relies on (`*fc2` hits nested names).
        return fnmatch.fnmatchcase(fqn, self.pattern)


@dataclass(frozen=True)
class DisabledMatcher:
    name: str
    line: int | None
    explicit: bool  # `enabled: false` written out, as opposed to left at the default


@dataclass(frozen=True)
class RecipeNote:
    """Something Megatron accepts and reads differently from how it looks."""

    rule: str  # QA018 (`enabled` not a boolean) or QA019 (ignored or replaced keys)
    message: str
    line: int | None
    fix: str


@dataclass(kw_only=True)
class QuantRecipe:
    file: str
    configs: YamlMap
    matchers: list[Matcher]
    disabled_matchers: list[DisabledMatcher]
    _parsed: dict[str, QuantConfig]
    notes: list[RecipeNote] = field(default_factory=list)

    def match(self, fqn: str) -> Matcher | None:
        """The first enabled matcher for `fqn`; no fall-through after it."""
        for matcher in self.matchers:
            if matcher.matches(fqn):
                return matcher
        return None

    def config_for(self, matcher: Matcher) -> QuantConfig:
        """Parse (once) the payload a matcher names; upstream does this at model construction."""
        if matcher.config not in self.configs:
            hint = did_you_mean(matcher.config, [str(k) for k in self.configs])
            raise InputError(f"matcher '{matcher.name}' names config '{matcher.config}', which "
                             f"is not defined under 'configs'{hint}",
                             file=self.file, line=matcher.line, key="config")
        return self.parse_config(matcher.config)

    def parse_config(self, name: str) -> QuantConfig:
        if name not in self._parsed:
            self._parsed[name] = _parse_payload(self.file, name, self.configs[name],
                                                self.configs.line_of(name))
        return self._parsed[name]


def load_recipe(path: Path, display: str | None = None) -> QuantRecipe:
    display = display or str(path)
    duplicates: list[Duplicate] = []
    document = load_yaml(path, display, duplicates=duplicates)
    return recipe_from_document(document, display, duplicates)


def recipe_from_document(document: Any, display: str, duplicates: list[Duplicate] = (),
                         notes: list[RecipeNote] | None = None) -> QuantRecipe:
    """A recipe from its loaded document (`configs` + `matchers`, lines kept); also the
    route of a serialized RecipeConfig (qaudit/load/bridge/quant_recipe.py), with `notes`
    it found on the way."""
    if not isinstance(document, YamlMap):
        raise InputError(f"expected a mapping with 'configs' and 'matchers', got {type_name(document)}",
                         file=display, line=getattr(document, "line", 1))
    notes = list(notes or []) + [_duplicate_note(d) for d in duplicates]
    for key in document:
        if key not in ("configs", "matchers"):
            hint = did_you_mean(str(key), ("configs", "matchers"))
            notes.append(RecipeNote("QA019", f"unknown top-level key {short_repr(str(key))}"
                                    f"{hint}: Megatron reads only 'configs' and 'matchers' and "
                                    "ignores it", document.line_of(key),
                                    "remove it, or fix its name"))
    configs = _mapping_or_empty(document, "configs", display)
    matchers_map = _mapping_or_empty(document, "matchers", display)
    matchers: list[Matcher] = []
    disabled: list[DisabledMatcher] = []
    for name, body in matchers_map.items():
        line = matchers_map.line_of(name)
        matcher = _parse_matcher(display, str(name), body, line, notes)
        if matcher is None:
            disabled.append(DisabledMatcher(str(name), line, "enabled" in body))
        else:
            matchers.append(matcher)
    return QuantRecipe(file=display, configs=configs, matchers=matchers, disabled_matchers=disabled,
                       _parsed={}, notes=sorted(notes, key=lambda n: (n.line or 0, n.rule)))


def _duplicate_note(duplicate: Duplicate) -> RecipeNote:
    key = short_repr(str(duplicate.key))
    return RecipeNote("QA019", f"key {key} is written twice (first at line "
                      f"{duplicate.first_line}): PyYAML, which Megatron loads the file with, "
                      "keeps this last value, at the first one's place in the order; the first "
                      "value is ignored",
                      duplicate.line, "keep one of them (a matcher name must be unique)")


def _mapping_or_empty(document: YamlMap, key: str, file: str) -> YamlMap:
    value = document.get(key)
    if value is None:
        return YamlMap(line=document.line_of(key))
    if not isinstance(value, YamlMap):
        raise InputError(f"expected a mapping, got {type_name(value)}", file=file,
                         line=document.line_of(key), key=key)
    return value


_FALSE_WORDS = ("false", "no", "off", "0", "n", "none", "null", "disabled")


def _parse_matcher(file: str, name: str, body: Any, line: int | None,
                   notes: list[RecipeNote]) -> Matcher | None:
    if not isinstance(body, YamlMap):
        raise InputError(f"matcher '{name}' must be a mapping, got {type_name(body)}",
                         file=file, line=line, key=name)
    for key in body:
        if key not in _MATCHER_FIELDS:
            notes.append(RecipeNote(
                "QA019", f"matcher {short_repr(name)}: unknown field {short_repr(str(key))}"
                f"{did_you_mean(str(key), _MATCHER_FIELDS)}; Megatron ignores it",
                body.line_of(key), "remove it, or fix its name"))
    # Megatron: `matcher.get("enabled", False)` and `if not enabled: continue`.
    enabled = body.get("enabled", False)
    if not isinstance(enabled, bool):
        said_false = isinstance(enabled, str) and enabled.strip().lower() in _FALSE_WORDS
        reading = "enabled" if enabled else "disabled"
        trap = " (a non-empty string is true, even 'false')" if said_false else ""
        notes.append(RecipeNote(
            "QA018", f"matcher {short_repr(name)}: enabled is {type_name(enabled)} "
            f"{short_repr(enabled)}, which Megatron reads by truthiness: the matcher is "
            f"{reading}{trap}", body.line_of("enabled"),
            f"write 'enabled: {'true' if enabled else 'false'}' (unquoted)"))
    if not enabled:
        # Upstream skips a disabled matcher without validating it.
        return None
    for key in ("type", "pattern", "config"):
        if key not in body:
            raise InputError(f"enabled matcher '{name}' lacks required field", file=file,
                             line=body.line, key=key)
        if not isinstance(body[key], str):
            raise InputError(f"expected a string, got {type_name(body[key])} {short_repr(body[key])}",
                             file=file, line=body.line_of(key), key=key)
    if body["type"] != "glob":
        raise InputError(f"matcher type {short_repr(body['type'])} is not supported upstream; only 'glob'",
                         file=file, line=body.line_of("type"), key="type")
    _check_pattern(file, name, body["pattern"], body.line_of("pattern"))
    return Matcher(name, body["pattern"], body["config"], line)


# A glob is translated to a regular expression (fnmatch scans ahead from every `[`, and each
# `*` is a search step when matching), so both the length and the wildcard count are bounded
# before any pattern reaches fnmatch. Real recipes' patterns are module paths of under 100
# characters with a few `*`.
MAX_PATTERN_LENGTH = 1000
MAX_PATTERN_WILDCARDS = 64


def _check_pattern(file: str, name: str, pattern: str, line: int | None) -> None:
    """Refuse (exit 2, naming the matcher) a glob too long or too complex to match safely."""
    wildcards = sum(pattern.count(c) for c in "*?[")
    if len(pattern) > MAX_PATTERN_LENGTH:
        problem = f"is {len(pattern):,} characters long (at most {MAX_PATTERN_LENGTH:,})"
    elif wildcards > MAX_PATTERN_WILDCARDS:
        problem = (f"has {wildcards:,} wildcards ('*', '?', '[') (at most "
                   f"{MAX_PATTERN_WILDCARDS})")
    else:
        return
    raise InputError(f"matcher {short_repr(name)}: the glob pattern {problem}; module paths "
                     "need a few", file=file, line=line, key="pattern")


def _parse_payload(file: str, name: str, body: Any, line: int | None) -> QuantConfig:
    if not isinstance(body, YamlMap):
        raise InputError(f"config '{name}' must be a mapping, got {type_name(body)}",
                         file=file, line=line, key=name)
    for key in body:
        if key not in _PAYLOAD_FIELDS:
            raise InputError(f"unknown field in config '{name}'{did_you_mean(str(key), _PAYLOAD_FIELDS)}",
                             file=file, line=body.line_of(key), key=str(key))
    kind = body.get("transformer_engine_config_type")
    if kind != PAYLOAD_TYPE:
        raise InputError(f"config '{name}' needs transformer_engine_config_type: {PAYLOAD_TYPE}, "
                         f"got {short_repr(kind)}", file=file,
                         line=body.line_of("transformer_engine_config_type"),
                         key="transformer_engine_config_type")
    if "training_recipe" not in body:
        raise InputError(f"config '{name}' lacks required field", file=file, line=body.line,
                         key="training_recipe")
    training = _parse_recipe(file, body, "training_recipe")
    evaluation = _parse_recipe(file, body, "evaluation_recipe") if "evaluation_recipe" in body else None
    return QuantConfig(name, training, evaluation, line)


def _parse_recipe(file: str, payload: YamlMap, key: str) -> TERecipe:
    body = payload[key]
    line = payload.line_of(key)
    if body is None:
        body = YamlMap(line=line)
    if not isinstance(body, YamlMap):
        raise InputError(f"expected a mapping, got {type_name(body)}", file=file, line=line, key=key)
    values = dict(_RECIPE_DEFAULTS)
    for field_name, value in body.items():
        field_line = body.line_of(field_name)
        if field_name not in _RECIPE_DEFAULTS:
            hint = did_you_mean(str(field_name), _RECIPE_DEFAULTS)
            raise InputError(f"unknown recipe field{hint}", file=file, line=field_line, key=str(field_name))
        values[field_name] = _check_recipe_value(file, str(field_name), value, field_line)
    fp8, fp4 = values["fp8_quantization_recipe"], values["fp4_quantization_recipe"]
    if fp8 and fp4:
        raise InputError("a recipe cannot set both fp8_quantization_recipe and "
                         "fp4_quantization_recipe", file=file, line=body.line_of("fp4_quantization_recipe"),
                         key="fp4_quantization_recipe")
    if "custom" in (fp8, fp4) and not values["custom_recipe_factory"]:
        which = "fp8_quantization_recipe" if fp8 == "custom" else "fp4_quantization_recipe"
        raise InputError("a 'custom' recipe needs custom_recipe_factory", file=file,
                         line=body.line_of(which), key=which)
    return TERecipe(**values, line=line)


def _check_recipe_value(file: str, key: str, value: Any, line: int | None) -> Any:
    def fail(message: str) -> InputError:
        return InputError(message, file=file, line=line, key=key)

    if key == "fp8_quantization_recipe":
        if value == "delayed":
            raise fail("'delayed' scaling cannot be used in a per-module recipe (upstream rejects it)")
        choices = _FP8_RECIPE_CHOICES
    elif key == "fp4_quantization_recipe":
        choices = _FP4_RECIPE_CHOICES
    elif key == "fp8_format":
        choices = FP8_FORMATS
    elif key == "custom_recipe_factory":
        if value is not None and not isinstance(value, str):
            raise fail(f"expected an import path string, got {type_name(value)}")
        return value
    else:
        if not isinstance(value, bool):
            raise fail(f"expected true or false, got {type_name(value)} {short_repr(value)}")
        return value
    if value is None and key != "fp8_format":
        return None
    if not isinstance(value, str) or value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise fail(f"expected one of {', '.join(choices)}; got {short_repr(value)}{hint}")
    return value


# The roles TE asks a custom recipe's quantizer factory about, for a linear layer.
CUSTOM_FACTORY_ROLES = ("linear_input", "linear_weight", "linear_output", "linear_grad_output",
                        "linear_grad_input")


def import_custom_factory(path: str, file: str | None, line: int | None) -> str:
    """Import `custom_recipe_factory` ('pkg.module.factory') as Megatron does and call it as TE
    does, once per linear-layer role; return what it gave, for the report.

    This runs code that the input names: the audit calls it only with --allow-import. Any
    failure is an input error (exit 2) naming the recipe.
    """
    import importlib

    def fail(message: str) -> InputError:
        return InputError(f"custom_recipe_factory {short_repr(path)}: {message}", file=file,
                          line=line, key="custom_recipe_factory")

    module_path, _, attr = path.rpartition(".")
    if not module_path or not all(part.isidentifier() for part in path.split(".")):
        raise fail("expected an import path like 'pkg.module.factory'")
    try:
        module = importlib.import_module(module_path)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the module does
        raise fail(f"cannot import '{module_path}': {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise fail(f"module '{module_path}' has no attribute '{attr}'")
    if not callable(factory):
        raise fail(f"'{attr}' is a {type(factory).__name__}, not a callable")
    produced = []
    for role in CUSTOM_FACTORY_ROLES:
        try:
            quantizer = factory(role)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            raise fail(f"raised {type(exc).__name__} for role '{role}': {exc}") from None
        name = "None" if quantizer is None else type(quantizer).__name__
        if name not in produced:
            produced.append(name)
    return f"imported and called; it returns {', '.join(produced)} for linear layers"
