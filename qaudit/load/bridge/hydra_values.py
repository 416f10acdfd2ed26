"""Values a Bridge config can hold that no YAML writer would, read as upstream runs them.

Bridge applies overrides on an untyped OmegaConf copy of the config
(`training/utils/omegaconf_utils.py`: `OmegaConf.create` of a plain dict, Hydra's override
parser, `OmegaConf.to_container`, then `_apply_overrides` sets each value with `setattr`): no
field's type converts anything. Hydra's grammar reads `true`/`false` as booleans but `yes`,
`no`, `on`, `off` as strings, so `model.mtp_use_repeated_layer=yes` puts the string 'yes' on
the provider, and a dump written after it holds the string too. What Megatron then does with
it decides:

- a boolean field is only ever tested for its truth (`if config.mtp_use_repeated_layer:`, in
  megatron-core 0.19.2 gpt_layer_specs.py:779 and multi_token_prediction.py:1741), so a
  non-empty string is true (`'no'` too) and the empty string false: audited that way, with a
  header line naming the value and where it was set;
- `mtp_num_layers` empty: Bridge's `mtp_block_spec` (gpt_provider.py) builds MTP only when the
  field is truthy, so '' is no MTP, as unset;
- a float count (`mtp_num_layers=1e0`, `num_moe_experts=1.28e2`; Hydra reads both as floats)
  fails in Megatron's model build or first step: refused with where.
"""

from __future__ import annotations

from typing import Any

from qaudit.errors import InputError
from qaudit.load.field_checks import boolean
from qaudit.load.upstream_checks import CHECKED_FIELDS
from qaudit.load.yamlio import YamlMap

Where = tuple[str, "int | None"]

# Where megatron-core 0.19.2 fails on a float count (the first use the model build reaches).
FLOAT_FAILURES = {
    "mtp_num_layers": (
        "megatron-core 0.19.2 fails on a float MTP depth count: gpt_layer_specs.py:782 "
        "(`[mtp_layer_spec] * mtp_num_layers`: TypeError, can't multiply sequence by "
        "non-int) builds the block, and multi_token_prediction.py:840 (`range("
        "config.mtp_num_layers)`) runs every step"),
    "num_moe_experts": (
        "megatron-core 0.19.2 fails on a float expert count: moe/router.py:62 (`torch.empty(("
        "config.num_moe_experts, hidden_size))`: TypeError) builds the router"),
}


def _boolean_fields() -> frozenset[str]:
    from qaudit.load.config import _CHECKS

    return frozenset(key for key, check in _CHECKS.items() if check is boolean) | frozenset(
        key for key, (kind, _) in CHECKED_FIELDS.items() if kind == "bool")


def _text(value: Any) -> str:
    return "true" if value else "false"


def as_upstream_runs(document: YamlMap, display: str, origins: dict[str, Where]) -> list[str]:
    """Rewrite the model's values as Megatron runs them (see the module doc); the header lines
    saying so. Raises InputError for a value whose model build fails."""
    model = document.get("model")
    if not isinstance(model, YamlMap):
        return []
    remarks: list[str] = []
    booleans = _boolean_fields()
    for key in list(model):
        value = model[key]
        if not isinstance(key, str):
            continue
        file, line = origins.get(f"model.{key}", (display, model.line_of(key)))
        at = f"{file}{':' + str(line) if line else ''}"
        if key in booleans and isinstance(value, str):
            model[key] = bool(value)
            remarks.append(f"model.{key}={value!r} ({at}): Hydra and Bridge keep the string, "
                           "and Megatron only tests the field's truth, so it runs as "
                           f"{_text(value)}; audited as {_text(value)}")
        elif key == "mtp_num_layers" and value == "":
            model[key] = None
            remarks.append(f"model.mtp_num_layers='' ({at}): an empty value; Bridge's "
                           "mtp_block_spec builds MTP only for a truthy count, so the run has "
                           "no MTP; audited as unset")
        elif key in FLOAT_FAILURES and isinstance(value, float):
            raise InputError(f"{value!r} is a float (Hydra reads it as one, and Bridge sets it "
                             f"as is): {FLOAT_FAILURES[key]}; write an integer",
                             file=file, line=line, key=f"model.{key}")
    return remarks
