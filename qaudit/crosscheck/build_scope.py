"""What one upstream build in the cross-check runs inside, and only while it does.

The room's stand-ins for a CPU process (qaudit/runtime/standin/boot.py, entered through its
`enter`), a gloo process group of one rank with Megatron's `parallel_state` over it, and the
checks that Megatron was not imported earlier in this process with another TE or without
mamba_ssm. Everything is undone on exit (the process's environment variables included),
except the imported Megatron modules themselves (importing them again would cost seconds
per build).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from typing import TYPE_CHECKING, Iterator

from qaudit.errors import EnvironmentProblem
from qaudit.runtime.standin import boot, gemm as standin_gemm, te_package as standin_te

if TYPE_CHECKING:
    from qaudit.runtime.standin.side import TESide


def mamba_bound() -> None:
    """Megatron's Mamba mixer binds mamba_ssm and causal_conv1d when first imported: refuse to
    build a hybrid model when that happened without them earlier in this process."""
    mixer = importlib.import_module("megatron.core.ssm.mamba_mixer")
    if not getattr(mixer, "HAVE_MAMBA_SSM", False) or getattr(mixer, "causal_conv1d_fn",
                                                              None) is None:
        raise EnvironmentProblem("--cross-check: Megatron's Mamba mixer was imported without "
                                 "mamba_ssm or causal_conv1d earlier in this process; run "
                                 "qaudit in a fresh process")


@contextlib.contextmanager
def _process_group() -> Iterator[None]:
    """A gloo group of one rank and Megatron's parallel_state over it (TP = PP = EP = CP = 1)."""
    import torch.distributed as dist

    from megatron.core import parallel_state

    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        created = True
    elif dist.get_world_size() != 1:
        raise EnvironmentProblem("--cross-check builds upstream's model in one process; run it "
                                 "without torchrun")
    try:
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel()
        yield
    finally:
        parallel_state.destroy_model_parallel()
        _reset_megatron_globals()
        if created:
            dist.destroy_process_group()


def _reset_megatron_globals() -> None:
    """Process-wide state one build leaves behind (MoE metrics sized to its layer count)."""
    try:
        logging = importlib.import_module("megatron.core.transformer.moe.moe_logging")
    except ImportError:
        return
    destroy = getattr(logging, "destroy_moe_metrics_tracker", None)
    if destroy is not None:
        destroy()


@contextlib.contextmanager
def upstream_environment(te: "TESide", allow_import: bool = False) -> Iterator[None]:
    """Import the user's Megatron and let it build and train here (see the module docstring).
    `te`: the TE side decided in the audit process (qaudit/runtime/standin/side.py `decide`,
    which also refuses the sides this machine cannot give): `real` stands nothing in for TE
    or CUDA; `te-cpu` boots TE's own Python on qaudit's CPU kernel stand-in and stands in the
    rest of CUDA; `standin` puts qaudit's stand-in TE package in place.
    `allow_import`: --allow-import, Megatron may import a recipe's custom factory."""
    environment = dict(os.environ)
    try:
        with contextlib.ExitStack() as stack, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                boot.enter(te, stack, megatron=True, allow_import=allow_import)
            except boot.NotBooted as exc:
                raise EnvironmentProblem(f"--cross-check: {exc}") from None
            _check_bound_to(te.kind != "standin")
            stack.enter_context(_process_group())
            standin_gemm.clear_writes()
            yield
    finally:
        os.environ.clear()
        os.environ.update(environment)


def _check_bound_to(real_te: bool) -> None:
    """Megatron binds `transformer_engine` when its TE extension is first imported: refuse to
    build when that happened with another TE than the one this build needs."""
    module = importlib.import_module("megatron.core.extensions.transformer_engine")
    bound = getattr(module, "te", None)
    if not getattr(module, "HAVE_TE", False):
        raise EnvironmentProblem("--cross-check: Megatron was imported without Transformer "
                                 "Engine earlier in this process; run qaudit in a fresh process")
    if standin_te.is_standin(bound) == real_te:
        raise EnvironmentProblem("--cross-check: Megatron was imported with another Transformer "
                                 "Engine earlier in this process; run qaudit in a fresh process")
