"""TE's own GroupedLinear on qaudit's CPU kernel stand-in, without the guard: does a single
grouped weight parameter get a weight gradient? (TE issue #3234, rule QA050.)

Run as a script in a process whose sys.path holds one TE release's Python:
`python tests/te_single_grouped_weight.py OUT.json`. For grouped experts with fused wgrad
accumulation it runs one forward and backward with per-expert weights (the control) and
with one grouped weight (`single_grouped_weight=True`), and writes, per layout, whether
main_grad was written, whether .grad was set, and whether the input got its gradient.
tests/test_te_single_grouped_weight.py runs it per fetched release.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# TE 2.15+ turn single_grouped_weight off without it (utils.resolve_grouped_linear_single_param_flags).
os.environ["NVTE_GROUPED_LINEAR_SINGLE_PARAM"] = "1"

import torch  # noqa: E402

from qaudit.runtime import select_runtime  # noqa: E402

EXPERTS, WIDTH, ROWS = 2, 16, 8


def run(runtime, single: bool) -> dict:
    cls = runtime._classes["grouped_linear"]
    module = cls(EXPERTS, WIDTH, WIDTH, fuse_wgrad_accumulation=True, bias=False,
                 params_dtype=torch.float32, device=runtime.device, single_grouped_weight=single)
    # What TERuntime._construct attaches: the runtime's forward wrapper looks for it.
    module._qaudit_runtime, module._qaudit_kind = runtime, "grouped_linear"
    weights = [p for name, p in module.named_parameters() if name.startswith("weight")]
    for weight in weights:
        weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)
        weight.grad_added_to_main_grad = False
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    module(x, [ROWS // EXPERTS] * EXPERTS, is_first_microbatch=None).sum().backward()
    return {"parameters": len(weights),
            "main_grad_written": all(bool(w.main_grad.abs().sum() > 0) for w in weights),
            "grad_set": all(w.grad is not None for w in weights),
            "input_grad": x.grad is not None}


def main(argv: list[str]) -> int:
    runtime = select_runtime("te", "cpu")
    result = {"te": runtime.api.version, "per_expert": run(runtime, False),
              "single_grouped_weight": run(runtime, True)}
    Path(argv[0]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
