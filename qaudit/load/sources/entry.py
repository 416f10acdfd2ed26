"""Which Megatron entry point runs the flags, as far as the file says (docs/upstream-model.md).

The same flags build different models depending on the script that parses them:
`pretrain_t5.py` builds a T5Model from `--encoder-num-layers`, while `pretrain_gpt.py` only
takes that flag as `--num-layers` (validate_args); the scripts of
`examples/post_training/modelopt/` build ModelOpt's layer spec. A launch script names its entry
script; an argument file (no launch, e.g. `examples/post_training/modelopt/conf/<model>.sh`)
and a MODEL_ARGS file do not, and then only the file's own location can tell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from qaudit.load.sources.argv import HOLE
from qaudit.load.sources.tokens import Word

# Scripts at the root of Megatron-LM that parse the training flags and build a GPTModel or a
# HybridModel (never a T5Model).
GPT_SCRIPTS = frozenset({"pretrain_gpt.py", "pretrain_hybrid.py", "pretrain_mamba.py"})
T5_SCRIPT = "pretrain_t5.py"
# Entry points whose parser is Megatron's own (`parse_and_validate_args` with no extra
# arguments, or only ModelOpt's, which qaudit knows): argparse there, built with
# allow_abbrev=False, refuses any other option at start-up. pretrain_vlm.py and train_rl.py
# add their own options, so an option qaudit does not know may be theirs.
MEGATRON_PARSER_SCRIPTS = GPT_SCRIPTS | {T5_SCRIPT, "pretrain_bert.py"}
# The ModelOpt examples' folder; every script there builds with modelopt_gpt_hybrid_builder.
MODELOPT_DIR = "post_training/modelopt/"


@dataclass(frozen=True)
class Entry:
    script: str | None  # the entry script as written (unknown parts as HOLE); None: no launch
    line: int | None  # the launch's line
    file: str  # the audited file's path, as given

    @property
    def name(self) -> str | None:
        """The entry script's file name, when the file says it."""
        if self.script is None:
            return None
        base = self.script.rsplit("/", 1)[-1]
        return None if HOLE in base or not base else base

    @property
    def builds_gpt(self) -> bool:
        """A known GPT/hybrid training script: `--encoder-num-layers` is only a layer count."""
        return self.name in GPT_SCRIPTS

    @property
    def parser_is_megatrons(self) -> bool:
        """The entry script parses with Megatron's own parser only: unknown options fail."""
        return self.name in MEGATRON_PARSER_SCRIPTS and self.modelopt_location() is None

    def modelopt_location(self) -> str | None:
        """Why the ModelOpt builder runs, if the script's or the file's location says so."""
        if self.script is not None:
            if MODELOPT_DIR in self.script.replace(HOLE, ""):
                return f"the entry script {self.name or self.script} is one of Megatron's ModelOpt examples"
            return None
        # An argument file: the ModelOpt examples source `conf/<org>/<model>.sh`. A copy whose
        # path was flattened with '__' for '/' (as in the project's test corpus) counts too.
        path = os.path.abspath(self.file).replace(os.sep, "/")
        if MODELOPT_DIR in path or MODELOPT_DIR.replace("/", "__") in path:
            return "the file is an argument file of Megatron's ModelOpt examples"
        return None


def entry_of(script: Word | None, file: str) -> Entry:
    return Entry(script.text if script is not None else None,
                 script.line if script is not None else None, file)
