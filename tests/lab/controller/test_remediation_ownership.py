"""External node remediation owns only what it created, and survives a crash: a controller killed right after
recording a RemediateNode decision leaves no object, and the next one creates it; a remediation object
another remediator created for the node is never adopted nor deleted, and an administrator's taint
outlives devheal's lift."""

from __future__ import annotations

import contextlib

from devheal.controller.node_remediation import CREATED_STEP, REMEDIATION_MARK
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import WaitTimeout, wait_until
from devheal.model.cluster import OWNED_TAINT_KEY

from ..conftest import RecordingFaults
from .conftest import ControllerHarness
from .crash_after_intent import EXIT_STATUS as CRASH_EXIT_STATUS
from .test_node_remediation import GV, install_fake_remediator

REMEDIATIONS_OF_NODES = api_path(GV, "fakeremediations", namespace="default")
TEMPLATE = {"apiVersion": GV, "kind": "FakeRemediationTemplate", "name": "reboot", "namespace": "default"}
ADMIN_TAINT = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}


async def external(kube: KubeClient, node: str) -> dict | None:
    try:
        return await kube.get(f"{REMEDIATIONS_OF_NODES}/{node}")
    except errors.NotFound:
        return None


async def remove_external(kube: KubeClient, node: str) -> None:
    with contextlib.suppress(errors.NotFound):
        await kube.delete(f"{REMEDIATIONS_OF_NODES}/{node}")


async def wait_idle(kube: KubeClient, node: str) -> None:
    async def pods_on_node() -> list[dict]:
        items, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={node}"})
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    # Pods of earlier tests' namespaces may still be going away: the node must be idle.
    await wait_until(pods_on_node, lambda ps: not ps, timeout=60, what=f"{node} idle")


def node_remediation(records: list[dict], node: str) -> list[dict]:
    return [r for r in records if r["spec"]["action"] == "RemediateNode" and r["spec"]["target"]["name"] == node]


async def test_a_node_remediation_killed_before_its_object_was_created_is_completed_by_the_next_controller(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    node = "gpu-node-001"
    await install_fake_remediator(kube)
    await remove_external(kube, node)
    await harness.label_nodes(node)
    await harness.policy(
        {
            "node": {"taint": False, "capacityGapAfter": "1s", "remediateAfter": "1s", "template": TEMPLATE},
            "budgets": {"maxUnhealthyNodes": 1},
        },
        nodes_only=True,
    )
    await wait_idle(kube, node)
    try:
        first = harness.start(crash_after_intent=True)
        for gpu in range(8):
            faults.xid(node, gpu, 79)

        async def returncode() -> int | None:
            return first.proc.poll()

        await wait_until(returncode, lambda rc: rc is not None, timeout=30, what="the first controller dies")
        assert first.proc.returncode == CRASH_EXIT_STATUS, first.output()
        (record,) = node_remediation(await harness.remediations(), node)
        assert record["status"]["phase"] == "InProgress"
        assert await external(kube, node) is None, "killed before creating the object"

        second = harness.start()
        try:
            obj = await wait_until(
                lambda: external(kube, node), lambda o: o is not None, timeout=30, what="the resumed record's object"
            )
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n{second.output()[-4000:]}") from exc
        assert obj is not None
        assert obj["metadata"]["annotations"][REMEDIATION_MARK] == record["metadata"]["name"]
        # The controller creates the object first and records the step after it: wait for the step.
        resumed = await harness.wait_remediation(
            lambda rs: (
                [s["name"] for r in node_remediation(rs, node) for s in r["status"].get("steps") or []]
                == [CREATED_STEP]
            ),
            "the resumed record's step",
        )
        (record,) = node_remediation(resumed, node)
        assert record["status"]["phase"] == "InProgress"

        for gpu in range(8):
            faults.recover(node, gpu)
        await wait_until(lambda: external(kube, node), lambda o: o is None, timeout=30, what="object removed")
        done = await harness.wait_remediation(
            lambda rs: [r["status"]["phase"] for r in node_remediation(rs, node)] == ["Succeeded"],
            "the resumed remediation completed",
        )
        assert node_remediation(done, node)[0]["status"]["reason"] == "NodeRecovered"
    finally:
        await remove_external(kube, node)


async def test_someone_elses_remediation_object_and_taint_survive_devhealing(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    node = "gpu-node-000"
    await install_fake_remediator(kube)
    await remove_external(kube, node)
    theirs = await kube.create(
        REMEDIATIONS_OF_NODES,
        {
            "apiVersion": GV,
            "kind": "FakeRemediation",
            "metadata": {"name": node, "labels": {"remediation.medik8s.io/nhc": "gpu-nodes"}},
            "spec": {"strategy": "Reprovision"},
        },
    )
    node_path = api_path("v1", "nodes", name=node)
    before = await kube.get(node_path)
    await kube.patch(node_path, {"spec": {"taints": [*(before["spec"].get("taints") or []), ADMIN_TAINT]}})
    await harness.label_nodes(node)
    await harness.policy(
        {
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "1s",
                "holdDown": "1s",
                "template": TEMPLATE,
            },
            "budgets": {"maxUnhealthyNodes": 1},
        },
        nodes_only=True,
    )
    await wait_idle(kube, node)
    try:
        harness.start()
        for gpu in range(8):
            faults.xid(node, gpu, 79)
        records = await harness.wait_remediation(
            lambda rs: [r.get("status", {}).get("phase") for r in node_remediation(rs, node)] == ["Failed"],
            "the node remediation refused to adopt the object",
            timeout=30,
        )
        assert node_remediation(records, node)[0]["status"]["reason"] == "ForeignRemediation"
        for gpu in range(8):
            faults.recover(node, gpu)

        async def taints() -> list[dict]:
            return list((await kube.get(node_path))["spec"].get("taints") or [])

        left = await wait_until(
            taints,
            lambda ts: not any(t["key"] == OWNED_TAINT_KEY for t in ts),
            timeout=30,
            what="devheal's taint lifted",
        )
        assert ADMIN_TAINT in left, "the administrator's taint stays"
        obj = await external(kube, node)
        assert obj is not None and obj["metadata"]["uid"] == theirs["metadata"]["uid"], "never deleted"
        assert REMEDIATION_MARK not in (obj["metadata"].get("annotations") or {}), "never marked as devheal's"
    finally:
        await remove_external(kube, node)
        current = await kube.get(node_path)
        current["spec"]["taints"] = [t for t in current["spec"].get("taints") or [] if t["key"] != ADMIN_TAINT["key"]]
        await kube.replace(node_path, current)
