"""(c) GPUs of an idle node fail (all of them, or one: its other GPUs serve nobody while it is kept off new
pods): taint, then an external remediation after the policy's duration; after recovery plus hold-down
everything devheal set is lifted, and meanwhile an Event on the node says why it is still marked."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request

import pytest

from devheal.controller.lift_holds import HELD_EVENT
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import free_port
from devheal.lab.workloads import wait_until
from devheal.model.cluster import OWNED_TAINT_KEY, OWNERSHIP_ANNOTATION

from ..conftest import RecordingFaults
from .conftest import ControllerHarness

GROUP = "remediation.test.devheal.io"
GV = f"{GROUP}/v1"
NODE = "gpu-node-005"


def crd(kind: str) -> dict:
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


async def install_fake_remediator(kube: KubeClient) -> None:
    """A medik8s-style pair: FakeRemediationTemplate (holds the spec) and FakeRemediation (one per node)."""
    for kind in ("FakeRemediationTemplate", "FakeRemediation"):
        body = crd(kind)
        await kube.apply(
            api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=body["metadata"]["name"]), body
        )

    async def established() -> bool:
        try:
            await kube.get(api_path(GV, "fakeremediationtemplates", namespace="default"))
            await kube.get(api_path(GV, "fakeremediations", namespace="default"))
            return True
        except (errors.NotFound, errors.TooManyRequests):  # 429 while the new resource's storage starts
            return False

    await wait_until(established, bool, timeout=20, what="fake remediation CRDs served")
    with contextlib.suppress(errors.AlreadyExists):
        await kube.create(
            api_path(GV, "fakeremediationtemplates", namespace="default"),
            {
                "apiVersion": GV,
                "kind": "FakeRemediationTemplate",
                "metadata": {"name": "reboot"},
                "spec": {"template": {"spec": {"strategy": "Reboot"}}},
            },
        )


@pytest.mark.parametrize("failed", [8, 1], ids=["all-gpus", "one-gpu"])
async def test_idle_node_with_failed_gpus_is_tainted_remediated_and_lifted(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults, failed: int
) -> None:
    await install_fake_remediator(kube)
    with contextlib.suppress(errors.NotFound):  # an earlier test's object must not pass for this one's
        await kube.delete(api_path(GV, "fakeremediations", namespace="default", name=NODE))
    await harness.label_nodes(NODE)
    await harness.policy(
        {
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "3s",
                "holdDown": "2s",
                "template": {
                    "apiVersion": GV,
                    "kind": "FakeRemediationTemplate",
                    "name": "reboot",
                    "namespace": "default",
                },
            },
            "budgets": {"maxUnhealthyNodes": 1},
        },
        nodes_only=True,
    )

    async def pods_on_node() -> list[dict]:
        items, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={NODE}"})
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    # Pods of earlier tests' namespaces may still be going away: the node must be idle.
    await wait_until(pods_on_node, lambda ps: not ps, timeout=60, what=f"{NODE} idle")
    harness.start()
    started = time.monotonic()
    for gpu in range(failed):
        faults.xid(NODE, gpu, 79)

    async def node() -> dict:
        return await kube.get(api_path("v1", "nodes", name=NODE))

    def tainted(n: dict) -> bool:
        return any(t["key"] == OWNED_TAINT_KEY for t in n["spec"].get("taints") or [])

    n = await wait_until(node, tainted, timeout=20, what="devheal's taint on the node")
    assert n["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == "taint"

    async def external() -> dict | None:
        try:
            return await kube.get(api_path(GV, "fakeremediations", namespace="default", name=NODE))
        except errors.NotFound:
            return None

    obj = await wait_until(external, lambda o: o is not None, timeout=30, what="FakeRemediation for the node")
    assert time.monotonic() - started >= 3.0, "not before the policy's remediateAfter"
    assert obj is not None and obj["spec"] == {"strategy": "Reboot"}
    records = await harness.remediations()
    (rem,) = [r for r in records if r["spec"]["action"] == "RemediateNode"]
    assert rem["status"]["phase"] == "InProgress"
    assert rem["spec"]["target"] == {**rem["spec"]["target"], "kind": "Node", "name": NODE}

    for gpu in range(failed):
        faults.recover(NODE, gpu)
    await wait_until(external, lambda o: o is None, timeout=30, what="FakeRemediation removed after recovery")
    n = await wait_until(node, lambda n: not tainted(n), timeout=30, what="taint lifted after hold-down")
    assert OWNERSHIP_ANNOTATION not in (n["metadata"].get("annotations") or {})
    expected = {"Taint": "Succeeded", "RemediateNode": "Succeeded", "Lift": "Succeeded"}

    def phases(records: list[dict]) -> dict[str, str]:
        return {r["spec"]["action"]: r["status"]["phase"] for r in records if r["spec"]["target"]["name"] == NODE}

    # The Lift record's outcome is written after the node: wait for it rather than race it.
    records = await wait_until(
        harness.remediations, lambda rs: phases(rs) == expected, timeout=10, what=f"remediations of {NODE} done"
    )
    assert phases(records) == expected


async def test_a_healthy_node_kept_for_its_hold_down_says_why_and_until_when(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    await harness.label_nodes(NODE)
    await harness.policy({"node": {"taint": True, "capacityGapAfter": "1s", "holdDown": "8s"}}, nodes_only=True)

    async def held() -> list[dict]:
        items, _ = await kube.list_all(
            api_path("v1", "events", namespace="default"), {"fieldSelector": f"involvedObject.name={NODE}"}
        )
        return [e for e in items if e.get("reason") == HELD_EVENT]

    said_before = {e["metadata"]["name"] for e in await held()}  # an earlier test's hold on the node
    harness.start()
    faults.xid(NODE, 0, 79)

    async def node() -> dict:
        return await kube.get(api_path("v1", "nodes", name=NODE))

    def tainted(n: dict) -> bool:
        return any(t["key"] == OWNED_TAINT_KEY for t in n["spec"].get("taints") or [])

    await wait_until(node, tainted, timeout=20, what="devheal's taint on the node")
    faults.recover(NODE, 0)
    events = await wait_until(
        held, lambda es: any(e["metadata"]["name"] not in said_before for e in es), timeout=15, what="the hold said"
    )
    (event,) = [e for e in events if e["metadata"]["name"] not in said_before]
    assert event["type"] == "Normal" and event["involvedObject"]["kind"] == "Node"
    assert "healthy since" in event["message"] and event["message"].endswith("(hold-down 8s)")
    assert tainted(await node()), "held: the taint stays until the hold-down ends"
    await wait_until(node, lambda n: not tainted(n), timeout=30, what="taint lifted after the hold-down")
    assert [e for e in await held() if e["metadata"]["name"] not in said_before] == [event], "said once"


async def test_a_person_puts_a_held_node_back_by_hand_and_devheal_neither_holds_nor_lifts_it(
    harness: ControllerHarness, kube: KubeClient, faults: RecordingFaults
) -> None:
    """controller.md's procedure for a held node (a lemon's 30 days, here a one-hour hold-down): devheal's taint
    and annotation taken off, the node is no longer held, and devheal neither marks it again nor lifts it."""
    await harness.label_nodes(NODE)
    await harness.policy({"node": {"taint": True, "capacityGapAfter": "1s", "holdDown": "1h"}}, nodes_only=True)
    port = free_port()
    harness.start("--metrics-port", str(port))
    node_path = api_path("v1", "nodes", name=NODE)

    async def held() -> str:
        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text: str = response.read().decode()
            return next(
                (line for line in text.splitlines() if line.startswith('devheal_nodes_held{why="hold-down"}')), ""
            )

        try:
            return await asyncio.to_thread(scrape)
        except OSError:
            return ""  # not serving yet

    def ours(n: dict) -> list[dict]:
        return [t for t in n["spec"].get("taints") or [] if t["key"] == OWNED_TAINT_KEY]

    faults.xid(NODE, 0, 79)
    await wait_until(lambda: kube.get(node_path), lambda n: bool(ours(n)), timeout=20, what="devheal's taint")
    faults.recover(NODE, 0)
    await wait_until(held, lambda line: line.endswith(" 1.0"), timeout=20, what="the node held (gauge 1)")

    n = await kube.get(node_path)
    assert n["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == "taint"
    others = [t for t in n["spec"]["taints"] if t not in ours(n)]
    # What a person runs: kubectl taint node NODE devheal.io/device-failure=true:NoSchedule-, then
    # kubectl annotate node NODE devheal.io/owns- (here as merge patches, with the version read).
    await kube.patch(
        node_path,
        {
            "metadata": {
                "resourceVersion": n["metadata"]["resourceVersion"],
                "annotations": {OWNERSHIP_ANNOTATION: None},
            },
            "spec": {"taints": others},
        },
    )
    await wait_until(held, lambda line: line.endswith(" 0.0"), timeout=20, what="no node held any more (gauge 0)")
    n = await kube.get(node_path)
    assert ours(n) == [] and OWNERSHIP_ANNOTATION not in n["metadata"].get("annotations", {}), "devheal marked it again"
    lifts = [r for r in await harness.remediations() if r["spec"]["action"] == "Lift"]
    assert lifts == [], "nothing of devheal's to lift"
