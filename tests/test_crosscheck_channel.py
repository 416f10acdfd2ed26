"""The cross-check worker hands back plain data only (issue 38, item 1; docs/security.md).

Upstream's code runs in the worker and may raise anything, a subclass of qaudit's own errors
included, whose `__reduce__` would run code wherever it is unpickled. Nothing of the sort
reaches qaudit's process: the result crosses as JSON of plain values and the dataclasses the
caller names, rebuilt by qaudit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qaudit.crosscheck import RESULT_KINDS, UpstreamSide, plain, worker
from qaudit.crosscheck.facts import BuiltModel, ModuleFacts
from qaudit.errors import EnvironmentProblem, InputError
from test_hostile_round3 import CONFIG, fake_megatron, one_line_exit_3

REPO = Path(__file__).resolve().parent.parent


def _reduce_body(reduce_to: str, marker) -> str:
    """A megatron.core whose import raises a subclass of qaudit's InputError that, unpickled,
    would call `reduce_to` (the payloads of issue 38's item 1)."""
    return f"""\
import os, time
from qaudit.errors import InputError
MARKER = {str(marker)!r}
class Planted(InputError):
    def __reduce__(self):
        return {reduce_to}
raise Planted("planted by upstream's code", file="x.yaml", line=3)
"""


REDUCE_VARIANTS = {
    "os._exit(0)": "(os._exit, (0,))",
    "os._exit(1)": "(os._exit, (1,))",
    "exec": "(exec, (\"open(MARKER, 'w').write('ran in qaudit')\",))",
    "time.sleep(3600)": "(time.sleep, (3600,))",
}


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
@pytest.mark.parametrize("reduce_to", REDUCE_VARIANTS.values(), ids=REDUCE_VARIANTS.keys())
def test_a_planted_reduce_is_exit_3_in_one_line_and_runs_nothing(reduce_to, tmp_path):
    """In a process of its own: were the payload unpickled, os._exit(0) would end the test
    runner itself with 0."""
    marker = tmp_path / "ran"
    tree = fake_megatron(tmp_path / "tree", _reduce_body(reduce_to, marker))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), str(REPO), os.environ.get("PYTHONPATH", "")])}
    # The sleep would be an hour: the subprocess's own timeout tells a hang from a run.
    done = subprocess.run([sys.executable, "-m", "qaudit", "check", CONFIG, "--cross-check",
                           "--cross-check-timeout", "120", "-f", "json"],
                          capture_output=True, text=True, env=environment, cwd=tmp_path,
                          timeout=600)
    one_line_exit_3(done.returncode, done.stdout, done.stderr)
    assert "Planted" in done.stderr
    assert not marker.exists()


def _raise(exc: BaseException):
    raise exc


class _Subclass(InputError):
    pass


def test_only_qaudits_own_error_classes_cross_as_themselves():
    limits = worker.WorkerLimits(timeout_s=60)
    with pytest.raises(InputError) as raised:
        worker.ForkedWorker(_raise, (InputError("bad key", file="a.yaml", line=4, key="k"),),
                            limits, "test").result()
    assert type(raised.value) is InputError
    assert str(raised.value) == "a.yaml:4: key 'k': bad key"
    with pytest.raises(EnvironmentProblem, match="no GPU"):
        worker.ForkedWorker(_raise, (EnvironmentProblem("no GPU"),), limits, "test").result()
    # A subclass is upstream's failure: exit 3, never exit 2 with its own message.
    with pytest.raises(EnvironmentProblem, match="test: _Subclass: odd"):
        worker.ForkedWorker(_raise, (_Subclass("odd"),), limits, "test").result()
    with pytest.raises(EnvironmentProblem, match="_Subclass: odd"):
        worker.run_in_process(_raise, (_Subclass("odd"),), limits, "test")


def _side() -> UpstreamSide:
    facts = ModuleFacts("decoder.layers.0.mlp.linear_fc1", "TELayerNormColumnParallelLinear",
                        "-", "no/yes", "bf16", "yes", "overwrite-first", "-", 2, 0)
    return UpstreamSide(built=BuiltModel([facts], ran=True, notes=["n"]),
                        not_covered=["x"], unknown_fields=["y"])


def test_the_results_records_come_back_equal():
    side = worker.ForkedWorker(_side, (), worker.WorkerLimits(timeout_s=60), "test",
                               kinds=RESULT_KINDS).result()
    assert side == _side() and type(side.built.modules[0]) is ModuleFacts


class _Unnamed:
    pass


@dataclasses.dataclass
class _NotListed:
    x: int = 1


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("result", [_Unnamed(), _NotListed(), {1, 2}, b"bytes", _nested(60)],
                         ids=["object", "unlisted dataclass", "set", "bytes", "deep"])
def test_a_result_that_is_not_plain_is_refused_in_the_worker(result):
    with pytest.raises(EnvironmentProblem, match="could not be handed back"):
        worker.ForkedWorker(lambda: result, (), worker.WorkerLimits(timeout_s=60), "test",
                            kinds=RESULT_KINDS).result()


def _encoded(tree) -> bytes:
    return json.dumps(tree).encode()


@pytest.mark.parametrize("tree", [
    {"record": "os.system", "fields": {}},  # a kind not named
    {"record": "ModuleFacts", "fields": {"name": 1, "upstream_class": "x", "recipe": "-",
                                         "will_execute_quantized": "-"}},  # a field's type
    {"record": "ModuleFacts", "fields": {"__class__": "x"}},  # not a field
    {"record": "ModuleFacts", "fields": {"name": "x"}},  # a required field missing
    {"map": [[[1], 2]]},  # an unhashable key
    {"__reduce__": ["os", "system"]},  # any other object
])
def test_decoding_rebuilds_only_named_records_with_fields_of_their_types(tree):
    with pytest.raises(plain.NotPlain):
        plain.decode(_encoded(tree), RESULT_KINDS)


def test_a_payload_that_is_not_json_or_too_large_is_refused():
    with pytest.raises(plain.NotPlain):
        plain.decode(b"\x80\x04cos\nsystem\n", RESULT_KINDS)  # a pickle
    with pytest.raises(plain.NotPlain):
        plain.decode(b"[" * 100_000 + b"]" * 100_000, RESULT_KINDS)
    with pytest.raises(plain.NotPlain, match="over the"):
        plain.decode(b" " * (plain.MAX_RESULT_BYTES + 1), RESULT_KINDS)


def test_a_worker_announcing_a_huge_result_is_refused_without_reading_it(monkeypatch):
    """The header is read first: a worker claiming more than a result may have is exit 3
    before qaudit holds its bytes."""
    monkeypatch.setattr(plain, "MAX_RESULT_BYTES", 1000)
    monkeypatch.setattr(worker, "_outcome", lambda *_: b"x" * 5_000_000)  # a sender's own
    with pytest.raises(EnvironmentProblem, match="sent a result over the 1000 bytes"):
        worker.ForkedWorker(str, (), worker.WorkerLimits(timeout_s=60), "test").result()


def test_tuples_maps_and_floats_keep_their_shape():
    value = {"a": (1, 2.5, None), 3: [True, float("inf")], (1, "k"): "v"}
    assert plain.decode(plain.encode(value, ()), ()) == value


# --- scripts/fuzz-channel's generator: every hostile payload is refused as NotPlain -------------

def test_a_tuple_holding_a_list_as_a_map_key_is_not_plain():
    payload = json.dumps(["value", {"map": [[{"tuple": [[1]]}, 2]]}]).encode()
    with pytest.raises(plain.NotPlain, match="hashable"):
        plain.decode(payload, RESULT_KINDS)


def test_hostile_channel_payloads_decode_or_are_refused_in_one_line(monkeypatch):
    """A small campaign of scripts/fuzz-channel (seeded): plain data or NotPlain, nothing else
    (an unhashable map key was a TypeError, exit 3 with a traceback's words). The counted
    bounds are lowered for the campaign, so that its payloads around them are thousands of
    items, not millions (most of the quick check's CPU once); the real bounds are held by
    tests/test_hostile_round5.py."""
    import random

    from hostile_inputs4 import channel_payload

    monkeypatch.setattr(plain, "MAX_CONTAINERS", 1_000)
    monkeypatch.setattr(plain, "MAX_ELEMENTS", 4_000)

    script = Path(__file__).resolve().parent.parent / "scripts" / "fuzz-channel"
    namespace: dict = {"__name__": "fuzz_channel", "__file__": str(script)}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    outcomes = [namespace["decode_outcome"](channel_payload(random.Random(f"t:{i}")))
                for i in range(400)]
    assert set(outcomes) == {"plain", "refused"}


def test_a_plain_value_that_is_not_the_build_is_exit_3_in_one_line():
    from qaudit.crosscheck import UpstreamBuilder

    class Job:
        @staticmethod
        def result():
            return {"map": []}

    run = UpstreamBuilder.__new__(UpstreamBuilder)
    run.job, run.location = Job(), type("Location", (), {"version": "0.19.2", "root": "/x"})()
    with pytest.raises(EnvironmentProblem, match="not qaudit's plain data") as raised:
        run._side()
    assert "\n" not in str(raised.value)
