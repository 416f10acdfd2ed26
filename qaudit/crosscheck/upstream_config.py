"""The user's config, as the user's Megatron would take it: TransformerConfig keyword arguments
and GPTModel's constructor arguments, from the input file itself (not from qaudit's reading).

YAML files hold TransformerConfig field names (flat or under `model:`): every key that is a
field of the installed TransformerConfig (MLATransformerConfig with multi-latent attention)
goes to it as written, so upstream's own `__post_init__` validates and derives the rest.
Then the audit's CPU settings replace widths (the same shrunk widths as qaudit's model: every
count kept) and parallel sizes (one process). What is replaced, and why, is in
docs/cross-check.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from qaudit.runtime.standin.environ_vars import temporarily_set
from qaudit.load.config import MODELLED_FIELDS, ModelConfig
from qaudit.plan.dims import model_dims
from qaudit.load.yamlio import YamlList, YamlMap
from qaudit.run.fsdp import NO_FSDP, FsdpGrads

# GPTModel constructor arguments a YAML file may carry (Megatron-Bridge provider fields).
GPT_MODEL_ARGS = ("share_embeddings_and_output_weights", "position_embedding_type",
                  "rotary_percent", "rotary_base", "rope_scaling", "rope_scaling_factor")
# HybridModel's own arguments that say which layers it builds (megatron/core/models/hybrid/
# hybrid_model.py); HybridModel resolves the deprecated ones itself.
HYBRID_MODEL_ARGS = ("hybrid_layer_pattern", "hybrid_override_pattern", "hybrid_attention_ratio",
                     "hybrid_mlp_ratio")
# Fields qaudit reads that are not TransformerConfig fields: handled by the builder itself.
HANDLED_ELSEWHERE = frozenset({"quant_recipe", "vocab_size", "seq_length",
                               "use_megatron_fsdp", "data_parallel_sharding_strategy",
                               "encoder_num_layers", *GPT_MODEL_ARGS, *HYBRID_MODEL_ARGS})


KERNEL_FUSIONS = ("bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm",
                  "bias_dropout_fusion", "apply_rope_fusion", "use_fused_weighted_squared_relu",
                  "fused_single_qkv_rope", "fused_residual_rmsnorm", "moe_permute_fusion",
                  "moe_router_fusion", "cross_entropy_loss_fusion")


@dataclass(kw_only=True)
class UpstreamInput:
    """What the builder hands to upstream's classes."""

    mla: bool
    config_kwargs: dict[str, Any]
    model_kwargs: dict[str, Any]
    recipe_path: str | None  # the --te-precision-config-file to load with upstream's loader
    unknown_fields: list[str] = field(default_factory=list)  # not fields of the installed config
    notes: list[str] = field(default_factory=list)
    # The flag route: the recipe upstream already loaded, and its config class.
    prebuilt_recipe: Any = None
    config_class: type | None = None
    # "modelopt": the entry point builds ModelOpt's spec (examples/post_training/modelopt).
    layer_spec: str = "te"
    # A MODEL_ARGS file's ENV_VARS: the runner's environment during the build and run.
    environment: dict[str, str] = field(default_factory=dict)
    # What Megatron-FSDP sets on every parameter, by strategy (qaudit/run/fsdp.py); the
    # cross-check's DDP stand-in does the same (qaudit/run/train.py's buffers).
    fsdp: FsdpGrads = NO_FSDP
    # A hybrid (Mamba) model: HybridModel's pattern arguments (None: a GPTModel).
    hybrid: dict[str, Any] | None = None
    # An encoder-decoder (T5) model: the encoder's layer count (None: not T5).
    t5_encoder_layers: int | None = None
    # Attributes upstream's start-up sets on the config beside its dataclass fields (0.19.2:
    # the `yarn_*` values GPTModel reads with getattr), set again on the rebuilt config.
    config_attributes: dict[str, Any] = field(default_factory=dict)


def plain(value: Any) -> Any:
    if isinstance(value, YamlMap):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, YamlList):
        return [plain(v) for v in value]
    return value


def cpu_overrides(config: ModelConfig) -> dict[str, Any]:
    """Widths shrunk as qaudit's own model is, one process, float32 parameters on CPU."""
    d = model_dims(config)
    overrides: dict[str, Any] = {
        "hidden_size": d.hidden, "num_attention_heads": d.heads,
        "num_query_groups": d.query_groups, "kv_channels": d.kv_channels,
        "ffn_hidden_size": d.ffn, "moe_ffn_hidden_size": d.moe_ffn if config.is_moe else None,
        "tensor_model_parallel_size": 1, "context_parallel_size": 1,
        "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1,
        "sequence_parallel": False,
        # Pipeline sizes stay the user's: each stage's chunks are built (with Megatron's own
        # parallel_state overrides) and run in order in this one process.
        "bf16": False, "fp16": False, "params_dtype": torch.float32,
        "pipeline_dtype": torch.float32,
        "use_cpu_initialization": True, "perform_initialization": True,
        "gradient_accumulation_fusion": config.gradient_accumulation_fusion,
        # Fused kernels (CUDA, or torch.compile'd): Megatron's unfused path instead. They
        # change no linear module, call or wgrad decision (docs/cross-check.md).
        **{name: False for name in KERNEL_FUSIONS},
    }
    if config.moe_shared_expert_intermediate_size:
        overrides["moe_shared_expert_intermediate_size"] = d.shared_ffn
    if config.moe_latent_size:
        # The experts' width between the latent projections: at the real width (2048 for
        # Nemotron-3 Ultra's 512 experts) upstream's build alone passed the worker's 16 GiB.
        overrides["moe_latent_size"] = d.moe_latent
    if config.is_hybrid:
        # The mixer shrunk with the rest (upstream derives its heads from hidden_size when
        # mamba_num_heads is unset, and asserts heads % groups). The state width is qaudit's
        # 8 + 2, so that upstream's fp8 check (in_proj width 2*64 + 4*state + 8 a multiple of
        # 16) passes at the shrunk width as it did at the real one; widths are not compared.
        overrides.update(mamba_num_heads=d.mamba_heads, mamba_head_dim=d.mamba_head_dim,
                         mamba_num_groups=d.mamba_groups, mamba_state_dim=d.mamba_state + 2)
    if config.multi_latent_attention:
        overrides.update(q_lora_rank=d.q_lora_rank, kv_lora_rank=d.kv_lora_rank,
                         qk_head_dim=d.qk_head_dim, qk_pos_emb_head_dim=d.qk_pos_emb_head_dim,
                         v_head_dim=d.v_head_dim)
    return overrides


def from_yaml(config: ModelConfig, recipe_file: str | None, config_fields: set[str],
              mla_fields: set[str]) -> UpstreamInput:
    """`recipe_file`: the recipe qaudit opened (`--recipe` or `quant_recipe`); `config_fields`:
    the installed TransformerConfig's field names, `mla_fields`: MLATransformerConfig's."""
    mapping = config.source.mapping if config.source else {}
    written = {key: plain(value) for key, value in mapping.items()}
    mla = bool(written.get("multi_latent_attention", False))
    known = mla_fields if mla else config_fields
    kwargs = {key: value for key, value in written.items() if key in known}
    unknown = sorted(key for key in written
                     if key not in known and key not in HANDLED_ELSEWHERE)
    if config.source is not None and config.source.origin == "bridge":
        # A Bridge provider subclasses TransformerConfig with fields of its own (and of the
        # megatron-core it was written with): only a field qaudit models must exist upstream.
        unknown = [key for key in unknown if key in MODELLED_FIELDS]
    if isinstance(kwargs.get("attention_backend"), str):
        kwargs["attention_backend"] = _attention_backend(kwargs["attention_backend"])
    overrides = cpu_overrides(config)
    kwargs.update({key: value for key, value in overrides.items() if key in known})
    bridge = config.source is not None and config.source.origin == "bridge"
    if "gradient_accumulation_fusion" in written and not bridge:
        # (A Bridge dump's value is resolved by its reader, possibly both ways: the config's.)
        kwargs["gradient_accumulation_fusion"] = written["gradient_accumulation_fusion"]
    # num_layers comes from the config as qaudit resolved it only for hybrid patterns.
    kwargs.setdefault("num_layers", config.num_layers)
    if config.is_hybrid and config.mtp_num_layers and "mtp_num_layers" in known:
        # A pattern's MTP depths set mtp_num_layers, as the training command line does
        # (validate_args; docs/hybrid.md); HybridModel builds MTP only when it is set.
        kwargs.setdefault("mtp_num_layers", config.mtp_num_layers)
    d = model_dims(config)
    model_kwargs = {
        "vocab_size": d.vocab, "max_sequence_length": d.seq_length,
        # qaudit's default, as on the training command line (upstream's GPTModel says False).
        "share_embeddings_and_output_weights": config.share_embeddings_and_output_weights,
    }
    model_kwargs.update({key: written[key] for key in GPT_MODEL_ARGS if key in written})
    if bridge and isinstance(model_kwargs.get("rotary_base"), (list, tuple)):
        # Gemma3's provider keeps a (local, global) pair of RoPE bases for its own layer spec;
        # upstream's GPTModel takes one number, and no TE module depends on it: the last
        # (global) one stands in.
        model_kwargs["rotary_base"] = model_kwargs["rotary_base"][-1]
    hybrid = None
    if config.is_hybrid:
        # As written (a Bridge dump's pattern as its provider composes it): HybridModel itself
        # resolves the deprecated spellings, so qaudit's resolution is checked too.
        hybrid = {key: written[key] for key in HYBRID_MODEL_ARGS if written.get(key) is not None}
    return UpstreamInput(mla=mla, config_kwargs=kwargs, model_kwargs=model_kwargs,
                         recipe_path=recipe_file, unknown_fields=unknown,
                         layer_spec=config.layer_spec, hybrid=hybrid,
                         t5_encoder_layers=config.encoder_num_layers if config.is_t5 else None,
                         fsdp=FsdpGrads.of(
                             written.get("use_megatron_fsdp", False),
                             written.get("data_parallel_sharding_strategy", "no_shard")))


def _attention_backend(name: str) -> Any:
    """A YAML file holds the enum member's name (Bridge's dump writes it so); the command
    line's `--attention-backend` gives the member, and Megatron compares members
    (LanguageModule._set_attention_backend): a name left a string would be no backend."""
    try:
        from megatron.core.transformer.enums import AttnBackend
    except ImportError:  # a Megatron without the enum takes what is written
        return name
    return AttnBackend.__members__.get(name, name)


def dataclass_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# --- launch scripts and MODEL_ARGS files: upstream's own argument parsing --------------------

ENTRY_SCRIPT = "pretrain_gpt.py"


def argv_strings(words: list[Any]) -> tuple[list[str], bool]:
    """The words as strings for upstream's parser; True when words that are passed only under
    an undecided condition were left out. A flag whose value the script only knows at run time
    is left out with its value (upstream's default stands in): qaudit has already refused the
    input if the audit needed that flag."""
    from qaudit.load.sources.argv import HOLE, split_argv

    argv = split_argv([word for word in words if not getattr(word, "condition", ())])
    strings = []
    for occurrence in argv.occurrences:
        if any(value.unknown or HOLE in value.text for value in occurrence.values):
            continue
        strings.append(occurrence.word.text)
        strings.extend(value.text for value in occurrence.values)
    dropped = any(getattr(word, "condition", ()) for word in words)
    return strings, dropped


def world_size_for(args: Any) -> int:
    """One rank per model-parallel slot, so that validate_args accepts the parallel sizes."""
    model = (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
             * args.context_parallel_size)
    experts = args.expert_model_parallel_size * (args.expert_tensor_parallel_size or 1)
    size = model
    while size % experts and size < model * experts:
        size += model
    return max(size, experts if experts % model == 0 else model * experts)


def from_arguments(config: ModelConfig, argv: list[str],
                   environment: dict[str, str] | None = None,
                   inference: bool = False) -> tuple[UpstreamInput, Any]:
    """Megatron's `parse_args` -> `validate_args` -> `core_transformer_config_from_args`, as
    pretrain_gpt.py runs them (megatron/training/arguments.py), on the script's own words; then
    the audit's CPU settings. Returns the input and upstream's args (for the spec choice)."""
    args, upstream_config = upstream_arguments(argv, environment, inference)
    known = dataclass_fields(type(upstream_config))
    kwargs = {name: getattr(upstream_config, name) for name in known
              if not name.startswith("_") and _is_init_field(type(upstream_config), name)}
    overrides = cpu_overrides(config)
    kwargs.update({key: value for key, value in overrides.items() if key in known})
    kwargs["gradient_accumulation_fusion"] = upstream_config.gradient_accumulation_fusion
    d = model_dims(config)
    model_kwargs = {
        "vocab_size": d.vocab, "max_sequence_length": d.seq_length,
        "share_embeddings_and_output_weights": not args.untie_embeddings_and_output_weights,
        "position_embedding_type": args.position_embedding_type,
        "rotary_percent": args.rotary_percent, "rotary_base": args.rotary_base,
        "rope_scaling": args.use_rope_scaling}
    upstream = UpstreamInput(mla=bool(getattr(upstream_config, "multi_latent_attention", False)),
                             config_kwargs=kwargs, model_kwargs=model_kwargs, recipe_path=None)
    upstream.prebuilt_recipe = upstream_config.quant_recipe
    upstream.environment = dict(environment or {})
    upstream.layer_spec = config.layer_spec
    upstream.fsdp = FsdpGrads.of(
        getattr(args, "use_megatron_fsdp", False),
        getattr(args, "data_parallel_sharding_strategy", "no_shard"))
    upstream.config_class = type(upstream_config)
    upstream.config_attributes = {name: value for name, value in vars(upstream_config).items()
                                  if name not in known and not name.startswith("_")}
    pattern = getattr(args, "hybrid_layer_pattern", None)
    if pattern is not None:  # hybrid_builders.py hands the pattern validate_args resolved
        upstream.hybrid = {"hybrid_layer_pattern": pattern}
    if config.is_t5:  # (validate_args copies num_layers into encoder_num_layers for any model)
        upstream.t5_encoder_layers = args.encoder_num_layers
    return upstream, args


def upstream_arguments(argv: list[str], environment: dict[str, str] | None = None,
                       inference: bool = False) -> tuple[Any, Any]:
    """Megatron's own start-up on the command line: `parse_args`, `validate_args`,
    `core_transformer_config_from_args`. Returns (args, TransformerConfig); ArgumentsRejected
    with upstream's message when any of them refuses. `inference`: as upstream's inference
    scripts run it, under torch.inference_mode() (validate_args lets --fp8-param-gather
    through there without a distributed optimizer)."""
    import torch
    from megatron.training import arguments

    mode = torch.inference_mode() if inference else contextlib.nullcontext()
    # Upstream prints its settings (validate_args); the report is qaudit's output.
    with contextlib.redirect_stdout(io.StringIO()), _cpu_answers(arguments), mode:
        args = _parse(arguments, argv)  # first for the parallel sizes, ...
        # A MODEL_ARGS file's ENV_VARS are the runner's environment (validate_args reads some).
        with temporarily_set({**(environment or {}), "WORLD_SIZE": str(world_size_for(args)),
                             "RANK": "0"}):
            args = _parse(arguments, argv)  # ... then with the world they need
            try:
                arguments.validate_args(args, {})
                upstream_config = arguments.core_transformer_config_from_args(args)
            except (AssertionError, ValueError, TypeError) as exc:
                raise ArgumentsRejected(f"validate_args: {type(exc).__name__}: {exc}") from exc
    return args, upstream_config


class ArgumentsRejected(Exception):
    """Megatron's parse_args or validate_args refused the command line."""


# argparse's help options (Megatron's parser keeps add_help and sets allow_abbrev=False):
# upstream prints its help and exits, so nothing would train; formatting that help may even
# raise (0.19.2: ValueError on a `%)` in one option's help).
HELP_OPTIONS = ("-h", "--help")


def _parse(arguments: Any, argv: list[str]) -> Any:
    import sys

    words = argv[:argv.index("--")] if "--" in argv else argv
    asked = next((word for word in words if word in HELP_OPTIONS), None)
    if asked is not None:
        raise ArgumentsRejected(f"parse_args: {asked} prints Megatron's help and exits; the "
                                "launch trains nothing")
    saved = sys.argv
    sys.argv = [ENTRY_SCRIPT, *argv]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return arguments.parse_args(ignore_unknown_args=True)
    except SystemExit:  # argparse's error(): its message went to stderr
        lines = errors.getvalue().strip().splitlines()
        raise ArgumentsRejected("parse_args: " + (lines[-1] if lines else "error")) from None
    finally:
        sys.argv = saved




@contextlib.contextmanager
def _cpu_answers(arguments: Any) -> Iterator[None]:
    """validate_args asks for the GPU's architecture (stream priorities and environment
    checks only): answer Blackwell (10), whose checks are the least demanding."""
    saved = getattr(arguments, "get_device_arch_version", None)
    arguments.get_device_arch_version = lambda: 10
    try:
        yield
    finally:
        if saved is not None:
            arguments.get_device_arch_version = saved


def _is_init_field(cls: type, name: str) -> bool:
    return cls.__dataclass_fields__[name].init
