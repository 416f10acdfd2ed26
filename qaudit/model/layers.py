"""One transformer layer with Megatron's module names (docs/semantics.md §5).

Only the linear layers are audited; attention math, routing and activations are plain torch
so that the calls and gradients flowing through the TE modules are realistic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qaudit.load.config import ModelConfig
from qaudit.model import wrappers as w
from qaudit.plan.dims import Dims
from qaudit.model.identical import ExpertClass, expert_classes
from qaudit.model.mla import FusedMLASelfAttention, MLASelfAttention
from qaudit.model.recompute import checkpointed
from qaudit.model.session import Session


def _activation(x: torch.Tensor, gated: bool) -> torch.Tensor:
    if gated:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(x)


class Builder:
    """Makes wrapped runtime modules for one model, with the classes of its layer spec.

    `spec` "te" is Megatron's TE spec; "modelopt" is ModelOpt's spec, which builds Megatron's
    own linears (ColumnParallelLinear, RowParallelLinear, modelopt's `Linear`) with separate
    norms and sequential experts (docs/upstream-model.md, "The modelopt spec").
    """

    def __init__(self, config: ModelConfig, dims: Dims, session: Session,
                 spec: str | None = None) -> None:
        self.config, self.dims, self.session = config, dims, session
        self.fuse = config.gradient_accumulation_fusion
        self.spec = spec or config.layer_spec

    def with_spec(self, spec: str) -> Builder:
        """The same model's builder for another spec (GPT's MTP block is always TE's)."""
        return self if spec == self.spec else Builder(self.config, self.dims, self.session, spec)

    @property
    def is_te(self) -> bool:
        return self.spec == "te"

    def linear(self, cls: type[w.TEWrapper], n_in: int, n_out: int) -> w.TEWrapper:
        return cls(self.session.runtime.linear(n_in, n_out, fuse=self.fuse), self.config, self.session)

    def layernorm_linear(self, n_in: int, n_out: int) -> w.TEWrapper:
        inner = self.session.runtime.layernorm_linear(n_in, n_out, fuse=self.fuse)
        return w.TELayerNormColumnParallelLinear(inner, self.config, self.session)

    def grouped(self, cls: type[w.TEWrapper], n_gemms: int, n_in: int, n_out: int) -> w.TEWrapper:
        inner = self.session.runtime.grouped_linear(n_gemms, n_in, n_out, fuse=self.fuse)
        return cls(inner, self.config, self.session)

    def _mcore(self, cls: type[w.ColumnParallelLinear], n_in: int, n_out: int) -> w.AuditedModule:
        return cls(n_in, n_out, self.config, self.session)

    # Roles: each asks for what the spec builds there. Where the TE spec fuses a norm into a
    # linear, the modelopt spec has a separate norm module, which is not audited and left out.
    def column(self, n_in: int, n_out: int) -> w.AuditedModule:
        return self.linear(w.TEColumnParallelLinear, n_in, n_out) if self.is_te \
            else self._mcore(w.ColumnParallelLinear, n_in, n_out)

    def norm_column(self, n_in: int, n_out: int) -> w.AuditedModule:
        """A column-parallel linear after a norm (linear_qkv, mlp.linear_fc1, in_proj)."""
        return self.layernorm_linear(n_in, n_out) if self.is_te \
            else self._mcore(w.ColumnParallelLinear, n_in, n_out)

    def row(self, n_in: int, n_out: int) -> w.AuditedModule:
        return self.linear(w.TERowParallelLinear, n_in, n_out) if self.is_te \
            else self._mcore(w.RowParallelLinear, n_in, n_out)

    def down_projection(self, n_in: int, n_out: int) -> w.AuditedModule:
        """MLA's q/kv down projections: not tensor-parallel (TELinear, 'duplicated')."""
        return self.linear(w.TELinear, n_in, n_out) if self.is_te \
            else self._mcore(w.ModelOptLinear, n_in, n_out)

    def up_projection(self, n_in: int, n_out: int, norm: bool) -> w.AuditedModule:
        """A column-parallel projection, with its input norm fused in when `norm` (TE spec)."""
        return self.norm_column(n_in, n_out) if norm else self.column(n_in, n_out)

    def grouped_experts(self, requested: bool) -> bool:
        """Whether MoE experts are one grouped module: the modelopt spec always builds
        SequentialMLP."""
        return requested and self.is_te


class SelfAttention(torch.nn.Module):
    def __init__(self, b: Builder, causal: bool = True) -> None:
        """`causal`: False for a T5 encoder (its spec uses a padding mask)."""
        super().__init__()
        d = b.dims
        self.dims, self.causal = d, causal
        self.linear_qkv = b.norm_column(d.hidden, d.qkv_out)
        self.linear_proj = b.row(d.heads * d.kv_channels, d.hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        d = self.dims
        s, batch, _ = h.shape
        qkv = self.linear_qkv(h)
        q, k, v = qkv.split([d.heads * d.kv_channels, d.query_groups * d.kv_channels,
                             d.query_groups * d.kv_channels], dim=-1)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.reshape(s, batch, n, d.kv_channels).permute(1, 2, 0, 3)

        q, k, v = heads(q, d.heads), heads(k, d.query_groups), heads(v, d.query_groups)
        repeat = d.heads // d.query_groups
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, batch, d.heads * d.kv_channels)
        return self.linear_proj(ctx)


class MLP(torch.nn.Module):
    """Dense MLP: fc1 fused with the pre-MLP LayerNorm, as in Megatron's TE spec."""

    def __init__(self, b: Builder, hidden_ffn: int) -> None:
        super().__init__()
        self.gated = b.config.gated_linear_unit
        width = hidden_ffn * (2 if self.gated else 1)
        self.linear_fc1 = b.norm_column(b.dims.hidden, width)
        self.linear_fc2 = b.row(hidden_ffn, b.dims.hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(_activation(self.linear_fc1(h), self.gated))


class ExpertMLP(torch.nn.Module):
    """One sequential expert or the shared experts: column- then row-parallel TE linears.
    `model_width`: the tokens' width (the MoE latent size for routed experts, when set)."""

    def __init__(self, b: Builder, hidden_ffn: int, model_width: int | None = None) -> None:
        super().__init__()
        self.gated = b.config.gated_linear_unit
        width = hidden_ffn * (2 if self.gated else 1)
        model_width = model_width or b.dims.hidden
        self.linear_fc1 = b.column(model_width, width)
        self.linear_fc2 = b.row(hidden_ffn, model_width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(_activation(self.linear_fc1(h), self.gated))


class GroupedExperts(torch.nn.Module):
    """TEGroupedMLP: every expert's GEMM in one grouped module per projection."""

    def __init__(self, b: Builder, num_experts: int, model_width: int) -> None:
        super().__init__()
        self.gated = b.config.gated_linear_unit
        width = b.dims.moe_ffn * (2 if self.gated else 1)
        self.linear_fc1 = b.grouped(w.TEColumnParallelGroupedLinear, num_experts, model_width, width)
        self.linear_fc2 = b.grouped(w.TERowParallelGroupedLinear, num_experts, b.dims.moe_ffn,
                                    model_width)

    def forward(self, tokens: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        return self.linear_fc2(_activation(self.linear_fc1(tokens, m_splits), self.gated), m_splits)


class SequentialExperts(torch.nn.Module):
    """SequentialMLP: one TE MLP per local expert, each called once per microbatch.

    When the session observes identical modules once (no value is read), the experts are
    grouped into classes of identical ones before the run (qaudit/model/identical.py; at the
    first forward at the latest) and only each class's first member runs, on the tokens of
    the whole class; the run stage gives the others its records (docs/observed-once.md)."""

    def __init__(self, b: Builder, num_experts: int, model_width: int) -> None:
        super().__init__()
        self.session = b.session
        self.local_experts = torch.nn.ModuleList(ExpertMLP(b, b.dims.moe_ffn, model_width)
                                                 for _ in range(num_experts))
        self.classes: list[ExpertClass] | None = None  # set by form_classes

    def form_classes(self) -> list[ExpertClass]:
        if self.classes is None:
            self.classes = expert_classes(list(self.local_experts))
        return self.classes

    def forward(self, tokens: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        if not self.session.observe_once:
            chunks = torch.split(tokens, m_splits)
            return torch.cat([expert(chunk) for expert, chunk in zip(self.local_experts, chunks)])
        classes = self.form_classes()
        if len(classes) == 1:
            return self.local_experts[classes[0].observed](tokens)
        # Each class's representative takes the rows of all its members, in place.
        rows = _expert_rows(m_splits, tokens.device)
        out = None
        for group in classes:
            taken = torch.isin(rows, torch.tensor(group.members, device=tokens.device))
            part = self.local_experts[group.observed](tokens[taken])
            if out is None:
                out = part.new_zeros(tokens.shape[:-1] + part.shape[-1:])
            out[taken] = part
        return out


class MoELayer(torch.nn.Module):
    def __init__(self, b: Builder, grouped: bool | None = None) -> None:
        """`grouped`: None follows moe_grouped_gemm; the hybrid spec always groups experts."""
        super().__init__()
        config = b.config
        self.topk = config.moe_router_topk
        self.num_experts = config.num_moe_experts
        self.router = torch.nn.Linear(b.dims.hidden, self.num_experts, bias=False)  # not TE
        # Latent MoE: routed tokens go down to the latent width before dispatch and back up
        # after combine, both through TELinear whatever the spec (upstream's moe_layer.py);
        # the router and the shared experts see the full hidden width.
        latent = b.dims.moe_latent
        if latent:
            self.fc1_latent_proj = b.linear(w.TELinear, b.dims.hidden, latent)
            self.fc2_latent_proj = b.linear(w.TELinear, latent, b.dims.hidden)
        self.latent = bool(latent)
        grouped = b.grouped_experts(config.moe_grouped_gemm if grouped is None else grouped)
        width = latent or b.dims.hidden
        self.experts = (GroupedExperts(b, self.num_experts, width) if grouped
                        else SequentialExperts(b, self.num_experts, width))
        self.shared_experts = ExpertMLP(b, b.dims.shared_ffn) if b.dims.shared_ffn else None
        self.recompute_shared = config.selective_recompute("shared_experts")
        self.runtime = b.session.runtime

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        flat = h.reshape(-1, shape[-1])
        probs, experts = torch.topk(torch.softmax(self.router(flat), dim=-1), self.topk, dim=-1)
        token_ids = torch.arange(flat.shape[0], device=flat.device).repeat_interleave(self.topk)
        order = torch.argsort(experts.reshape(-1), stable=True)
        token_ids = token_ids[order]
        m_splits = _tokens_per_expert(experts, self.num_experts)
        routed = self.fc1_latent_proj(flat) if self.latent else flat
        expert_out = self.experts(routed[token_ids], m_splits) * probs.reshape(-1)[order, None]
        out = torch.zeros_like(routed).index_add(0, token_ids, expert_out)
        if self.latent:
            out = self.fc2_latent_proj(out)
        if self.shared_experts is not None:
            if self.recompute_shared and self.training:
                out = out + checkpointed(self.shared_experts, self.runtime, flat)
            else:
                out = out + self.shared_experts(flat)
        return out.reshape(shape)


def _expert_rows(m_splits: list[int], device: torch.device) -> torch.Tensor:
    """Each routed row's expert index."""
    return torch.repeat_interleave(torch.arange(len(m_splits), device=device),
                                   torch.tensor(m_splits, device=device))


def _tokens_per_expert(experts: torch.Tensor, num_experts: int) -> list[int]:
    """How many routed tokens each expert gets. A meta tensor (--full-size) has no values, and
    aten::bincount no meta kernel: the split is then uniform, as a balanced router's."""
    if experts.is_meta:
        total = experts.numel()
        base, extra = divmod(total, num_experts)
        return [base + (1 if index < extra else 0) for index in range(num_experts)]
    return torch.bincount(experts.reshape(-1), minlength=num_experts).tolist()


def _attention(b: Builder) -> torch.nn.Module:
    if not b.config.multi_latent_attention:
        return SelfAttention(b)
    # The modelopt spec never reads mla_down_proj_fusion.
    fused = b.config.mla_down_proj_fusion and b.is_te
    return FusedMLASelfAttention(b) if fused else MLASelfAttention(b)


class TransformerLayer(torch.nn.Module):
    def __init__(self, b: Builder, moe: bool) -> None:
        super().__init__()
        self.runtime = b.session.runtime
        self.recompute_mlp = b.config.selective_recompute("moe" if moe else "mlp")
        self.self_attention = _attention(b)
        if moe:
            # MoE layers keep a separate pre-MLP norm; dense ones fuse it into linear_fc1.
            self.pre_mlp_layernorm = torch.nn.LayerNorm(b.dims.hidden)
            self.mlp = MoELayer(b)
        else:
            self.pre_mlp_layernorm = None
            self.mlp = MLP(b, b.dims.ffn)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attention(h)
        mlp_in = h if self.pre_mlp_layernorm is None else self.pre_mlp_layernorm(h)
        if self.recompute_mlp and self.training:
            return h + checkpointed(self.mlp, self.runtime, mlp_in)
        return h + self.mlp(mlp_in)
