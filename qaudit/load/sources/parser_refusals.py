"""Options Megatron's own argument parser refuses at start-up (docs/launch-scripts.md).

Megatron's entry points build their parser with `allow_abbrev=False` (megatron/training/
arguments.py::parse_args), so an option must be written in full: `--num-layer` is not a prefix
of `--num-layers`, it is unrecognized, and `parse_args` exits before any work. qaudit refuses
the same options for those entry points (exit 2), naming the nearest real option.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from qaudit.errors import InputError
from qaudit.load.sources.modelopt_flags import MODELOPT_FLAGS, known_modelopt_flag
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS

if TYPE_CHECKING:
    from qaudit.load.sources.flag_state import FlagState


def is_parser_option(flag: str, modelled: dict, extra: frozenset[str] = frozenset()) -> bool:
    """An option of Megatron's training parser (with ModelOpt's, which pretrain_gpt.py adds
    when ModelOpt is installed, and `extra`, what the entry point's own provider adds)."""
    return flag in UPSTREAM_FLAGS or flag in extra or flag in modelled or known_modelopt_flag(flag) \
        or flag == "--help"  # argparse's own (add_help is on)


def nearest_option(flag: str, extra: frozenset[str] = frozenset()) -> str | None:
    """The real option closest in spelling, as a suggestion (None when nothing is close)."""
    options = sorted(set(UPSTREAM_FLAGS) | set(MODELOPT_FLAGS) | extra)
    match = difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
    return match[0] if match else None


def refuse_unknown_options(t: FlagState) -> None:
    """For an entry script whose parser is Megatron's, the first unknown option is exit 2."""
    if not t.entry.parser_is_megatrons:
        return
    unknown = [o for o in t.last.values()
               if not is_parser_option(o.flag, t.modelled, t.entry.extra_options)]
    if not unknown:
        return
    first = min(unknown, key=lambda o: o.line or 0)
    nearest = nearest_option(first.flag, t.entry.extra_options)
    hint = f"; did you mean {nearest}?" if nearest else ""
    raise InputError(f"not an option of Megatron's argument parser, which {t.entry.parser_owner} uses: "
                     f"it stops at start-up with 'unrecognized arguments: {first.flag}' (options "
                     f"must be written in full, the parser takes no abbreviations){hint}",
                     file=t.file, line=first.line, key=first.flag)
