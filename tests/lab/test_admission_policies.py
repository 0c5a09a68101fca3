"""The chart's admission policies against the lab's API server: what the controller's and a launcher's
credentials may write, beyond RBAC's verbs.

The chart's RBAC and ValidatingAdmissionPolicies are installed for real; the writes are sent with the
service accounts' own tokens (a launcher's bound to its pod, as a pod's projected token is), as an
attacker holding them would send them:

- devheal's controller: its node actuators (Taint, Cordon, the degraded taint, spares, Lift) and its
  drain conditions (DrainInProgress, Drained) go through; a node's other labels, other taints,
  podCIDR, other conditions or capacity, someone else's DrainInProgress, a whole-node PUT, a pod's
  other conditions or containers' statuses are refused;
- a launcher: its own pod's devheal.io/launcher-generation, devheal.io/steps and
  devheal.io/launcher-failed, written by the launcher's own code (and by `devheal launch`
  processes restarting a gang in place), go through; a peer's annotations or image, its own
  labels, image or restart generation, and anything from a token bound to no pod are refused.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.controller.degraded_actions import LiftDegraded, TaintDegraded
from devheal.controller.node_actions import Cordon, Lift, Taint
from devheal.controller.node_conditions import CLEARED, DRAINED_NOW, DRAINING, NodeLifecycleWriter
from devheal.controller.spares import Spares
from devheal.engine.spares import SPARE_LABEL, SpareChange
from devheal.kube import errors
from devheal.kube.client import STRATEGIC_PATCH, KubeClient, api_path
from devheal.lab import chart
from devheal.lab.cluster import Lab
from devheal.lab.helm import ensure_helm
from devheal.lab.toolchain import ToolchainError
from devheal.lab.workloads import apply_launcher_rbac, get_path, gpu_pod, pods_of, wait_until
from devheal.launch.gang import KubeGang
from devheal.model.cluster import (
    DEVICE_FAILED_CONDITION,
    LAUNCHER_GENERATION_ANNOTATION,
    OWNED_TAINT_KEY,
    OWNERSHIP_ANNOTATION,
    PLACEMENT_GATE,
    RESTART_GENERATION_ANNOTATION,
)
from devheal.model.node_lifecycle import DEVHEAL_REASON, DRAIN_IN_PROGRESS, DRAINED, MAINTENANCE_PLANNED
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, TargetKind
from devheal.model.policy import ActionKind
from devheal.model.run_failure import RUN_FAILURE_ANNOTATION
from devheal.model.steps import STEPS_ANNOTATION
from tests.lab.sessions import service_account_token, token_kubeconfig

from .launch.conftest import GangHarness
from .test_manifests import PLURALS

SYSTEM = chart.NAMESPACE
INSTALLED = {"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy"}
INSTALLED |= {"ValidatingAdmissionPolicyBinding", "Role", "RoleBinding"}
POLICIES = ("devheal-controller-node-writes", "devheal-controller-pod-status", "devheal-launcher-own-pod")
NODE = "gpu-node-005"
"""A lab node the pods are bound to (nothing runs them: the writes are what is tested)."""
GANG_LABEL = "devheal.io/gang"
Obj = dict[str, Any]


def path_of(doc: Obj) -> str:
    meta = doc["metadata"]
    return api_path(doc["apiVersion"], PLURALS[doc["kind"]], namespace=meta.get("namespace"), name=meta["name"])


async def apply(kube: KubeClient, doc: Obj) -> Obj:
    params = {"fieldManager": "devheal-test", "force": "true"}
    return await kube.request(
        "PATCH", path_of(doc), params=params, body=doc, content_type="application/apply-patch+yaml"
    )


@pytest.fixture
async def chart_installed(kube: KubeClient) -> AsyncIterator[list[Obj]]:
    """The chart's RBAC and admission policies, type-checked without a warning."""
    try:
        ensure_helm()
    except ToolchainError as exc:
        pytest.skip(f"helm could not be built from its Go module: {exc}")
    await apply(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}})
    docs = [d for d in yaml.safe_load_all(chart.render()) if d and d["kind"] in INSTALLED]
    for doc in docs:
        await apply(kube, doc)
    try:
        for name in POLICIES:
            policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)
            checked = await wait_until(
                lambda policy=policy: kube.get(path_of(policy)),  # type: ignore[misc]
                lambda p: "typeChecking" in (p.get("status") or {}),
                timeout=10,
                what=f"policy {name} type-checked",
            )
            assert not (checked["status"]["typeChecking"].get("expressionWarnings") or []), checked["status"]
        yield docs
    finally:
        for doc in reversed(docs):
            if doc["kind"] != "ServiceAccount":
                with contextlib.suppress(errors.NotFound):
                    await kube.delete(path_of(doc))


async def refusal(write: Callable[[], Awaitable[object]]) -> str:
    """The Forbidden message of ``write``, "" when it went through."""
    try:
        await write()
    except errors.Forbidden as exc:
        return str(exc)
    return ""


async def enforced(write: Callable[[], Awaitable[object]], what: str) -> str:
    """Wait until the API server refuses ``write`` (a dry run: it loads a new policy asynchronously)."""
    return await wait_until(lambda: refusal(write), bool, timeout=15, what=what)


def dry_run(
    client: KubeClient, path: str, body: Obj, content_type: str = STRATEGIC_PATCH
) -> Callable[[], Awaitable[Obj]]:
    return lambda: client.request("PATCH", path, params={"dryRun": "All"}, body=body, content_type=content_type)


# ---- the controller ----------------------------------------------------------------------------


@pytest.fixture
async def controller(
    lab: Lab, kube: KubeClient, chart_installed: list[Obj], tmp_path: Path
) -> AsyncIterator[KubeClient]:
    token = await service_account_token(kube, SYSTEM, "devheal-controller")
    client = await KubeClient.connect(str(token_kubeconfig(lab, token, tmp_path / "controller.kubeconfig")))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def node(kube: KubeClient) -> AsyncIterator[str]:
    """A node of its own (no kubelet, no kwok): its labels, taints and podCIDR are the test's."""
    name = f"t-node-{uuid.uuid4().hex[:8]}"
    taint = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    await kube.create(
        api_path("v1", "nodes"),
        {
            "metadata": {"name": name, "labels": {"zone": "a"}, "annotations": {"ops/note": "x"}},
            "spec": {"taints": [taint]},
        },
    )
    try:
        yield name
    finally:
        with contextlib.suppress(errors.NotFound):
            await kube.delete(api_path("v1", "nodes", name=name))


def node_action(kind: ActionKind, node: str, finding: FindingKind = FindingKind.NODE_DEVICES_FAILED) -> Action:
    return Action(
        kind=kind,
        target_kind=TargetKind.NODE,
        target=node,
        node=node,
        finding=Finding(finding, node, (FindingSource.NODE_DEVICES,), "8 of 8 GPUs failed", 0.0),
        policy="p",
        reason="its GPUs failed",
    )


async def test_the_controllers_node_actions_pass_and_nothing_else_of_a_node_does(
    kube: KubeClient, controller: KubeClient, node: str
) -> None:
    path = api_path("v1", "nodes", name=node)
    message = await enforced(
        dry_run(controller, path, {"metadata": {"labels": {"zone": "b"}}}), "the policy to refuse a node's label"
    )
    assert "may only change a node's devheal.io/ labels and annotations" in message

    # The real actuators, as the controller's service account.
    for actuator, kind in (
        (Taint(controller), ActionKind.TAINT),
        (Cordon(controller), ActionKind.CORDON),
        (TaintDegraded(controller), ActionKind.TAINT_DEGRADED),
        (TaintDegraded(controller), ActionKind.FENCE_DEGRADED),
    ):
        await actuator.act(node_action(kind, node), {})
    await Spares(controller).apply(SpareChange(node=node, reserve=True, policy="p", why="pool short"))
    marked = await kube.get(path)
    assert {(t["key"], t["effect"]) for t in marked["spec"]["taints"]} >= {
        ("example.com/maintenance", "NoSchedule"),
        (OWNED_TAINT_KEY, "NoSchedule"),
        ("devheal.io/device-degraded", "NoSchedule"),
        ("devheal.io/spare", "NoSchedule"),
    }
    assert marked["spec"]["unschedulable"] is True and marked["metadata"]["labels"][SPARE_LABEL] == "true"
    assert marked["metadata"]["annotations"][OWNERSHIP_ANNOTATION] == "cordon,degraded,taint"
    await Spares(controller).apply(SpareChange(node=node, reserve=False, policy="p", why="pool full"))
    await Lift(controller).act(node_action(ActionKind.LIFT, node, FindingKind.NODE_RECOVERED), {})
    await LiftDegraded(controller).act(node_action(ActionKind.LIFT_DEGRADED, node, FindingKind.NODE_RECOVERED), {})
    lifted = await kube.get(path)
    assert not lifted["spec"].get("unschedulable")
    assert [t["key"] for t in lifted["spec"]["taints"] if t["key"].startswith("devheal.io/")] == []
    assert lifted["metadata"]["labels"]["zone"] == "a" and SPARE_LABEL not in lifted["metadata"]["labels"]

    # Refused: the node's other labels, annotations and taints, its podCIDR and provider, a whole-node PUT.
    other_taint = {"key": "example.com/evil", "value": "x", "effect": "NoExecute"}
    refused = {
        "a label": ({"metadata": {"labels": {"zone": "b"}}}, "devheal.io/ labels and annotations"),
        "a new label": ({"metadata": {"labels": {"example.com/x": "y"}}}, "devheal.io/ labels and annotations"),
        "an annotation": ({"metadata": {"annotations": {"ops/note": None}}}, "devheal.io/ labels and annotations"),
        "another taint": ({"spec": {"taints": [*lifted["spec"]["taints"], other_taint]}}, "taints of devheal.io/ keys"),
        "someone's taint removed": ({"spec": {"taints": []}}, "taints of devheal.io/ keys"),
        "the podCIDR": ({"spec": {"podCIDR": "10.9.0.0/24"}}, "only change a node's taints and spec.unschedulable"),
        "the provider": ({"spec": {"providerID": "evil://x"}}, "only change a node's taints and spec.unschedulable"),
    }
    for what, (body, expected) in refused.items():
        message = await refusal(lambda body=body: controller.patch(path, body))  # type: ignore[misc]
        assert expected in message, f"{what}: {message or 'let through'}"
    with pytest.raises(errors.Forbidden):  # RBAC: patch only, never a whole-object PUT
        await controller.replace(path, await kube.get(path))
    with pytest.raises(errors.Forbidden):
        await controller.delete(path)
    after = await kube.get(path)
    assert after["metadata"]["labels"]["zone"] == "a" and after["metadata"]["annotations"]["ops/note"] == "x"
    assert not after["spec"].get("podCIDR") and "example.com/evil" not in str(after["spec"]["taints"])


async def test_the_controllers_drain_conditions_pass_and_nothing_else_of_a_nodes_status_does(
    kube: KubeClient, controller: KubeClient, node: str
) -> None:
    status = api_path("v1", "nodes", name=node, subresource="status")
    await enforced(dry_run(controller, status, {"status": {"capacity": {"nvidia.com/gpu": "64"}}}), "the status rule")
    theirs = {"type": MAINTENANCE_PLANNED, "status": "True", "reason": "FirmwareUpdate", "message": "ops"}
    foreign_drain = {"type": DRAIN_IN_PROGRESS, "status": "True", "reason": "KubectlDrain", "message": "ops"}
    await kube.patch(status, {"status": {"conditions": [theirs]}}, content_type=STRATEGIC_PATCH)

    # The real writer, as the controller's service account: DrainInProgress, then Drained, then both ended.
    conditions = NodeLifecycleWriter(controller, time.time, enabled=True)
    assert await conditions.publish(node, DRAINING)
    assert await conditions.publish(node, DRAINED_NOW)
    assert await conditions.write(node, CLEARED)
    written = {c["type"]: (c["status"], c["reason"]) for c in (await kube.get(status))["status"]["conditions"]}
    assert written == {
        MAINTENANCE_PLANNED: ("True", "FirmwareUpdate"),
        DRAIN_IN_PROGRESS: ("False", DEVHEAL_REASON),
        DRAINED: ("False", DEVHEAL_REASON),
    }

    def patch(body: Obj) -> Callable[[], Awaitable[Obj]]:
        return lambda: controller.patch(status, body, content_type=STRATEGIC_PATCH)

    refused = {
        "another condition": {"status": {"conditions": [{**theirs, "status": "False"}]}},
        "a new condition": {"status": {"conditions": [{**theirs, "type": "Ready", "status": "False"}]}},
        "a drain condition with another reason": {"status": {"conditions": [{**foreign_drain}]}},
        "the capacity": {"status": {"capacity": {"nvidia.com/gpu": "64"}}},
        "a label, through the status": {"metadata": {"labels": {"zone": "b"}}},
    }
    for what, body in refused.items():
        message = await refusal(patch(body))
        assert "may only" in message and "DrainInProgress and Drained" in message, f"{what}: {message or 'let through'}"

    # Someone else's DrainInProgress: the controller's credentials cannot end it, the writer does not try.
    await kube.patch(status, {"status": {"conditions": [foreign_drain]}}, content_type=STRATEGIC_PATCH)
    ours = {"type": DRAIN_IN_PROGRESS, "status": "False", "reason": DEVHEAL_REASON, "message": "ended"}
    message = await refusal(patch({"status": {"conditions": [ours]}}))
    assert "never someone else's" in message, message or "let through"
    assert not await conditions.publish(node, DRAINING)
    after = {c["type"]: (c["status"], c["reason"]) for c in (await kube.get(status))["status"]["conditions"]}
    assert after[DRAIN_IN_PROGRESS] == ("True", "KubectlDrain")


async def test_the_controller_changes_only_its_own_parts_of_a_pods_status(
    kube: KubeClient, controller: KubeClient, namespace: str
) -> None:
    pods = api_path("v1", "pods", namespace=namespace)
    await kube.create(pods, gpu_pod("victim", gpus=0, node=NODE))
    gated = gpu_pod("gated", gpus=0)
    gated["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}]
    await kube.create(pods, gated)
    held = gpu_pod("free", gpus=0)  # held at someone else's gate: unscheduled, never devheal's to nominate
    held["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    await kube.create(pods, held)
    status = f"{pods}/victim/status"

    def conditions(*items: Obj) -> Obj:
        return {"status": {"conditions": list(items)}}

    message = await enforced(
        dry_run(controller, status, conditions({"type": "Ready", "status": "False"})),
        "the policy to refuse another condition",
    )
    assert "may only change a pod's devheal.io/ conditions" in message
    refused = {
        "a phase but Failed": ({"status": {"phase": "Succeeded"}}, "only fail a running or pending pod"),
        "Failed for another reason": ({"status": {"phase": "Failed", "reason": "Evicted"}}, "reason DeviceFailed"),
        "its start time": ({"status": {"startTime": "2020-01-01T00:00:00Z"}}, "nominated node"),
        "a node nominated for a pod not at devheal's gate": (
            {"status": {"nominatedNodeName": NODE}},
            "devheal.io/placement gate",
        ),
    }
    for what, (body, expected) in refused.items():
        path = f"{pods}/free/status" if "gate" in what else status
        message = await refusal(lambda path=path, body=body: controller.patch(path, body, content_type=STRATEGIC_PATCH))  # type: ignore[misc]
        assert expected in message, f"{what}: {message or 'let through'}"

    # What the actuators write (pod_actions, gangs, infrastructure_actions, release_gate) is let through.
    condition = {"type": DEVICE_FAILED_CONDITION, "status": "True", "reason": "DeviceFailed", "message": "GPU-0"}
    await controller.patch(status, conditions(condition), content_type=STRATEGIC_PATCH)
    await controller.patch(
        f"{pods}/gated/status", {"status": {"nominatedNodeName": NODE}}, content_type=STRATEGIC_PATCH
    )
    await controller.patch(
        status,
        {"status": {"phase": "Failed", "reason": "DeviceFailed", "message": "devheal: GPU-0"}},
        content_type=STRATEGIC_PATCH,
    )
    failed = await kube.get(f"{pods}/victim")
    assert failed["status"]["phase"] == "Failed"
    assert any(c["type"] == DEVICE_FAILED_CONDITION for c in failed["status"]["conditions"])
    message = await refusal(
        lambda: controller.patch(status, {"status": {"phase": "Running", "reason": None}}, content_type=STRATEGIC_PATCH)
    )
    assert "only fail a running or pending pod" in message, "an ended pod is not brought back"


# ---- a launcher -------------------------------------------------------------------------------


async def launcher_token(kube: KubeClient, namespace: str, account: str, pod: Obj | None) -> str:
    """A token of the launcher's service account, bound to ``pod`` (as its projected token is), or to nothing."""
    spec: Obj = {"expirationSeconds": 600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    answer = await kube.create(
        api_path("v1", "serviceaccounts", namespace=namespace, name=account, subresource="token"),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


async def test_a_launcher_writes_only_its_own_pods_annotations(
    lab: Lab, kube: KubeClient, chart_installed: list[Obj], namespace: str, tmp_path: Path
) -> None:
    account = await apply_launcher_rbac(kube, namespace)
    pods = api_path("v1", "pods", namespace=namespace)
    created = {}
    for name in ("rank-0", "rank-1"):
        pod = gpu_pod(name, gpus=0, node=NODE)
        pod["metadata"]["labels"] = {GANG_LABEL: "llm"}
        pod["metadata"]["annotations"] = {RESTART_GENERATION_ANNOTATION: "1"}
        pod["spec"]["serviceAccountName"] = account
        created[name] = await kube.create(pods, pod)
    token = await launcher_token(kube, namespace, account, created["rank-0"])
    client = await KubeClient.connect(str(token_kubeconfig(lab, token, tmp_path / "rank-0.kubeconfig")))
    unbound = await KubeClient.connect(
        str(token_kubeconfig(lab, await launcher_token(kube, namespace, account, None), tmp_path / "none.kubeconfig"))
    )
    try:
        peer = f"{pods}/rank-1"
        message = await enforced(
            dry_run(client, peer, {"metadata": {"annotations": {LAUNCHER_GENERATION_ANNOTATION: "9"}}}),
            "the policy to refuse a peer's annotation",
        )
        assert "may only change its own pod (rank-0), not rank-1" in message

        # The launcher's own writes, by its own code.
        gang = KubeGang(client, namespace, "rank-0", GANG_LABEL)
        await gang.acknowledge(1, steps='{"n":0}')
        await gang.publish_steps('{"n":3}')
        own = (await kube.get(f"{pods}/rank-0"))["metadata"]["annotations"]
        assert own[LAUNCHER_GENERATION_ANNOTATION] == "1" and own[STEPS_ANNOTATION] == '{"n":3}'
        await gang.publish_failure('{"code":1}')  # a failed run it holds, removed by the next acknowledgement
        assert (await kube.get(f"{pods}/rank-0"))["metadata"]["annotations"][RUN_FAILURE_ANNOTATION] == '{"code":1}'
        await gang.acknowledge(2, clear_failure=True)
        own = (await kube.get(f"{pods}/rank-0"))["metadata"]["annotations"]
        assert own[LAUNCHER_GENERATION_ANNOTATION] == "2" and RUN_FAILURE_ANNOTATION not in own

        image = [{"name": created["rank-1"]["spec"]["containers"][0]["name"], "image": "evil:latest"}]
        refused = {
            "a peer's image": (peer, {"spec": {"containers": image}}, "may only change its own pod"),
            "a peer's labels": (peer, {"metadata": {"labels": {GANG_LABEL: "other"}}}, "may only change its own pod"),
            "a peer's step times": (peer, {"metadata": {"annotations": {STEPS_ANNOTATION: "{}"}}}, "its own pod"),
            "a peer's failed run": (peer, {"metadata": {"annotations": {RUN_FAILURE_ANNOTATION: "{}"}}}, "its own pod"),
            "its own image": (f"{pods}/rank-0", {"spec": {"containers": image}}, "may not change a pod's spec"),
            "its own labels": (f"{pods}/rank-0", {"metadata": {"labels": {GANG_LABEL: "other"}}}, "labels"),
            "its own restart generation": (
                f"{pods}/rank-0",
                {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: "7"}}},
                "launcher-generation, devheal.io/steps and devheal.io/launcher-failed annotations",
            ),
        }
        for what, (path, body, expected) in refused.items():
            message = await refusal(lambda path=path, body=body: client.patch(path, body, content_type=STRATEGIC_PATCH))  # type: ignore[misc]
            assert expected in message, f"{what}: {message or 'let through'}"
        message = await refusal(
            lambda: unbound.patch(
                f"{pods}/rank-0", {"metadata": {"annotations": {LAUNCHER_GENERATION_ANNOTATION: "2"}}}
            )
        )
        assert "its token is bound to no pod" in message
        after = {name: await kube.get(f"{pods}/{name}") for name in created}
        assert after["rank-1"]["metadata"]["labels"] == {GANG_LABEL: "llm"}
        assert after["rank-1"]["metadata"]["annotations"] == {RESTART_GENERATION_ANNOTATION: "1"}
        assert after["rank-0"]["metadata"]["annotations"][RESTART_GENERATION_ANNOTATION] == "1"
    finally:
        await client.close()
        await unbound.close()


async def test_launchers_holding_only_their_pods_tokens_restart_in_place_under_the_policy(
    lab: Lab, kube: KubeClient, chart_installed: list[Obj], namespace: str, tmp_path: Path
) -> None:
    """The launcher process itself (devheal launch): its acknowledgements and step times go through."""
    account = await apply_launcher_rbac(kube, namespace)
    ranks = ["rank-0", "rank-1"]
    pods = api_path("v1", "pods", namespace=namespace)
    created = {}
    for name in ranks:
        pod = gpu_pod(name, gpus=0)
        pod["metadata"]["labels"] = {GANG_LABEL: "g1"}
        pod["spec"]["serviceAccountName"] = account
        created[name] = await kube.create(pods, pod)
    gang = GangHarness(lab, kube, namespace, tmp_path)
    try:
        await wait_until(
            lambda: pods_of(kube, namespace),
            lambda items: all(get_path(p, "status", "phase") == "Running" for p in items) and len(items) == 2,
            timeout=60,
            what="the ranks Running",
        )
        kubeconfigs = {}
        for name in ranks:
            token = await launcher_token(kube, namespace, account, created[name])
            kubeconfigs[name] = token_kubeconfig(lab, token, tmp_path / f"{name}.kubeconfig")
        rank_0 = await KubeClient.connect(str(kubeconfigs["rank-0"]))
        try:  # the policy is enforced before the launchers start: a peer's acknowledgement is refused
            body = {"metadata": {"annotations": {LAUNCHER_GENERATION_ANNOTATION: "9"}}}
            await enforced(dry_run(rank_0, f"{pods}/rank-1", body), "the policy to refuse a peer's annotation")
        finally:
            await rank_0.close()
        for name in ranks:
            gang.launch(name, f"--kubeconfig={kubeconfigs[name]}", "--steps-publish-interval=1")
        await gang.wait_starts(dict.fromkeys(ranks, 1))
        await gang.wait_acknowledged(ranks, 0)
        for name in ranks:
            await gang.annotate(name, 1)
        await gang.wait_acknowledged(ranks, 1)
        await gang.wait_starts(dict.fromkeys(ranks, 2))
        for name in ranks:
            output = gang.launched[name].output()
            assert "Forbidden" not in output and "HTTP 403" not in output, output
    finally:
        gang.stop_all()
