"""What every audited model shares (upstream's LanguageModule): name and recipe binding,
the audited modules, re-arming and the loss. GPTModel and T5Model build their own trees."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from qaudit.load.config import ModelConfig
from qaudit.model import wrappers as w
from qaudit.plan.dims import Dims
from qaudit.plan.pipeline import chunk_prefix, pipeline_layout
from qaudit.model.session import Session
from qaudit.load.recipe import QuantRecipe

_DECODER_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.*)")


class LanguageModel(torch.nn.Module):
    def __init__(self, config: ModelConfig, dims: Dims, session: Session) -> None:
        super().__init__()
        self.config, self.dims, self.runtime = config, dims, session.runtime
        self.policy = session.policy
        # Where the runtime computes (TE modules: CUDA); build_model moves everything there.
        self.device = torch.device(getattr(session.runtime, "device", "cpu"))
        self._armed_modules: list[torch.nn.Module] | None = None

    def finish_init(self, recipe: QuantRecipe | None) -> None:
        """Bind names and recipes as each model chunk's walk does upstream: names are local to
        the chunk (`decoder.layers.<position in chunk>`), MTP and output on the last chunk."""
        layout = pipeline_layout(self.config)
        chunk_of_layer = {layer: chunk for chunk in layout for layer in chunk.layers}
        for fqn, module in self.named_modules():
            if not isinstance(module, w.AuditedModule):
                continue
            chunk, local = layout[-1], fqn
            match = _DECODER_LAYER.match(fqn)
            if match:
                chunk = chunk_of_layer[int(match.group(1))]
                local = f"decoder.layers.{int(match.group(1)) - chunk.first_layer}.{match.group(2)}"
            # Plain attributes, past nn.Module.__setattr__'s checks (tens of thousands of
            # modules with sequential experts).
            object.__setattr__(module, "stage", chunk.stage)
            object.__setattr__(module, "chunk", chunk.chunk)
            module.finish_init(chunk_prefix(chunk, self.config) + local, recipe, match_name=local)

    def audited_modules(self) -> list[w.AuditedModule]:
        return [m for m in self.modules() if isinstance(m, w.AuditedModule)]

    def set_is_first_microbatch(self) -> None:
        """Re-arm every module's flag, when the policy's predicate says so (§2.2)."""
        if not self.policy.rearms(self.config):
            return
        if self._armed_modules is None:
            # The flag is a plain attribute of the modules that have one: looked up in their
            # own dict (hasattr on a module without it raises through nn.Module.__getattr__,
            # a second per 70,000 modules).
            self._armed_modules = [m for m in self.modules() if "is_first_microbatch" in vars(m)]
        for module in self._armed_modules:
            module.is_first_microbatch = True

    @staticmethod
    def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.transpose(0, 1).reshape(-1, logits.shape[-1]), labels.reshape(-1))
