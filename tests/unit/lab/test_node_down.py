"""The node simulator's ``node-down`` fault: kwok's Lease for the node goes to another holder, its pods are left alone.

The lab test (tests/lab/launch/test_lost_nodes.py) shows the controller manager marking such a node
Unknown; here, what the fault writes, and that ``node-up`` removes only a Lease it took.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devheal.kube import errors
from devheal.lab.nodesim.faultapi import DOWN_HOLDER, DOWN_LEASE_SECONDS, FaultAPI, lease_path
from devheal.lab.nodesim.kubelet import DOWN_RECHECK_SECONDS, Kubelet
from devheal.lab.nodesim.nodestatus import NodeStatus
from devheal.lab.nodesim.pods import PodView
from devheal.lab.nodesim.store import NodeStore
from devheal.model.times import parse_time

NODE = "gpu-node-000"


class RecordingClient:
    """The API calls the simulator makes, and the Lease it reads."""

    def __init__(self, lease: dict[str, Any] | None) -> None:
        self.lease = lease
        self.calls: list[tuple[str, str, Any]] = []

    async def patch(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.calls.append(("PATCH", path, body))
        if path == lease_path(NODE) and self.lease is None:
            raise errors.NotFound(f"{path} not found")
        return {}

    async def get(self, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append(("GET", path, None))
        if self.lease is None:
            raise errors.NotFound(f"{path} not found")
        return self.lease

    async def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        self.calls.append(("DELETE", path, body))
        return {}


def simulator(tmp_path: Path, client: RecordingClient) -> FaultAPI:
    store = NodeStore(tmp_path / "devices.json")
    store.load_or_create(1, 8, "NVIDIA H100 80GB HBM3")
    status = NodeStatus(client, store)  # type: ignore[arg-type]
    return FaultAPI(client, store, status, Kubelet(client, store, status))  # type: ignore[arg-type]


def lease_calls(client: RecordingClient) -> list[tuple[str, Any]]:
    return [(method, body) for method, path, body in client.calls if path == lease_path(NODE)]


async def test_node_down_gives_the_lease_away_and_node_up_removes_it(tmp_path: Path) -> None:
    client = RecordingClient({"metadata": {"uid": "u1"}, "spec": {"holderIdentity": "kwok"}})
    api = simulator(tmp_path, client)
    before = time.time()
    await api.inject(NODE, {"kind": "node-down"})
    ((method, body),) = lease_calls(client)
    assert method == "PATCH"
    spec = body["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == (DOWN_HOLDER, DOWN_LEASE_SECONDS)
    # Its last heartbeat: renewed now, so the controller manager keeps this version of the Lease as the newest.
    assert before - 1 <= parse_time(spec["renewTime"]) <= time.time() + 1, spec
    assert spec["renewTime"].count(".") == 1, "a MicroTime"
    assert api.kubelet.down == {NODE}

    client.calls.clear()
    client.lease = {"metadata": {"uid": "u1"}, "spec": {"holderIdentity": DOWN_HOLDER}}
    await api.inject(NODE, {"kind": "node-up"})
    assert lease_calls(client) == [("GET", None), ("DELETE", {"preconditions": {"uid": "u1"}})]
    assert api.kubelet.down == set()


async def test_node_up_leaves_a_lease_kwok_holds_alone(tmp_path: Path) -> None:
    client = RecordingClient({"metadata": {"uid": "u2"}, "spec": {"holderIdentity": "kwok"}})
    api = simulator(tmp_path, client)
    await api.inject(NODE, {"kind": "node-up"})
    assert lease_calls(client) == [("GET", None)]


async def test_node_down_before_kwok_made_the_lease_is_a_clear_error(tmp_path: Path) -> None:
    api = simulator(tmp_path, RecordingClient(None))
    with pytest.raises(ValueError, match=f"node {NODE} has no Lease in kube-node-lease yet"):
        await api.inject(NODE, {"kind": "node-down"})
    assert api.kubelet.down == set()


async def test_a_pod_on_a_down_node_is_left_as_it_is(tmp_path: Path) -> None:
    client = RecordingClient(None)
    api = simulator(tmp_path, client)
    kubelet = api.kubelet
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pu", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    }

    class Pods:
        def __init__(self) -> None:
            self.store = {"ns/p": PodView.from_obj(pod)}

    kubelet.pods = Pods()  # type: ignore[assignment]
    kubelet.down.add(NODE)
    assert await kubelet.reconcile_pod("ns/p") == DOWN_RECHECK_SECONDS
    assert client.calls == [], "a deleted pod on a down node is neither stopped nor removed"
