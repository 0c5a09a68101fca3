"""GPU resources the controller counts: configurable names, MIG profiles, and DRA claims a pod names."""

from __future__ import annotations

import pytest

from devheal.controller.dra_projections import project_device_taint_rule, project_resource_slice
from devheal.controller.projections import ProjectionError, project_node, project_pod
from devheal.model.dra import DraDevice, device_taint_rule
from devheal.model.gpu_resources import GpuResources


def gpu_pod(limits: dict[str, str]) -> dict:
    return {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "a", "resources": {"limits": limits}}, {"name": "b"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-1"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2p"}]},
    }


def test_mig_instances_and_configured_resources_count_as_gpus() -> None:
    assert project_pod(gpu_pod({"nvidia.com/mig-1g.10gb": "2", "cpu": "4"})).gpu_request == 2
    assert project_pod(gpu_pod({"amd.com/gpu": "1"})).gpu_request == 0
    amd = GpuResources(("amd.com/gpu",))
    assert project_pod(gpu_pod({"amd.com/gpu": "1"}), gpu=amd).gpu_request == 1
    node = {
        "metadata": {"name": "n1"},
        "status": {
            "capacity": {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "4", "cpu": "96"},
            "allocatable": {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "3"},
        },
    }
    projected = project_node(node)
    assert (projected.gpu_capacity, projected.gpu_allocatable, projected.gpu_gap) == (8, 7, 1)
    with pytest.raises(ValueError, match="not an extended resource name"):
        GpuResources(("gpu",))


def test_a_pods_claims_and_a_slices_devices_and_devheals_rules_are_read() -> None:
    assert project_pod(gpu_pod({})).claims == (("gpu", "p-gpu-x7k2p"),)
    slice_obj = {
        "metadata": {"name": "n1-gpu.devheal.io"},
        "spec": {
            "driver": "gpu.devheal.io",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}},
                {
                    "name": "gpu-1",
                    "taints": [
                        {
                            "key": "gpu.devheal.io/unhealthy",
                            "effect": "NoSchedule",
                            "timeAdded": "2026-01-01T00:00:00Z",
                        },
                        {"key": "soft", "effect": "PreferNoSchedule"},
                    ],
                },
            ],
        },
    }
    healthy, tainted = project_resource_slice(slice_obj)
    assert (healthy.device.id, healthy.uuid, healthy.driver_taints) == ("gpu.devheal.io/n1/gpu-0", "GPU-0", ())
    assert tainted.driver_taints == ("gpu.devheal.io/unhealthy",) and tainted.since is not None
    with pytest.raises(ProjectionError, match=r"ResourceSlice n1-gpu.devheal.io: spec.devices\[0\].name"):
        project_resource_slice({**slice_obj, "spec": {**slice_obj["spec"], "devices": [{}]}})

    rule = device_taint_rule(DraDevice("gpu.devheal.io", "n1", "gpu-1"), "NoSchedule", "XID 79")
    rule["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    quarantine = project_device_taint_rule(rule)
    assert quarantine is not None and quarantine.device.id == "gpu.devheal.io/n1/gpu-1"
    foreign = {**rule, "metadata": {**rule["metadata"], "labels": {}}}
    assert project_device_taint_rule(foreign) is None
    rule["spec"]["deviceSelector"]["device"] = "gpu-2"
    with pytest.raises(ProjectionError, match=r"does not name the device spec\.deviceSelector selects"):
        project_device_taint_rule(rule)
