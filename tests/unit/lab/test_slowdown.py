"""What ``faults.degrade`` does to the workload: the pod holding a degraded GPU reads its slowdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devheal.lab.devices import Holder, SimulatedNodeGpus
from devheal.lab.slowdown import DEVICES_ENV, POD_ENV, PodSlowdown, pod_slowdown


def state(*nodes: SimulatedNodeGpus) -> dict[str, object]:
    return {"updated": 0.0, "nodes": {nd.node: nd.to_json(0.0) for nd in nodes}}


def test_the_pod_holding_a_degraded_gpu_is_slowed_by_its_factor() -> None:
    a, b = SimulatedNodeGpus.create("a", 2, "H100"), SimulatedNodeGpus.create("b", 2, "H100")
    a.allocate(Holder("ml", "rank-0", "uid-0", "train"), 2, 0.0)
    b.allocate(Holder("ml", "rank-1", "uid-1", "train"), 1, 0.0)
    a.degrade(1, 1.3)
    saved = state(a, b)
    assert pod_slowdown(saved, "ml", "rank-0") == 1.3
    assert pod_slowdown(saved, "ml", "rank-1") == 1.0
    assert pod_slowdown(saved, "other", "rank-0") == 1.0
    b.degrade(1, 2.0)  # a free GPU slows nobody
    assert pod_slowdown(state(a, b), "ml", "rank-1") == 1.0


@pytest.mark.parametrize("bad", [None, [], {"nodes": []}, {"nodes": {"a": {"devices": [None, {"holder": 1}]}}}])
def test_malformed_state_slows_nothing(bad: object) -> None:
    assert pod_slowdown(bad, "ml", "rank-0") == 1.0


def test_the_file_is_followed_as_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "devices.json"
    monkeypatch.setenv(DEVICES_ENV, str(path))
    monkeypatch.setenv(POD_ENV, "ml/rank-0")
    reader = PodSlowdown.from_env()
    assert reader.factor() == 1.0  # no file yet
    node = SimulatedNodeGpus.create("a", 1, "H100")
    node.allocate(Holder("ml", "rank-0", "uid-0", "train"), 1, 0.0)
    node.degrade(0, 1.5)
    path.write_text(json.dumps(state(node)))
    assert reader.factor() == 1.5
    path.write_text("{")  # half-written
    assert reader.factor() == 1.5
    node.recover(0)
    path.write_text(json.dumps(state(node)) + " ")
    assert reader.factor() == 1.0


def test_without_the_environment_nothing_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEVICES_ENV, raising=False)
    monkeypatch.delenv(POD_ENV, raising=False)
    assert PodSlowdown.from_env().factor() == 1.0
