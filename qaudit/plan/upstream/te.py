"""`--te auto|main|VERSION`: the Transformer Engine behaviour a verdict is for.

`auto` reads the version of the TE this Python would import, from its distribution's metadata
beside the package (or the package's own version file), without importing it: importing TE
loads its CUDA extension, and the audit must not initialise CUDA to name a version. With no
TE importable, the audit is for the newest release qaudit knows, and says so.

What changes between versions is data here (`TEBehaviour`), each boundary read in TE's
tagged sources (docs/te-settings.md lists the files):

- `overwrite_main_grad` on a weight: ignored before v2.9 (TE PR #2191), read in backward from
  v2.9 to v2.14.1, read at forward and saved since v2.15 (TE PR #2549). qaudit's weights
  carry the attribute for the whole run, so "backward" and "forward" give the same result for
  `Linear`, whose backward reads the parameter. `LayerNormLinear` and `GroupedLinear` from
  v2.9 to v2.14.1 read it in backward from the weight tensor their GEMM used, saved at
  forward: the parameter itself in high precision (or when it is stored quantized,
  `fp8_param`), but under an FP8/FP4 recipe the quantized copy, which has no such attribute,
  so they accumulate as the flag says (docs/te-runtime.md, "What TE's own code showed").
- delayed weight gradients (`delay_wgrad_compute`): since v2.3; `backward_dw` runs the
  module's wgrad hooks (the ones Megatron's DDP registers) since v2.7.
- CUDA graphs: before v2.14 `make_graphed_callables` set every `is_first_microbatch`
  attribute back to True after warm-up (removed by TE PR #2715), so a capture that follows
  warm-up saw the armed flag.
- CUDA graphs under fp8/fp4: `GroupedLinear.forward` (module/grouped_linear.py) takes the
  skip-weight-update tensor while a graph is being captured, and then passes
  `is_first_microbatch=False`, in v2.9 and before and again since v2.17 (TE PRs #3052, #3065,
  fixing TE issue #3051). From v2.10 (TE PR #2377 rewrote the call) to v2.16.1 it hands
  `_GroupedLinear` a literal None in that argument's place and never reads the capture state,
  so the graph records the weight cast without the switch, with whatever flag the caller
  passed at capture (QA008).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from qaudit.errors import InputError
from qaudit.plan.upstream.bounded import (RefusedRead, home_expanded, is_dir, is_file,
                                          names_a_path, read_text, shown)
from qaudit.plan.upstream.dist_info import VersionRead, dist_info_version, plausible_version

# TE releases whose Python sources qaudit's facts were read in: every tag from v1.9 (the
# first with GroupedLinear) to v2.18, and the 2.20.2 wheel from the package index.
TE_RELEASES = ("1.9", "1.10", "1.11", "1.12", "1.13", "2.0", "2.1", "2.2", "2.2.1", "2.3",
               "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14",
               "2.14.1", "2.15", "2.16", "2.16.1", "2.17", "2.17.1", "2.18", "2.19", "2.20.2")
NEWEST_TE = TE_RELEASES[-1]
TE_MAIN = "main"
TE_MAIN_VERSION = "2.20.0.dev0"  # TE main at commit d0067d0da6, as read
CHOOSE_TE_HINT = "pass --te VERSION for the Transformer Engine you run"
# v2.9 to v2.14.1: `getattr(weight, "overwrite_main_grad")` in `_LayerNormLinear.backward` and
# `getattr(weights[0], ...)` in `_GroupedLinear.backward`, where `weight(s)` is what forward
# saved for the GEMM (`weightmat`, `weights_fp8`); `_Linear.backward` reads the parameter.
OVERWRITE_READ_FROM_GEMM_WEIGHT = ("layernorm_linear", "grouped_linear")
# [first, fixed): the releases whose GroupedLinear drops the graph-capture skip flag (TE #3051).
GROUPED_SKIP_FLAG_DROPPED = ((2, 10), (2, 17))
# [first, fixed): the releases whose GroupedLinear module, with `single_grouped_weight`, hands
# the grouped parameter's member tensors (no autograd link to it) to its GEMMs, so the
# parameter gets no weight gradient (TE #3234, fixed by PR #3224 in 2.19).
GROUPED_SINGLE_WEIGHT_SPLIT = ((2, 14), (2, 19))
# [first, fixed): the releases whose fused grouped-MLP backward (ops/fused/
# backward_grouped_mlp.py) computes a single grouped weight's gradient into a scratch buffer
# when the parameter has `overwrite_main_grad`, never into main_grad (TE PR #2936, in 2.15).
FUSED_GROUPED_MLP_OVERWRITE_SCRATCH = ((2, 14), (2, 15))


def te_version_key(version: str) -> tuple[int, ...] | None:
    """(2, 20, 2) for '2.20.2', '2.20.2+cu12', 'v2.20'; None when it is no version."""
    # Bounded digits: int() of thousands of digits raises, and no release number is that long.
    match = re.match(r"^v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?(?!\d)", version.strip()[:64])
    if not match:
        return None
    return tuple(int(part) for part in match.groups(default="0"))


@dataclass(frozen=True)
class TEBehaviour:
    """What one TE version does with the settings qaudit models."""

    overwrite_main_grad: str  # "ignored" | "backward" | "forward"
    # Module kinds (the runtime's names) whose backward reads overwrite_main_grad from the
    # tensor the GEMM used, not from the parameter: a quantized copy hides it.
    overwrite_read_from_gemm_weight: frozenset[str]
    delay_wgrad: bool  # delay_wgrad_compute exists (WeightGradStore, backward_dw)
    delay_wgrad_hooks: bool  # backward_dw runs the registered wgrad hooks
    graph_warmup_rearms: bool  # make_graphed_callables re-arms is_first_microbatch after warm-up
    # GroupedLinear passes TE's skip-weight-update flag on during a quantized graph capture.
    grouped_linear_graph_skip_flag: bool
    # GroupedLinear(single_grouped_weight=True) gives its grouped parameter a weight gradient.
    single_grouped_weight_wgrad: bool = True
    # The op fuser's fused grouped-MLP backward writes a single grouped weight's main_grad
    # when the parameter has overwrite_main_grad (Megatron-FSDP).
    fused_grouped_mlp_overwrites_main_grad: bool = True

    @property
    def reads_overwrite_main_grad(self) -> bool:
        return self.overwrite_main_grad != "ignored"


def te_behaviour(version: str) -> TEBehaviour:
    key = te_version_key(version) or te_version_key(NEWEST_TE)
    return TEBehaviour(
        overwrite_main_grad=("ignored" if key < (2, 9) else
                             "backward" if key < (2, 15) else "forward"),
        overwrite_read_from_gemm_weight=(frozenset(OVERWRITE_READ_FROM_GEMM_WEIGHT)
                                         if (2, 9) <= key < (2, 15) else frozenset()),
        delay_wgrad=key >= (2, 3),
        delay_wgrad_hooks=key >= (2, 7),
        graph_warmup_rearms=key < (2, 14),
        grouped_linear_graph_skip_flag=not (GROUPED_SKIP_FLAG_DROPPED[0] <= key
                                            < GROUPED_SKIP_FLAG_DROPPED[1]),
        single_grouped_weight_wgrad=not (GROUPED_SINGLE_WEIGHT_SPLIT[0] <= key
                                         < GROUPED_SINGLE_WEIGHT_SPLIT[1]),
        fused_grouped_mlp_overwrites_main_grad=not (
            FUSED_GROUPED_MLP_OVERWRITE_SCRATCH[0] <= key < FUSED_GROUPED_MLP_OVERWRITE_SCRATCH[1]))


@dataclass(frozen=True)
class TETarget:
    source: str  # "installed" (its metadata read), "named" (--te), "assumed"
    version: str
    location: str | None = None
    note: str | None = None

    @property
    def rule_version(self) -> str:
        """The release number TE's rules are looked up by (main: its development version)."""
        return TE_MAIN_VERSION if self.version == TE_MAIN else self.version

    @property
    def behaviour(self) -> TEBehaviour:
        return te_behaviour(self.rule_version)

    def label(self) -> str:
        if self.version == TE_MAIN:
            return f"Transformer Engine main ({TE_MAIN_VERSION})"
        return f"Transformer Engine {self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version, "label": self.label(),
                "overwrite_main_grad": self.behaviour.overwrite_main_grad,
                "location": self.location, "note": self.note}


def newest_te(note: str | None = None) -> TETarget:
    return TETarget("assumed", NEWEST_TE, note=note)


def resolve_te(spec: str = "auto", search_path: Sequence[str] | None = None) -> TETarget:
    """The TE `--te SPEC` means; an unknown SPEC is an InputError (exit 2)."""
    if spec == "auto":
        return _installed_or_assumed(search_path)
    version = spec[1:] if spec[:1] in ("v", "V") and spec[1:2].isdigit() else spec
    if version.endswith(".0") and version.count(".") == 2 and version[:-2] in TE_RELEASES:
        version = version[:-2]  # 2.10.0 is the release qaudit knows as 2.10
    if version != TE_MAIN and version not in TE_RELEASES:
        if names_a_path(spec):
            return _te_at_path(spec)
        raise InputError(f"--te {spec!r}: not a Transformer Engine release qaudit knows; use "
                         f"auto, main, one of: {', '.join(TE_RELEASES)}, or the directory a "
                         "transformer_engine/ package is in")
    return TETarget("named", version)


def _te_at_path(spec: str) -> TETarget:
    """`--te PATH`: the directory holding `transformer_engine/` (or that package itself), its
    version read as `auto` reads the importable one's."""
    path = home_expanded(spec, "--te")
    if not is_dir(path):
        raise InputError(f"--te {shown(spec)}: no such directory")
    root = path.parent if path.name == "transformer_engine" else path
    found = find_te([str(root)])
    if found is None:
        raise InputError(f"--te {shown(spec)}: no transformer_engine/ package there")
    read = found[1]
    if read.version is None or te_version_key(read.version) is None:
        why = f" ({read.problem})" if read.problem else ""
        raise InputError(f"--te {shown(spec)}: no version in its metadata{why}; "
                         f"{CHOOSE_TE_HINT}")
    return TETarget("named", read.version, location=str(root), note=_newer_note(read.version))


def _installed_or_assumed(search_path: Sequence[str] | None) -> TETarget:
    found = find_te(search_path)
    if found is None:
        return newest_te(f"no Transformer Engine importable, the newest release qaudit knows; "
                         f"{CHOOSE_TE_HINT}")
    root, read = found
    version = read.version
    if version is None or te_version_key(version) is None:
        why = f" ({read.problem})" if read.problem else ""
        return newest_te(f"found Transformer Engine at {shown(root)} but no version in its "
                         f"metadata{why}; {CHOOSE_TE_HINT}")
    return TETarget("installed", version, location=str(root), note=_newer_note(version))


def _newer_note(version: str) -> str | None:
    if te_version_key(version) > te_version_key(NEWEST_TE):
        return (f"newer than the newest release qaudit was checked against ({NEWEST_TE}): "
                "audited with that release's behaviour")
    return None


_DIST_PREFIXES = ("transformer_engine-", "transformer_engine_torch-", "transformer_engine_cu12-",
                  "transformer_engine_cu13-")


def locate_te(search_path: Sequence[str] | None = None) -> tuple[Path, str | None] | None:
    """(sys.path entry holding `transformer_engine/`, its version or None), as `import
    transformer_engine` would find it, without importing anything. The working directory ('')
    is skipped as in qaudit/plan/upstream/detect.py."""
    found = find_te(search_path)
    return None if found is None else (found[0], found[1].version)


def find_te(search_path: Sequence[str] | None = None) -> tuple[Path, VersionRead] | None:
    """`locate_te` with the reason when no version could be read."""
    for entry in search_path if search_path is not None else sys.path:
        if not isinstance(entry, str) or entry in ("", "."):
            continue
        root = Path(entry)
        if is_file(root / "transformer_engine" / "__init__.py"):
            return root, _version_beside(root)
    return None


def _version_beside(root: Path) -> VersionRead:
    """From the distributions' METADATA next to the package: the meta package's first, then
    the framework and core wheels' (all carry the same release number)."""
    problems = []
    for prefix in _DIST_PREFIXES:
        read = dist_info_version(root, prefix)
        if read.version is not None:
            return read
        if read.problem:
            problems.append(read.problem)
    # A source checkout on PYTHONPATH keeps its number in build_tools/VERSION.txt.
    version_file = root / "build_tools" / "VERSION.txt"
    try:
        lines = read_text(version_file, 256).strip().splitlines()
    except RefusedRead as exc:
        return VersionRead(None, "; ".join(problems + ([] if exc.missing else [str(exc)])) or None)
    version = lines[0].strip() if lines else ""
    problem = plausible_version(version) if version else "no version"
    if problem is None:
        return VersionRead(version)
    return VersionRead(None, "; ".join(problems + [f"{shown(version_file)} holds {problem}"]))
