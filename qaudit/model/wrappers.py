"""Megatron's TE wrapper classes (docs/semantics.md §2.1), over any runtime's modules.

Each wrapper starts armed (`is_first_microbatch = True`), asks the tracking policy what to
pass, opens its own recipe context, calls the runtime module and then disarms itself: the
flag is consumed by every call, with or without grad.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from qaudit.load.config import ModelConfig
from qaudit.errors import InputError
from qaudit.plan.graphs import captured_armed, has_skip_flag, is_graphed
from qaudit.model.session import Session
from qaudit.plan.execution import resolve_execution
from qaudit.load.precision import Quant
from qaudit.load.recipe import Matcher, QuantConfig, QuantRecipe, TERecipe
from qaudit.runtime.protocol import GraphEmulating
from qaudit.runtime.te_rules import weight_cache_use
from qaudit.runtime.value_free import value_free_weight

# Stands for "some quantized ambient context" when only a yes/no is known.
_ANY_QUANT = Quant("fp8", "any")
# Sets a plain attribute (never a parameter, buffer or submodule) past nn.Module.__setattr__'s
# checks: done two or three times per call of every audited module.
_set_plain = object.__setattr__


class AuditedModule(torch.nn.Module):
    """A module that shows up as a row: TE wrappers and Megatron's own linear layers."""

    upstream_class = ""
    is_te = True

    def __init__(self, config: ModelConfig, session: Session) -> None:
        super().__init__()
        # Plain attributes are set past nn.Module.__setattr__ (no parameter or submodule among
        # them): models with sequential experts build tens of thousands of these modules.
        _set_plain(self, "config", config)
        _set_plain(self, "session", session)
        _set_plain(self, "fqn", "")  # unique row name: the chunk-local name, with a stage prefix if pipelined
        _set_plain(self, "match_name", "")  # the name recipes match: local to the model chunk
        _set_plain(self, "stage", 0)
        _set_plain(self, "chunk", 0)

    def _record(self, flag: bool | None, inner: torch.nn.Module | None,
                run: Callable[[], torch.Tensor], ambient: Quant | None = None,
                cache: str | None = None, graph: bool = False) -> torch.Tensor:
        recorder = self.session.recorder
        record = recorder.on_forward(self.fqn, flag, torch.is_grad_enabled(),
                                     self.session.runtime.current_quant(), self.training, ambient,
                                     cache=cache, graph=graph)
        target = inner if inner is not None else self
        _set_plain(target, "wgrad_listener", recorder.listener_for(record))
        try:
            out = run()
        finally:
            _set_plain(target, "wgrad_listener", None)
        # A runtime that observes TE's weight cache (the te runtime on the CPU stand-in)
        # replaces the rule's answer with what TE did.
        observed = getattr(target, "observed_cache", None)
        if observed is not None and record.cache is not None:
            record.cache = observed
        return out


class TEWrapper(AuditedModule):
    """Common behaviour of TELinear, TELayerNormColumnParallelLinear and TEGroupedLinear."""

    def __init__(self, inner: torch.nn.Module, config: ModelConfig, session: Session) -> None:
        super().__init__(config, session)
        self.inner = inner
        for name, value in (
                ("is_first_microbatch", True),
                ("disable_parameter_transpose_cache", config.disable_parameter_transpose_cache),
                ("matcher", None),  # Matcher | None
                ("quant_config", None),  # QuantConfig | None
                ("graphed", False),  # inside a per-layer CUDA graph (set by finish_init)
                # Decided at the first quantized forward (fp8_param/fp4_param:
                # docs/te-settings.md).
                ("primary_quantized_weight", None)):  # bool | None
            _set_plain(self, name, value)
        # Megatron passes delay_wgrad_compute to every TE linear but the TE LM head.
        if config.delay_wgrad_compute and self.upstream_class != "TELMHeadColumnParallelLinear":
            inner.enable_delay_wgrad_compute()

    def finish_init(self, fqn: str, recipe: QuantRecipe | None, match_name: str | None = None) -> None:
        """Bind name and recipe after construction, as GPTModel's walk does upstream; recipes
        see `match_name`, the name inside the model chunk."""
        _set_plain(self, "fqn", fqn)
        _set_plain(self, "match_name", match_name or fqn)
        _set_plain(self, "graphed", is_graphed(self.config, self.match_name))
        if recipe is not None:
            self.matcher = recipe.match(self.match_name)
            if self.matcher is not None:
                self.quant_config = recipe.config_for(self.matcher)

    def selected_recipe(self) -> TERecipe | None:
        if self.quant_config is None:
            return None
        return self.quant_config.recipe_for(self.training)

    def will_execute_quantized(self, is_context_quantized: bool) -> bool:
        ambient = _ANY_QUANT if is_context_quantized else None
        return resolve_execution(ambient, self.selected_recipe()) is not None

    def weights(self) -> list[torch.nn.Parameter]:
        return [p for name, p in self.inner.named_parameters() if name.startswith("weight")]

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        runtime = self.session.runtime
        ambient = runtime.current_quant()
        flag = self.session.policy.flag_to_pass(self, ambient is not None)
        recipe = self.selected_recipe()
        context = (runtime.autocast(resolve_execution(ambient, recipe)) if recipe is not None
                   else contextlib.nullcontext())
        graph = self.graphed and self.training
        skip, flag = self._graph_replay(flag, ambient) if graph else (None, flag)
        primary = self._primary_weight(ambient)
        if skip is not None:
            assert isinstance(runtime, GraphEmulating), "graphed configs run on the reference"
            replay = runtime.graph_replay(skip)
        else:
            replay = contextlib.nullcontext()
        with context, replay:
            seen = False if skip is not None else flag  # TE forces False under the skip flag
            out = self._record(seen, self.inner,
                               lambda: self.inner(x, *args, is_first_microbatch=flag), ambient,
                               cache=weight_cache_use(seen, primary, skip), graph=graph)
        _set_plain(self, "is_first_microbatch", False)
        return out

    def _graph_replay(self, flag: bool | None, ambient: Quant | None
                      ) -> tuple[bool | None, bool | None]:
        """(TE's skip-weight-update flag at this replay or None, the flag the graph was
        captured with) for a graphed module (qaudit/plan/graphs.py)."""
        microbatch = self.session.recorder.microbatch
        if has_skip_flag(self.config):
            return microbatch != 0, False
        armed = captured_armed(self.config, microbatch, self.session.te.graph_warmup_rearms)
        saved = self.is_first_microbatch
        self.is_first_microbatch = armed
        try:
            return None, self.session.policy.flag_to_pass(self, ambient is not None)
        finally:
            self.is_first_microbatch = saved

    def _primary_weight(self, ambient: Quant | None) -> bool:
        """Whether the weight is a primary quantized parameter: a bound recipe's init context
        decides (`fp8_param`/`fp4_param` of its training recipe), else the config's, which
        Megatron opens around the layers it runs quantized (not the TE output layer)."""
        if self.primary_quantized_weight is None:
            if self.quant_config is not None:
                chosen = self.quant_config.recipe_for(True)
                quant = chosen.quant
                primary = quant is not None and bool(
                    chosen.fp8_param if quant.fmt == "fp8" else chosen.fp4_param)
            else:
                primary = (bool(self.config.fp8_param or self.config.fp4_param)
                           and ambient is not None
                           and self.upstream_class != "TELMHeadColumnParallelLinear")
            self.primary_quantized_weight = primary
            if hasattr(self.inner, "primary_quantized_weight"):
                self.inner.primary_quantized_weight = primary
            elif primary:  # the te runtime builds plain TE modules (no quantized_model_init)
                raise InputError(f"{self.fqn}: --runtime te does not model primary quantized "
                                 "weights (a recipe's fp8_param/fp4_param) yet; use --runtime "
                                 "reference", file=self.config.file)
        return self.primary_quantized_weight


class TELinear(TEWrapper):
    upstream_class = "TELinear"


class TEColumnParallelLinear(TEWrapper):
    upstream_class = "TEColumnParallelLinear"


class TERowParallelLinear(TEWrapper):
    upstream_class = "TERowParallelLinear"


class TELayerNormColumnParallelLinear(TEWrapper):
    upstream_class = "TELayerNormColumnParallelLinear"


class TEColumnParallelGroupedLinear(TEWrapper):
    upstream_class = "TEColumnParallelGroupedLinear"


class TERowParallelGroupedLinear(TEWrapper):
    upstream_class = "TERowParallelGroupedLinear"


class TELMHeadColumnParallelLinear(TEWrapper):
    upstream_class = "TELMHeadColumnParallelLinear"


class ColumnParallelLinear(AuditedModule):
    """Megatron's non-TE linear (the usual output layer; every linear of the modelopt spec):
    with fusion it always accumulates. Never bound to a recipe, never quantized by TE."""

    upstream_class = "ColumnParallelLinear"
    is_te = False
    fused_wgrad = True  # Megatron's own linears fuse wgrad accumulation when the config does

    def __init__(self, in_features: int, out_features: int, config: ModelConfig,
                 session: Session, own_weight: bool = True) -> None:
        super().__init__(config, session)
        _set_plain(self, "fuse", config.gradient_accumulation_fusion and self.fused_wgrad)
        _set_plain(self, "wgrad_listener", None)
        if own_weight and not session.values_read:
            weight = value_free_weight(out_features, in_features)
        elif own_weight:
            weight = torch.nn.Parameter(torch.empty(out_features, in_features))
            torch.nn.init.normal_(weight, std=in_features ** -0.5)
        else:
            weight = None
        # Registered as nn.Module.register_parameter would, without its check that no other
        # attribute is named `weight` (a failing hasattr through nn.Module.__getattr__: a
        # second per 50,000 modules); this fresh module has none.
        self._parameters["weight"] = weight

    def weights(self) -> list[torch.nn.Parameter]:
        return [self.weight] if self.weight is not None else []

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        weight = self.weight if weight is None else weight

        def run() -> torch.Tensor:
            return self.session.runtime.plain_gemm(x, weight, fuse=self.fuse,
                                                   listener=self.wgrad_listener)

        # A TE autocast around it (a decoder layer's) does not reach a plain matmul.
        with self.session.runtime.autocast(None):
            return self._record(None, None, run)

    def finish_init(self, fqn: str, recipe: QuantRecipe | None, match_name: str | None = None) -> None:
        _set_plain(self, "fqn", fqn)  # never bound: not a TE module
        _set_plain(self, "match_name", match_name or fqn)


class RowParallelLinear(ColumnParallelLinear):
    upstream_class = "RowParallelLinear"


class ModelOptLinear(ColumnParallelLinear):
    """The modelopt spec's `Linear` (a torch.nn.Linear): autograd writes `.grad`, which
    Megatron's DDP then adds into main_grad; no fused accumulation."""

    upstream_class = "Linear"
    fused_wgrad = False
