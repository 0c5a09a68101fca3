"""Shared GPUs: replicas and MIG instances map to their physical GPU; a GPU-wide fault fails every pod on it,
an instance's fault only its own pods."""

from __future__ import annotations

from devheal.engine.findings import detect, report_mismatches
from devheal.model.cluster import DeviceHealth
from devheal.model.gpu_resources import GpuResources, mig_profile, physical_id
from devheal.model.plan import FindingKind

from .builders import NOW, device, node, pod, policy, report, reported, view

GPU = "GPU-4f7c2a10-9a1e-4c1b-8d7e-2b3c4d5e6f70"


def test_device_ids_map_to_their_physical_gpu() -> None:
    assert physical_id(f"{GPU}::3") == GPU
    assert physical_id(f"MIG-{GPU}/1/0") == GPU
    assert physical_id("MIG-8d2e0c1a-0000-4000-8000-000000000001") == "MIG-8d2e0c1a-0000-4000-8000-000000000001"
    assert physical_id("a::b") == "a::b" and physical_id("gpu.devheal.io/n1/gpu-0") == "gpu.devheal.io/n1/gpu-0"
    assert mig_profile("nvidia.com/mig-1g.10gb") == "1g.10gb" and mig_profile("nvidia.com/mig-x") is None
    assert GpuResources().is_gpu("nvidia.com/mig-7g.80gb") and not GpuResources(mig=False).is_gpu(
        "nvidia.com/mig-7g.80gb"
    )


def failed_pods(findings: list) -> list[str]:
    return sorted(f.pod for f in findings if f.kind is FindingKind.DEVICE_FAILED)


def test_a_gpu_wide_fault_the_agent_reports_fails_every_pod_sharing_the_gpu() -> None:
    replicas = [pod(f"r{i}", "n1", devices=[device(f"{GPU}::{i}")]) for i in range(3)]
    instances = [pod(f"m{i}", "n1", devices=[device(f"MIG-{GPU}/{i}/0")]) for i in range(2)]
    other = pod("other", "n1", devices=[device("GPU-other::0")])
    v = view([node("n1", gpus=8)], [*replicas, *instances, other], [report("n1", reported(GPU, pod="default/r1"))])
    assert failed_pods(detect(v, [policy()], NOW)) == [
        "default/m0",
        "default/m1",
        "default/r0",
        "default/r1",
        "default/r2",
    ]
    assert report_mismatches(v, NOW) == [], "the agent naming a pod on a replica of the GPU is no mismatch"


def test_a_mig_instance_fault_fails_only_its_own_pods() -> None:
    mine = pod("mine", "n1", devices=[device(f"MIG-{GPU}/1/0", DeviceHealth.UNHEALTHY)])
    sibling = pod("sibling", "n1", devices=[device(f"MIG-{GPU}/2/0")])
    v = view([node("n1", gpus=7)], [mine, sibling])
    assert failed_pods(detect(v, [policy()], NOW)) == ["default/mine"]
    reported_instance = view([node("n1", gpus=7)], [mine, sibling], [report("n1", reported(f"MIG-{GPU}/1/0"))])
    assert failed_pods(detect(reported_instance, [policy()], NOW)) == ["default/mine"]
