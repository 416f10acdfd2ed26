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
import re
from dataclasses import dataclass, field

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
    # A MODEL_ARGS file: which training script the functional-test runner hands it to, in
    # words, when the file's location and MODE say it is one whose parser is Megatron's (with
    # `extra_options`, what that script's extra-args provider adds). None otherwise.
    runner: str | None = None
    extra_options: frozenset[str] = field(default_factory=frozenset)

    @property
    def name(self) -> str | None:
        """The entry script's file name, when the file says it."""
        if self.script is None:
            return None
        base = self.script.rsplit("/", 1)[-1]
        return None if HOLE in base or not base else base

    @property
    def parser_owner(self) -> str | None:
        """The script whose parser reads the flags, as a message names it."""
        return self.name or self.runner

    @property
    def builds_gpt(self) -> bool:
        """A known GPT/hybrid training script: `--encoder-num-layers` is only a layer count."""
        return self.name in GPT_SCRIPTS

    @property
    def parser_is_megatrons(self) -> bool:
        """The entry script parses with Megatron's own parser only: unknown options fail."""
        if self.runner is not None:
            return True
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


# Functional-test groups (`tests/functional_tests/test_cases/<group>/`) whose recipes start a
# script that adds options of its own (Megatron-LM d98e8a64, tests/test_utils/recipes/h100/):
# multimodal-llava runs pretrain_vlm.py, mimo examples/mimo/train.py.
OWN_PARSER_GROUPS = frozenset({"multimodal-llava", "mimo"})
# `MODE`s whose scripts add options of their own: inference (examples/inference/...) and rl
# (train_rl.py). No MODE, or `pretraining`, runs pretrain_gpt.py, pretrain_hybrid.py,
# pretrain_t5.py or pretrain_bert.py.
TRAINING_MODES = (None, "pretraining")
# megatron/elastification/pretrain_hybrid_flex.py (the flextron recipe's script) adds these
# with add_flextron_args (megatron/elastification/arguments.py, Megatron-LM d98e8a64): option
# names only. A MODEL_ARGS file that sets --flextron is run by that script.
FLEXTRON_OPTIONS = frozenset("""
--distillation --distill-coeff --distill-only --flextron --binary-mask --slice --enable-router
--add-skipping --no-attn-skip --lr-mult-router --flex-strict --is-flex-eval --freeze-router
--freeze-model --flex-hetero-ffn --flex-hetero-mamba --flex-hetero-moe-expert --router-std
--normalize-router-logits --soft-mask --budget-probs --prefill-chunk-size --mem-infer-seq-len
--mem-batch-size --original-model-sample-prob --force-router-skip --force-mlp --force-mamba
--force-emb --skip-num-attn-layer-constraint --skip-total-layer-constraint --disable-budget
--curr-iteration --hard-sample-th --router-beta --loss-alpha --tau-init --tau-decay
--router-inter-dim --linear-scaler-start --linear-scaler-end --override-selected-budget
--router-gbs --budget-list --mamba-per-list --mlp-per-list --emb-per-list --moe-expert-per-list
--mamba-int-list --mlp-int-list --emb-int-list --moe-expert-int-list --budget-type
--memory-profile --memory-profile-path --bpe-params --bpe-kv-cache --bpe-ssm-cache
--bpe-max-buffer --param-budget-target --layer-ranking-list --log-budgets --basemodel-type
--flextron-config-file""".split())
_GROUP = re.compile(r"(?:test_cases/([^/]+)/[^/]+/[^/]+$)|(?:(?:^|/)([^/]+?)__[^/]+$)")


def functional_test_group(file: str) -> str | None:
    """The functional-test group a MODEL_ARGS file belongs to, from its location: upstream's
    `test_cases/<group>/<name>/model_config.yaml`, or a copy flattened to `<group>__<name>`."""
    match = _GROUP.search(os.path.abspath(file).replace(os.sep, "/"))
    return (match.group(1) or match.group(2)) if match else None


def model_args_entry(file: str, mode: str | None, flags: set[str]) -> Entry:
    """The entry point of a MODEL_ARGS file (which names no script): held to Megatron's
    training parser unless its MODE or group runs a script with options of its own."""
    if mode not in TRAINING_MODES or functional_test_group(file) in OWN_PARSER_GROUPS:
        return Entry(None, None, file)
    if "--flextron" in flags:
        return Entry(None, None, file, "pretrain_hybrid_flex.py (it sets --flextron)",
                     FLEXTRON_OPTIONS)
    return Entry(None, None, file, "the functional-test runner's training script "
                 "(pretrain_gpt.py, pretrain_hybrid.py, pretrain_t5.py or pretrain_bert.py)")
