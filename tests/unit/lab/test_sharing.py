"""Shared GPUs on a simulated node: slots allocated lowest first, a failed GPU fails its slots, a MIG instance
fails alone, and a busy node is not reconfigured."""

from __future__ import annotations

import pytest

from devheal.lab.devices import AdmissionError, Holder, SimulatedNodeGpus
from devheal.lab.sharing import sharing_fault

NOW = 1000.0


def holder(pod: str) -> Holder:
    return Holder("ns", pod, f"uid-{pod}", "main")


def test_time_slicing_replicas_share_a_gpu_and_fail_with_it() -> None:
    nd = SimulatedNodeGpus.create("n1", 2, "H100")
    sharing_fault(nd, "share", {"replicas": 4})
    assert (nd.capacity(NOW), nd.allocatable_count(NOW)) == (8, 8)
    ids = [nd.allocate(holder(f"p{i}"), 1, NOW)[0] for i in range(4)]
    assert ids == [f"{nd.devices[0].uuid}::{n}" for n in range(4)]
    assert nd.by_uuid(ids[2]) is nd.devices[0] and nd.holders() == {f"uid-p{i}" for i in range(4)}
    nd.inject_xid(0, 79, NOW)
    assert nd.allocatable_count(NOW) == 4
    assert nd.allocate(holder("next"), 1, NOW) == (f"{nd.devices[1].uuid}::0",)
    assert nd.release("uid-p1") == (ids[1],)
    with pytest.raises(ValueError, match="has pods holding GPUs"):
        sharing_fault(nd, "share", {"replicas": 1})


def test_a_mig_instance_fails_alone_and_recovers_with_its_gpu() -> None:
    nd = SimulatedNodeGpus.create("n1", 1, "H100")
    sharing_fault(nd, "share", {"replicas": 2, "profile": "3g.40gb"})
    assert nd.sharing is not None and nd.sharing.resource == "nvidia.com/mig-3g.40gb"
    a, b = nd.allocate(holder("a"), 1, NOW)[0], nd.allocate(holder("b"), 1, NOW)[0]
    assert (a, b) == (f"MIG-{nd.devices[0].uuid}/1/0", f"MIG-{nd.devices[0].uuid}/2/0")
    assert sharing_fault(nd, "instance-fault", {"gpu": 0, "instance": 0}) == {nd.devices[0].uuid}
    assert nd.sharing.health(nd, a)[0] == "Unhealthy" and nd.sharing.health(nd, b) == ("Healthy", "")
    assert nd.allocatable_count(NOW) == 1
    nd.recover(0)
    assert nd.sharing.health(nd, a) == ("Healthy", "")
    nd.release("uid-a")
    nd.release("uid-b")
    with pytest.raises(AdmissionError, match=r"nvidia\.com/mig-3g\.40gb"):
        nd.allocate(holder("c"), 3, NOW)
    with pytest.raises(ValueError, match=r"MIG profile must look like 3g\.40gb"):
        sharing_fault(nd, "share", {"replicas": 2, "profile": "big"})
    with pytest.raises(ValueError, match="no instance 5"):
        sharing_fault(nd, "instance-fault", {"gpu": 0, "instance": 5})
