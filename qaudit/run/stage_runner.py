"""One pipeline stage of a model, run in its own process beside its neighbours.

Every rank builds the same seeded model, then drops the modules of the other stages, so the
weights match a single-process run. A microbatch passes the model chunks in layout order:
a rank receives the previous chunk's activation, runs its chunk and sends the result on; the
backward runs the chunks in reverse, gradients travelling back the same way. The schedule is
all-forward-then-backward per microbatch: per module, the order of calls (and so the flag
each call sees and each backward's accumulation) is the same as under 1F1B.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from qaudit.model.gpt import GPTModel
from qaudit.plan.pipeline import ModelChunk, pipeline_layout
from qaudit.run.train import step_gradient


class StageRunner:
    def __init__(self, model: GPTModel, stage: int) -> None:
        self.model, self.stage = model, stage
        self.layout = pipeline_layout(model.config)
        self.last_stage = self.layout[-1].stage
        # The last stage keeps a copy of the embedding for the MTP block; the copies sum their
        # gradients before each update, as Megatron's embedding group does.
        embedding_stages = sorted({0, self.last_stage} if model.mtp is not None else {0})
        self._embedding_group = dist.new_group(embedding_stages) if len(embedding_stages) > 1 else None
        self._keeps_embedding = stage in embedding_stages
        self._wire_dtype = model.decoder.final_layernorm.weight.dtype
        self._drop_other_stages()

    def _drop_other_stages(self) -> None:
        model, mine = self.model, self._positions()
        kept = {layer for position in mine for layer in self.layout[position].layers}
        for index in range(len(model.decoder.layers)):
            if index not in kept:
                model.decoder.layers[index] = torch.nn.Identity()
        if self.stage != self.last_stage:
            model.mtp = None
            model.output_layer = None
        if not self._keeps_embedding:
            model.embedding.word_embeddings = None

    def _positions(self) -> list[int]:
        return [i for i, chunk in enumerate(self.layout) if chunk.stage == self.stage]

    def _activation(self) -> torch.Tensor:
        """A buffer for one activation or its gradient. Messages travel in the residual
        stream's dtype (the norms' own, on every stage), so both ends agree on the size."""
        d = self.model.dims
        return torch.empty(d.seq_length, d.micro_batch_size, d.hidden, device=self.model.device,
                           dtype=self._wire_dtype)

    def _chunk_forward(self, position: int, chunk: ModelChunk, tokens: torch.Tensor,
                       labels: torch.Tensor, grad: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(received input or None, this chunk's output: an activation, or the loss)."""
        model = self.model
        received = None
        if position == 0:
            hidden = model.embed(tokens)
        else:
            received = self._activation()
            dist.recv(received, src=self.layout[position - 1].stage)
            hidden = received.requires_grad_(grad)
        hidden = model.decoder.run_layers(hidden, chunk.layers)
        if position == len(self.layout) - 1:
            return received, model.head(model.decoder.final_layernorm(hidden), tokens, labels)
        dist.send(hidden.detach().to(self._wire_dtype).contiguous(),
                  dst=self.layout[position + 1].stage)
        return received, hidden

    def train_microbatch(self, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        done = [(position, *self._chunk_forward(position, self.layout[position], tokens, labels,
                                                grad=True))
                for position in self._positions()]
        for position, received, output in reversed(done):
            if position == len(self.layout) - 1:
                output.backward()
            else:
                grad = self._activation()
                dist.recv(grad, src=self.layout[position + 1].stage)
                output.backward(grad.to(output.dtype))
            if received is not None:
                dist.send(received.grad.to(self._wire_dtype).contiguous(),
                          dst=self.layout[position - 1].stage)

    def forward_only(self, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        for position in self._positions():
            self._chunk_forward(position, self.layout[position], tokens, labels, grad=False)

    def sum_embedding_grads(self, params: list[torch.nn.Parameter]) -> None:
        if self._embedding_group is None or not self._keeps_embedding:
            return
        for param in self.model.embedding.parameters():
            dist.all_reduce(step_gradient(param), group=self._embedding_group)
