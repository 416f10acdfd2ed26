"""GPTModel with Megatron's module tree: embedding, decoder, MTP block, output layer.

A hybrid model (HybridModel upstream) has the same tree: its decoder and MTP layers come from
the pattern (`hybrid_layers`), and its output layer is always Megatron's own.

Ambient precision is opened where Megatron opens it (docs/semantics.md §4): per decoder layer, per
MTP layer, around a TE output layer. The MTP block and the output layer run once per depth,
in upstream order: MTP depths first, then the output layer for each depth, then the main logits.
"""

from __future__ import annotations

import torch

from qaudit.load.config import ModelConfig
from qaudit.model import wrappers as w
from qaudit.plan.dims import Dims
from qaudit.families import part_of
from qaudit.families.hybrid.layers import HybridStack, hybrid_layers
from qaudit.model.language_model import LanguageModel
from qaudit.model.layers import Builder, TransformerLayer
from qaudit.plan.pipeline import is_pipelined
from qaudit.model.recompute import checkpointed
from qaudit.model.session import Session
from qaudit.plan.execution import (decoder_layer_ambient, hybrid_mtp_layer_ambient, mtp_ambient,
                         output_layer_ambient, te_output_layer_enabled)
from qaudit.load.recipe import QuantRecipe

MTP_LOSS_SCALING_FACTOR = 0.1


class TransformerBlock(torch.nn.Module):
    """The decoder: GPT's TransformerBlock, or a hybrid model's HybridStack (the same loop:
    per-layer ambient on the global index, full recompute per layer)."""

    def __init__(self, b: Builder) -> None:
        super().__init__()
        self.config, self.runtime = b.config, b.session.runtime
        pattern = b.config.hybrid_pattern()
        self.layers = torch.nn.ModuleList(
            hybrid_layers(b, pattern.main) if pattern is not None
            else [TransformerLayer(b, moe) for moe in b.config.moe_layer_pattern()])
        self.final_layernorm = torch.nn.LayerNorm(b.dims.hidden)
        self.recompute = b.config.recomputed_layers(len(self.layers))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.final_layernorm(self.run_layers(h, range(len(self.layers))))

    def run_layers(self, h: torch.Tensor, indices: range) -> torch.Tensor:
        """The decoder layers of one model chunk (global indices), without the final norm."""
        for index in indices:
            layer = self.layers[index]
            with self.runtime.autocast(decoder_layer_ambient(self.config, index)):
                if self.recompute[index] and self.training:
                    h = checkpointed(layer, self.runtime, h)
                else:
                    h = layer(h)
        return h


class MultiTokenPredictionLayer(torch.nn.Module):
    def __init__(self, b: Builder) -> None:
        super().__init__()
        hidden = b.dims.hidden
        self.enorm = torch.nn.LayerNorm(hidden)
        self.hnorm = torch.nn.LayerNorm(hidden)
        pattern = b.config.hybrid_pattern()
        if pattern is None:
            # GPT's MTP block comes from the TE decoder specs even when the decoder uses the
            # modelopt spec (post_training/model_builder.py).
            b = b.with_spec("te")
        self.eh_proj = b.column(2 * hidden, hidden)
        if pattern is not None:
            # Hybrid: a stack of the pattern's MTP layers (`mtp_model_layer.layers.J`).
            self.mtp_model_layer = HybridStack(
                b, pattern.mtp, lambda index: hybrid_mtp_layer_ambient(b.config, index))
        else:
            # GPT: one layer following the spec of the decoder's last layer.
            self.mtp_model_layer = TransformerLayer(b, b.config.mtp_moe_layers()[0])
        self.final_layernorm = torch.nn.LayerNorm(hidden)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        h = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        return self.final_layernorm(self.mtp_model_layer(h))


class MultiTokenPredictionBlock(torch.nn.Module):
    def __init__(self, b: Builder) -> None:
        super().__init__()
        config = b.config
        self.config, self.runtime = config, b.session.runtime
        self.depths = config.mtp_depths
        count = 1 if config.mtp_use_repeated_layer else self.depths
        self.layers = torch.nn.ModuleList(MultiTokenPredictionLayer(b) for _ in range(count))
        # Megatron recomputes MTP layers under full recompute with the uniform method.
        self.recompute = config.recompute_granularity == "full" and config.recompute_method == "uniform"

    def forward(self, hidden: torch.Tensor, embed_shifted) -> list[torch.Tensor]:
        outputs = []
        for depth in range(1, self.depths + 1):
            layer = self.layers[0 if len(self.layers) == 1 else depth - 1]
            with self.runtime.autocast(mtp_ambient(self.config)):
                if self.recompute and self.training:
                    hidden = checkpointed(layer, self.runtime, hidden, embed_shifted(depth))
                else:
                    hidden = layer(hidden, embed_shifted(depth))
            outputs.append(hidden)
        return outputs


class GPTModel(LanguageModel):
    def __init__(self, config: ModelConfig, dims: Dims, session: Session) -> None:
        super().__init__(config, dims, session)
        b = Builder(config, dims, session)
        self.embedding = torch.nn.Module()
        self.embedding.word_embeddings = torch.nn.Embedding(dims.vocab, dims.hidden)
        self.decoder = TransformerBlock(b)
        self.mtp = MultiTokenPredictionBlock(b) if config.mtp_depths else None
        if te_output_layer_enabled(config):
            self.output_layer = b.linear(w.TELMHeadColumnParallelLinear, dims.hidden, dims.vocab)
        else:
            # With pipelining the last stage holds its own copy of a tied weight.
            tied_here = config.share_embeddings_and_output_weights and not is_pipelined(config)
            self.output_layer = w.ColumnParallelLinear(dims.hidden, dims.vocab, config, session,
                                                       own_weight=not tied_here)
        if config.share_embeddings_and_output_weights and not is_pipelined(config):
            # Megatron marks the tied weight so that DDP adds the embedding's own gradient
            # beside what the fused output-layer wgrad wrote (docs/semantics.md §1.3).
            self.embedding.word_embeddings.weight.zero_out_wgrad = True

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if isinstance(self.output_layer, w.ColumnParallelLinear):
            tied = self.embedding.word_embeddings.weight if self.output_layer.weight is None else None
            return self.output_layer(hidden, tied)
        with self.runtime.autocast(output_layer_ambient(self.config)):
            return self.output_layer(hidden)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """tokens, labels: [batch, seq]; returns the training loss."""
        return self.head(self.decoder(self.embed(tokens)), tokens, labels)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[batch, seq] tokens -> [seq, batch, hidden], Megatron's layout."""
        return self.embedding.word_embeddings(tokens).transpose(0, 1).contiguous()

    def head(self, hidden: torch.Tensor, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """What the last stage runs after the decoder's final norm: MTP, logits, loss."""
        def embed_shifted(depth: int) -> torch.Tensor:
            return self.embed(torch.roll(tokens, -depth, dims=1))

        mtp_hidden = self.mtp(hidden, embed_shifted) if self.mtp is not None else []
        mtp_losses = [self._loss(self._logits(h), torch.roll(labels, -depth, dims=1))
                      for depth, h in enumerate(mtp_hidden, start=1)]
        loss = self._loss(self._logits(hidden), labels)
        if mtp_losses:
            loss = loss + MTP_LOSS_SCALING_FACTOR * torch.stack(mtp_losses).mean()
        return loss


def build_model(config: ModelConfig, dims: Dims, session: Session,
                recipe: QuantRecipe | None, seed: int = 0) -> LanguageModel:
    """A GPTModel (hybrid included: the same tree), or the model class of the config's family
    where it has its own (T5)."""
    family = part_of(config, "model")
    torch.manual_seed(seed)
    model_class = family.MODEL if family is not None else GPTModel
    if getattr(session.runtime, "device", "cpu") == "meta":
        # --full-size: real widths, no storage; the forward and backward run on shapes alone.
        with torch.device("meta"):
            model = model_class(config, dims, session)
    else:
        model = model_class(config, dims, session)
    model.finish_init(recipe)
    # Built on CPU (same seeded weights on every device), then moved to the runtime's device;
    # TE modules are created on CUDA already. On the CPU there is nothing to move (and the
    # walk over every tensor costs a second per 50,000 modules).
    return model if model.device.type == "cpu" else model.to(model.device)
