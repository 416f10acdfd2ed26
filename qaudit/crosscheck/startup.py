"""Megatron's own start-up checks on the config, in the plain audit (docs/upstream-checks.md).

Where the Megatron the audit reads is the user's installed one (`--megatron auto` found it on
sys.path), its own config validation runs in the cross-check's fenced worker (forked, with a
deadline and a memory limit, nothing but plain data coming back), beside qaudit's audit:
`TransformerConfig(...)` for a YAML of fields or a Bridge dump, and `parse_args`,
`validate_args`, `core_transformer_config_from_args` for a launch script or a MODEL_ARGS file.
No model is built. A refusal there is the user's input error (exit 2, upstream's words); a
check that cannot run (the Megatron does not import here, the worker fails or runs out of
time) is said in the report's header and the audit goes on with qaudit's own table.
"""

from __future__ import annotations

import multiprocessing
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qaudit.crosscheck import import_path, worker
from qaudit.errors import InputError, printable

if TYPE_CHECKING:
    from qaudit.runtime.standin.side import TESide
    from qaudit.run.options import AuditOptions
    from qaudit.load.config import ModelConfig
    from qaudit.load.recipe import QuantRecipe
    from qaudit.plan.upstream.detect import MegatronLocation

# The start-up is seconds of importing (about 3 s CPU here); a worker past this is abandoned,
# not waited for (120 s before: every check waited that long on a hanging Megatron).
STARTUP_TIMEOUT_S = 30.0
# Address space past what the worker inherits: megatron-core 0.19.2's start-up needs 520-640
# MiB of it (mostly mappings, not memory: the whole run peaks at 275 MB resident); a Megatron
# that fills memory stops at a MemoryError near 1 GiB (docs/security.md).
STARTUP_MEMORY_MIB = 1024


@dataclass(frozen=True)
class StartupAnswer:
    """What the worker says: `refusal` is upstream's message, None when it accepted."""

    refusal: str | None


def startup_answer(config: "ModelConfig", recipe: "QuantRecipe | None", allow_import: bool,
                   te: "TESide", root: str) -> StartupAnswer:
    """In the worker: the config through the installed Megatron's own validation. The
    answer counts only if the Megatron imported is the one at `root`, the report's."""
    from qaudit.crosscheck import _quiet_megatron, _upstream_input, upstream_build
    from qaudit.crosscheck.build_scope import upstream_environment
    from qaudit.errors import EnvironmentProblem

    import torch

    # Validation computes nothing: no intra-op thread pool (each thread's stack would count
    # against the worker's address-space limit, more of them the more cores).
    torch.set_num_threads(1)
    answer = StartupAnswer(None)
    try:
        with _quiet_megatron(), upstream_environment(te, allow_import=allow_import):
            upstream = _upstream_input(config, recipe, [])
            if isinstance(upstream, str):  # parse_args / validate_args refused the command line
                answer = StartupAnswer(upstream)
            else:
                upstream_build.make_config(upstream)
    except upstream_build.Rejected as exc:
        answer = StartupAnswer(str(exc))
    finally:
        # Whatever happened, an answer from another Megatron than the report's is none.
        elsewhere = import_path.imported_elsewhere(root)
        if elsewhere:
            raise EnvironmentProblem(elsewhere)
    return answer


def start_startup_checks(config: "ModelConfig", recipe: "QuantRecipe | None",
                         options: "AuditOptions") -> "StartupCheck | None":
    """The checks, started beside the audit; None where the verdict is not for the user's
    installed Megatron, or --cross-check runs upstream's start-up itself."""
    from pathlib import Path

    from qaudit.plan.upstream.detect import MegatronLocation
    from qaudit.plan.upstream.site_dirs import is_site_dir

    target = options.megatron
    if options.cross_check or options.startup_checks is False \
            or getattr(target, "source", None) != "installed":
        return None
    # The Megatron `--megatron auto` already found on sys.path: not looked for again.
    location = MegatronLocation(Path(target.location), None if target.version == "unknown"
                                else target.version, target.kind)
    if options.startup_checks is None and not (location.kind == "package"
                                               and is_site_dir(location.root)):
        # A checkout or any tree on PYTHONPATH may be a pull request's: importing it runs its
        # code. A dist-info beside it proves nothing (anyone can write one).
        return StartupCheck(config, recipe, options.allow_import, location,
                            left_out="a Megatron outside the interpreter's site-packages (a "
                                     "checkout or a tree on PYTHONPATH) is imported only with "
                                     "--startup-checks (it may be a pull request's tree)")
    # Asked for by flag: the whole module path, as the user set it. Otherwise the installed
    # package, imported from site-packages only (nothing on PYTHONPATH can shadow it).
    path = None if options.startup_checks else import_path.installed_only()
    return StartupCheck(config, recipe, options.allow_import, location, path=path)


class StartupCheck:
    """Started before the audit, collected after it (the two overlap)."""

    def __init__(self, config: "ModelConfig", recipe: "QuantRecipe | None", allow_import: bool,
                 location: "MegatronLocation", left_out: str | None = None,
                 path: list[str] | None = None) -> None:
        from qaudit.crosscheck import _describe
        from qaudit.runtime.standin import side

        self.location = location
        self.job: worker.ForkedWorker | None = None
        self.skipped = left_out
        if left_out is not None:
            return
        te = side.decide()
        if te.refusal:
            self.skipped = te.refusal
        elif "fork" not in multiprocessing.get_all_start_methods():
            self.skipped = "this platform cannot fork the fenced worker"
        else:
            limits = worker.WorkerLimits(timeout_s=STARTUP_TIMEOUT_S,
                                         memory_mib=STARTUP_MEMORY_MIB)
            self.job = worker.ForkedWorker(startup_answer, (config, recipe, allow_import, te,
                                                            str(location.root)),
                                           limits, _describe(location, "start-up checks"),
                                           kinds=(StartupAnswer,), import_path=path)

    def result(self) -> StartupAnswer | str:
        """Upstream's answer, or why there is none (a line for the report's header)."""
        if self.job is None:
            return f"not run: {self.skipped}"
        try:
            answer = self.job.result()
        except (worker.Deadline, Exception) as exc:  # noqa: BLE001 - said, not fatal
            return f"not run: {printable(str(exc))[:300]}"
        if not isinstance(answer, StartupAnswer):
            return "not run: the worker's result was not an answer"
        return answer

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()


_NAMES = re.compile(r"--[a-z0-9][a-z0-9-]*|\b[a-z][a-z0-9_]*_[a-z0-9_]+\b")


def refusal_error(config: "ModelConfig", location: "MegatronLocation", refusal: str
                  ) -> InputError:
    """Exit 2 with upstream's message, at the file and line of the first setting it names."""
    file, line, key = config.file, None, None
    for word in _NAMES.findall(refusal):
        found = _flag_line(config, word) if word.startswith("--") else None
        if found is not None:
            line, key = found, word
            break
        field = word[2:].replace("-", "_") if word.startswith("--") else word
        where = config.where(field)
        if where[1] is not None:
            (file, line), key = where, field
            break
    version = location.version or "(version unknown)"
    return InputError(f"Megatron {version} at {location.root} refuses this config at start-up "
                      f"(its own checks, no model built): {refusal}", file=file, line=line,
                      key=key)


def _flag_line(config: "ModelConfig", flag: str) -> int | None:
    """The line of the launch script or MODEL_ARGS file that passes `flag` (the last one,
    which argparse keeps)."""
    words = (config.source.argv or []) if config.source is not None else []
    lines = [word.line for word in words if getattr(word, "text", None) == flag]
    return lines[-1] if lines else None
