"""scripts/install-torch (run by scripts/setup): which index torch comes from, with a stubbed
pip and no network (issue 45, item 4). The CPU wheel index is played by a server on this
machine's loopback, or by a port nothing listens on."""

from __future__ import annotations

import http.server
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install-torch"
DEAD = "http://127.0.0.1:9/whl/cpu"  # the discard port: connection refused at once

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash script")


def _run(tmp_path: Path, index: str, gpu: bool = False) -> tuple[list[str], str]:
    calls = tmp_path / "pip-calls"
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "pip").write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\n')
    (stub / "pip").chmod(0o755)
    path = os.environ.get("PATH", "")
    if gpu:
        (stub / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (stub / "nvidia-smi").chmod(0o755)
    else:  # whatever this machine has, the script must see no GPU
        (stub / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
        (stub / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PIP=str(stub / "pip"), PYTHON=sys.executable,
               QAUDIT_TORCH_CPU_INDEX=index, PATH=f"{stub}:{path}")
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          check=True)
    return calls.read_text().splitlines(), done.stdout


@pytest.fixture
def cpu_index(tmp_path):
    """A directory served on 127.0.0.1 with a `torch/` page, as PyTorch's index has."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu.whl</a>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_without_a_gpu_the_cpu_index_is_used_when_it_answers(tmp_path, cpu_index):
    calls, out = _run(tmp_path, cpu_index)
    assert calls == [f"install -q --index-url {cpu_index} torch==2.13.0"]
    assert f"from PyTorch's CPU wheel index ({cpu_index})" in out


def test_without_a_gpu_and_no_cpu_index_the_package_index_build_is_installed_and_named(
        tmp_path):
    calls, out = _run(tmp_path, DEAD)
    assert calls == ["install -q torch==2.13.0"]
    lines = out.splitlines()
    assert len(lines) == 1  # one line: which build, from where, its size
    assert lines[0].startswith("torch ") and " build) from the package index (" in lines[0]
    assert f"{DEAD} did not answer" in lines[0] and lines[0].split(": ")[-1].split()[1] == "MiB"


def test_with_a_gpu_the_package_index_torch_is_installed(tmp_path, cpu_index):
    calls, out = _run(tmp_path, cpu_index, gpu=True)
    assert calls == ["install -q torch"]
    assert "from the package index (NVIDIA GPU found)" in out


def test_setup_installs_torch_through_install_torch():
    setup = (REPO / "scripts" / "setup").read_text()
    assert "bash scripts/install-torch" in setup and "pip install -q torch" not in setup
    assert "QAUDIT_TORCH_PROBE_SECONDS:-4" in SCRIPT.read_text()  # CI cannot reach the index


def test_an_index_that_never_answers_is_given_up_after_the_probe_limit(tmp_path):
    """A connection that opens and then hangs (a proxy swallowing traffic): the probe's own
    limit ends it and the package index's build is installed."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # connections queue, nothing is ever sent back
    try:
        os.environ["QAUDIT_TORCH_PROBE_SECONDS"] = "1"
        calls, out = _run(tmp_path, f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu")
    finally:
        os.environ.pop("QAUDIT_TORCH_PROBE_SECONDS", None)
        silent.close()
    assert calls == ["install -q torch==2.13.0"] and "did not answer" in out
