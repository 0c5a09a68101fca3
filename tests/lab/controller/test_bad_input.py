"""(h) Malformed or dangling inputs never crash the controller; it keeps remediating real faults."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, gpu_deployment, pod_devices, pods_of, wait_until
from devheal.model.api import GROUP_VERSION

from ..conftest import RecordingFaults
from .conftest import REMEDIATIONS, ControllerHarness


async def test_junk_is_ignored_and_real_faults_still_heal(
    harness: ControllerHarness, kube: KubeClient, namespace: str, faults: RecordingFaults
) -> None:
    await harness.policy({"selector": {"namespaces": [namespace]}, "node": {"taint": False}})
    await kube.create(api_path("apps/v1", "deployments", namespace=namespace), gpu_deployment("inf", replicas=1))
    proc = harness.start()

    # A report for a node that does not exist, naming a pod that does not exist.
    ghost = f"ghost-{harness.id}"
    await kube.create(
        api_path(GROUP_VERSION, "nodedevices"),
        {"apiVersion": GROUP_VERSION, "kind": "NodeDevices", "metadata": {"name": ghost}, "spec": {"nodeName": ghost}},
    )
    await kube.patch(
        api_path(GROUP_VERSION, "nodedevices", name=ghost, subresource="status"),
        {
            "status": {
                "devices": [
                    {
                        "id": "GPU-nope",
                        "index": 0,
                        "health": "Unhealthy",
                        "reasons": [{"source": "xid", "code": 79, "message": "XID 79"}],
                        "pod": {"namespace": namespace, "name": "no-such-pod"},
                    }
                ]
            }
        },
    )
    # A Remediation written by hand that no version of devheal would have written (its name does not
    # come from its spec), pointing at a pod that does not exist.
    await kube.create(
        REMEDIATIONS,
        {
            "apiVersion": GROUP_VERSION,
            "kind": "Remediation",
            "metadata": {"name": f"by-hand-{harness.id}"},
            "spec": {
                "action": "Deschedule",
                "target": {"kind": "Pod", "namespace": namespace, "name": "nobody"},
                "finding": {"kind": "DeviceFailed"},
                "policy": "none",
            },
        },
    )

    async def running() -> list[dict]:
        return [p for p in await pods_of(kube, namespace, "app=inf") if get_path(p, "status", "phase") == "Running"]

    (victim,) = await wait_until(running, lambda ps: len(ps) == 1, timeout=30, what="1 pod")
    node = victim["spec"]["nodeName"]
    device = pod_devices(victim)[0].device_id
    faults.xid(node, faults.gpu_index(node, device), 79)
    await harness.wait_remediation(
        lambda items: any(
            i["spec"]["action"] == "Deschedule"
            and i["spec"]["target"]["name"] == victim["metadata"]["name"]
            and (i.get("status") or {}).get("phase") == "Succeeded"
            for i in items
        ),
        "the real fault remediated",
    )
    assert proc.proc.poll() is None, proc.output()
    assert "Traceback" not in proc.output()
    hand = await kube.get(f"{REMEDIATIONS}/by-hand-{harness.id}")
    assert not hand.get("status"), "a record devheal did not write is left alone"
    await kube.delete(api_path(GROUP_VERSION, "nodedevices", name=ghost))
