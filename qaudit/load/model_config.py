"""The model config's types: `ModelConfig` (Megatron `TransformerConfig` field names) and where
each key was written (`ConfigSource`, `SourceNote`).

Below both the loader (qaudit/load/config.py) and the families (qaudit/families/): a family's
hooks take a `ModelConfig`, and the loader calls the hooks, so the type lives under both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qaudit import families
from qaudit.families.hybrid.pattern import MOE, HybridPattern, parse_pattern
from qaudit.load.precision import Quant
from qaudit.load.yamlio import YamlMap


@dataclass
class ModelConfig:
    """The fields the audit models; defaults as upstream `TransformerConfig`.

    Exception: `gradient_accumulation_fusion` defaults to True, as on Megatron's training
    command line (`--no-gradient-accumulation-fusion` turns it off), not False as in the
    dataclass, because that is what real training runs use.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int | None = None
    num_query_groups: int | None = None
    kv_channels: int | None = None
    gated_linear_unit: bool = False
    num_moe_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    # MoE latent projections: experts run at this width between fc1_latent_proj and
    # fc2_latent_proj (megatron/core/transformer/moe/moe_layer.py).
    moe_latent_size: int | None = None
    moe_layer_freq: int | list[int] = 1
    moe_grouped_gemm: bool = False
    moe_router_topk: int = 2
    mtp_num_layers: int | None = None
    mtp_use_repeated_layer: bool = False
    fp8: str | None = None
    fp8_recipe: str = "delayed"
    fp4: str | None = None
    fp4_recipe: str = "nvfp4"
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: int = 1
    num_layers_at_end_in_bf16: int = 1
    fp8_output_proj: bool = False
    gradient_accumulation_fusion: bool = True
    disable_parameter_transpose_cache: bool = False
    use_kitchen: bool = False
    share_embeddings_and_output_weights: bool = True
    vocab_size: int | None = None
    quant_recipe: str | None = None
    # Multi-latent attention (MLATransformerConfig; defaults as upstream).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = 512
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # Norms on the MLA latents: fused into the up projections (TELayerNormColumnParallelLinear
    # instead of TEColumnParallelLinear). Standard attention's q/k norms are not linears.
    qk_layernorm: bool = False
    # MLA: one fused q/kv down projection (`linear_qkv_down_proj`) with the input norm.
    mla_down_proj_fusion: bool = False
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    recompute_modules: list[str] | None = None
    moe_layer_recompute: bool = False  # deprecated: selective recompute of "moe" (below)
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # An explicit layout ("Et*3|(tt|)*6tmL" or the list form): per model chunk, which layers
    # it holds; sets the virtual pipeline size (qaudit/load/pp_layout.py).
    pipeline_model_parallel_layout: str | list | None = None
    # Megatron-FSDP (DDP config, not TransformerConfig): what it does to main_grad by
    # strategy is qaudit/run/fsdp.py (docs/semantics.md §1.5).
    use_megatron_fsdp: bool = False
    data_parallel_sharding_strategy: str = "no_shard"
    # Hybrid (Mamba) models: HybridModel's constructor arguments (the pattern replaces the
    # GPT stack; the override and ratio forms are its deprecated spellings) and the Mamba
    # mixer's TransformerConfig fields (defaults as upstream). See qaudit/families/hybrid/fields.py.
    hybrid_layer_pattern: str | None = None
    hybrid_override_pattern: str | None = None
    hybrid_attention_ratio: float = 0.0
    hybrid_mlp_ratio: float = 0.0
    mamba_state_dim: int = 128
    mamba_head_dim: int = 64
    mamba_num_groups: int = 8
    mamba_num_heads: int | None = None
    # Encoder-decoder (T5) models: the encoder's layer count (Megatron's argument name; T5Model's
    # `encoder_config.num_layers`). Set, it makes the model a T5Model whose decoder has
    # `num_layers` layers. See qaudit/families/t5/fields.py.
    encoder_num_layers: int | None = None
    # Settings that change what TE does (docs/te-settings.md): delayed weight gradients,
    # per-layer CUDA graphs (the deprecated switches and scope name as upstream translates
    # them), primary quantized weights, and Megatron's --freeze-all-layers (an argument, not
    # a TransformerConfig field).
    delay_wgrad_compute: bool = False
    cuda_graph_impl: str = "none"
    enable_cuda_graph: bool = False
    external_cuda_graph: bool = False
    cuda_graph_modules: str | list[str] | None = None
    cuda_graph_scope: str | list[str] | None = None
    fp8_param: bool = False
    fp4_param: bool = False
    freeze_all_layers: bool = False
    # Which layer spec builds the model (qaudit's own key, not a TransformerConfig field):
    # "te", Megatron's TE spec, or "modelopt", the spec of Megatron's ModelOpt builder
    # (Megatron's own linears). The flag route sets it from the entry point
    # (qaudit/load/sources/modelopt_flags.py).
    layer_spec: str = "te"
    # Where each key was written; not a model field.
    source: "ConfigSource" = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    # --- derived facts, used by the planner and the model builder -------------------------
    @property
    def is_moe(self) -> bool:
        return bool(self.num_moe_experts)

    @property
    def mtp_depths(self) -> int:
        return self.mtp_num_layers or 0

    @property
    def family(self) -> str:
        """`gpt` (the base: dense, MoE, MLA, MTP) or a family of qaudit/families/."""
        return families.family_of(self)

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_layer_pattern is not None

    @property
    def is_t5(self) -> bool:
        return self.encoder_num_layers is not None

    def hybrid_pattern(self) -> HybridPattern | None:
        return parse_pattern(self.hybrid_layer_pattern) if self.is_hybrid else None

    def moe_layer_pattern(self) -> list[bool]:
        """Per decoder layer: True for an MoE layer (Megatron's `moe_layer_freq` rule; in a
        hybrid model, the pattern's 'E' layers)."""
        pattern = self.hybrid_pattern()
        if pattern is not None:
            return [symbol == MOE for symbol in pattern.main]
        if not self.is_moe:
            return [False] * self.num_layers
        if isinstance(self.moe_layer_freq, list):
            return [bool(v) for v in self.moe_layer_freq]
        return [i % self.moe_layer_freq == 0 for i in range(self.num_layers)]

    def mtp_moe_layers(self) -> list[bool]:
        """Per layer inside one MTP depth: True for MoE. GPT: one layer following the decoder's
        last layer; hybrid: the pattern's MTP part."""
        pattern = self.hybrid_pattern()
        if pattern is not None:
            return [symbol == MOE for symbol in pattern.mtp or ""]
        return [self.moe_layer_pattern()[-1]]

    def global_fp8(self) -> Quant | None:
        return Quant("fp8", self.fp8_recipe, self.fp8) if self.fp8 else None

    def global_fp4(self) -> Quant | None:
        return Quant("fp4", self.fp4_recipe) if self.fp4 else None

    def is_tracked(self) -> bool:
        """Megatron's config-level `is_first_microbatch` tracking / re-arming predicate."""
        return bool(self.fp8 or self.fp4 or self.use_kitchen or self.quant_recipe)

    def line_of(self, key: str) -> int | None:
        return self.source.line_of(key) if self.source else None

    def where(self, key: str) -> tuple[str | None, int | None]:
        """The file and line that set `key` (an override file, for a Bridge override)."""
        return self.source.where(key) if self.source else (None, None)

    def recomputed_layers(self, count: int) -> list[bool]:
        """Per layer of a block of `count`: whole-layer (full) recompute on or off."""
        if self.recompute_granularity != "full":
            return [False] * count
        if self.recompute_method == "block":
            return [i < (self.recompute_num_layers or 0) for i in range(count)]
        return [True] * count

    def selective_recompute(self, module: str) -> bool:
        """Selective recompute of a submodule kind: mlp, moe or shared_experts."""
        if self.recompute_granularity != "selective":
            return False
        return module in (self.recompute_modules or ["core_attn"])

    @property
    def file(self) -> str | None:
        return self.source.file if self.source else None

    @property
    def graph_impl(self) -> str:
        """The CUDA-graph implementation after upstream's translation of the deprecated
        switches (TransformerConfig.__post_init__): none, local, transformer_engine or
        full_iteration."""
        if self.enable_cuda_graph:
            return "local"
        if self.external_cuda_graph:
            return "transformer_engine"
        if "full_iteration" in self.graph_modules():
            return "full_iteration"
        return self.cuda_graph_impl

    def graph_modules(self) -> list[str]:
        """The capture scopes (cuda_graph_modules, or the deprecated cuda_graph_scope); empty
        means whole layers, as upstream turns "full" into an empty list."""
        value = self.cuda_graph_scope if self.cuda_graph_scope is not None \
            else self.cuda_graph_modules
        items = value if isinstance(value, list) else [] if value is None else [value]
        return [item for item in items if item != "full"]


@dataclass
class SourceNote:
    """Something the input said that the audit cannot model (a QA090 warning), or, with
    `no_effect`, a setting read and shown to change nothing the audit reports (listed once by
    QA091; the evidence is docs/no-effect-settings.md)."""

    message: str
    line: int | None = None
    key: str | None = None
    file: str | None = None  # when not the config's own file (a Bridge override)
    no_effect: bool = False


@dataclass
class ConfigSource:
    file: str
    path: Path
    mapping: YamlMap
    notes: list[SourceNote] = field(default_factory=list)
    # Launch scripts and MODEL_ARGS files: Megatron's argv as qaudit read it (tokens.Word), so
    # that --cross-check can hand the same words to upstream's own argument parser.
    argv: list[Any] | None = None
    # MODEL_ARGS files: the ENV_VARS the test runner exports (upstream's validate_args reads
    # some of them).
    environment: dict[str, str] = field(default_factory=dict)
    # MODEL_ARGS files with `MODE: inference`: upstream's inference scripts parse their
    # arguments under torch.inference_mode(), which some of validate_args' checks allow.
    inference_test: bool = False
    # Which reader made it: None (TransformerConfig YAML, launch script, MODEL_ARGS) or
    # "bridge" (a Megatron-Bridge ConfigContainer, qaudit/load/bridge/).
    origin: str | None = None
    # Bridge dumps: the Megatron spec the verdict defaults to when `--megatron auto` finds no
    # installed Megatron ("bridge-v0.6.0": the Megatron-LM commit Bridge v0.6.0 pins).
    assumed_megatron: str | None = None
    # Bridge dumps: the provider class and the Bridge version when the file says it, and
    # lines for the report header saying how the file was read.
    provider: str | None = None
    bridge_version: str | None = None
    header_notes: list[str] = field(default_factory=list)
    # Fields set in another file than `file` (an override file or argument): field -> (file, line).
    origins: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    # Fields the file cannot pin down: field -> every value to audit (the worse verdict wins).
    alternatives: dict[str, list[Any]] = field(default_factory=dict)

    def line_of(self, key: str) -> int | None:
        if key in self.origins:
            return None  # its line is in another file: `where` says which
        if key in self.mapping.key_lines:
            return self.mapping.key_lines[key]
        return None

    def where(self, key: str) -> tuple[str, int | None]:
        """The file and line that set `key`."""
        if key in self.origins:
            return self.origins[key]
        return self.file, self.line_of(key)
