"""The ranks' gather of the guard's verdict (qaudit/guard/verdict.py) in a real two-rank gloo
group: it works in a job whose Python has no numpy (torch does not require it, and torch's
all_gather_object decodes through numpy: every rank's gather failed, reported as "another
rank of the job ended first", so in stop mode the guard's own failure came out as torchrun's
exit 1). Synchronised by the file store the ranks meet in; each rank is its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RANK = """
import json, sys
sys.modules["numpy"] = None  # a Python without numpy
import torch
import torch.distributed as dist
from qaudit.guard import verdict
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
try:
    torch.zeros(1).numpy()
    print("numpy present")
except RuntimeError:
    pass
part = {"rank": rank, "said": "x" * (10 if rank else 5000), "nested": [rank, {"ok": True}]}
parts = verdict.gather(part)
print(json.dumps(parts))
dist.destroy_process_group()
"""


@pytest.mark.slow  # torchrun and its ranks: processes importing torch (CI runs it)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo over a file store")
def test_the_gather_needs_no_numpy(tmp_path):
    store = tmp_path / "store"
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=600) for rank in ranks]
    for rank, (out, err) in zip(ranks, outputs):
        assert rank.returncode == 0, err[-3000:]
        assert "numpy present" not in out
        parts = json.loads(out.strip().splitlines()[-1])
        assert [p["rank"] for p in parts] == [0, 1]
        assert len(parts[0]["said"]) == 5000 and parts[1]["nested"] == [1, {"ok": True}]
