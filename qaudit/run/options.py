"""What one audit run is asked to do (the CLI's options), importable without torch so that the
command line can refuse bad input before torch loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qaudit.plan.upstream.target import MegatronTarget
    from qaudit.plan.upstream.te import TETarget
    from qaudit.run.distributed import World


@dataclass(frozen=True)
class AuditOptions:
    # --policy: an explicit tracking behaviour, over the one of the Megatron below.
    policy: str | None = None
    # --megatron: "auto", "main" or a release; resolved once into a MegatronTarget.
    megatron: str | MegatronTarget = "auto"
    # --te: "auto", "main" or a TE release; resolved once into a TETarget.
    te: str | TETarget = "auto"
    steps: int = 2
    microbatches: int = 2
    runtime: str = "auto"
    device: str | None = None  # cpu|cuda; None: the runtime's own (te: cuda, reference: cpu)
    seed: int = 0
    evaluation: bool = False  # forward-only, modules in eval mode
    verify: bool = False  # measure main_grad against an unfused float64 reference
    compare_policies: bool = False
    full_size: bool = False  # real widths instead of shrunk ones
    rank: int | None = None  # show one pipeline stage only
    # --set NAME=VALUE: values a launch script or MODEL_ARGS file takes from outside.
    variables: tuple[tuple[str, str], ...] = ()
    # --override FILE and trailing KEY=VALUE arguments on a Megatron-Bridge ConfigContainer
    # (qaudit.load.bridge.overrides.Override), applied as Bridge applies them.
    overrides: tuple = ()
    # --allow-import: import and call the recipes' custom_recipe_factory (Python code the
    # input names). Off: nothing is imported and such modules are reported "not executed".
    allow_import: bool = False
    # Under torchrun: this process's rank, which runs pipeline stage `world.rank`.
    world: World | None = None
    # --cross-check: also build and run the config with the installed Megatron and compare.
    cross_check: bool = False
    # The installed Megatron's own start-up checks on the config (qaudit/crosscheck/startup.py):
    # True, False, or None (an installed megatron-core package only, not a checkout)
    startup_checks: bool | None = None
    # --cross-check-timeout / --cross-check-memory: the worker's wall-clock deadline (seconds)
    # and how far its address space may grow (MiB); qaudit/crosscheck/worker.py.
    cross_check_timeout: float = 900.0
    cross_check_memory: int | None = 16384
    # --allow-long-audit: run even when the estimate is over qaudit.run.cost.MAX_SECONDS.
    allow_long_audit: bool = False
    # Identical sequential experts of a layer are one observation where no value is read
    # (docs/observed-once.md); False runs every expert (the Python API's, for comparison).
    observe_once: bool = True
    # --runtime te: TE's own code for one module per class of identical modules, the others'
    # calls inferred from it (qaudit/runtime/te_infer.py; --no-infer turns it off). Never with
    # --verify: each module's gradient values are compared.
    te_infer: bool = True
