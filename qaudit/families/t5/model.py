"""T5Model with Megatron's module tree: embedding, encoder, decoder, LM head (docs/t5.md).

Per microbatch the encoder runs once and its output feeds every decoder layer's
`cross_attention.linear_kv`, so each TE module is called once per microbatch and the encoder's
gradient is the sum over the decoder layers. T5LMHead holds Megatron's own
ColumnParallelLinear (`lm_head.output_layer`), tied to the word embeddings unless untied.
"""

from __future__ import annotations

import torch

from qaudit.load.config import ModelConfig
from qaudit.load.recipe import QuantRecipe
from qaudit.model import wrappers as w
from qaudit.plan.dims import Dims
from qaudit.model.language_model import LanguageModel
from qaudit.model.layers import Builder
from qaudit.model.session import Session
from qaudit.families.t5.layers import T5Block, T5DecoderLayer, T5EncoderLayer


class T5Model(LanguageModel):
    def __init__(self, config: ModelConfig, dims: Dims, session: Session) -> None:
        super().__init__(config, dims, session)
        b = Builder(config, dims, session)
        self.embedding = torch.nn.Module()
        self.embedding.word_embeddings = torch.nn.Embedding(dims.vocab, dims.hidden)
        # T5's default learned_absolute position embeddings (not TE: no row).
        self.embedding.position_embeddings = torch.nn.Embedding(dims.seq_length, dims.hidden)
        self.encoder = T5Block(b, [T5EncoderLayer(b) for _ in range(config.encoder_num_layers)])
        self.decoder = T5Block(b, [T5DecoderLayer(b) for _ in range(config.num_layers)])
        tied = config.share_embeddings_and_output_weights
        self.lm_head = torch.nn.Module()
        self.lm_head.output_layer = w.ColumnParallelLinear(dims.hidden, dims.vocab, config,
                                                           session, own_weight=not tied)
        if tied:
            # One stage holds both uses of the weight: Megatron marks it (docs/semantics.md §1.3).
            self.embedding.word_embeddings.weight.zero_out_wgrad = True

    def finish_init(self, recipe: QuantRecipe | None) -> None:
        """Names only: upstream's T5Model has no finish_init walk (megatron-core 0.19.2,
        megatron/core/models/T5/t5_model.py), so no module is bound to a recipe config and a
        quant recipe changes nothing in a T5 model (docs/t5.md; --cross-check showed it)."""
        super().finish_init(None)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[batch, seq] tokens -> [seq, batch, hidden]: word plus position embeddings."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        embedded = self.embedding.word_embeddings(tokens) + self.embedding.position_embeddings(positions)
        return embedded.transpose(0, 1).contiguous()

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The encoder reads `tokens`, the decoder the same tokens shifted right (teacher
        forcing); returns the decoder's training loss."""
        context = self.encoder(self.embed(tokens))
        hidden = self.decoder(self.embed(torch.roll(tokens, 1, dims=1)), context)
        output_layer = self.lm_head.output_layer
        tied = self.embedding.word_embeddings.weight if output_layer.weight is None else None
        return self._loss(output_layer(hidden, tied), labels)


MODEL = T5Model  # the family's model class (qaudit.families.protocols.FamilyModel)
