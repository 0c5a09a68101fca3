"""The Helm chart in the lab: what it renders is accepted by the API server, and the controller
run with its service account's token (not admin) remediates, while what it must not do is refused.

The chart is rendered with the pinned helm (devheal.lab.helm); its RBAC and admission
policies are installed for real, the Deployment is not (the controller runs as a lab process
holding the service account's token, as tests/lab/controller/test_deploy_rbac.py does).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab import chart
from devheal.lab.cluster import Lab
from devheal.lab.helm import ensure_helm
from devheal.lab.toolchain import ToolchainError
from devheal.lab.workloads import get_path, gpu_pod, wait_until
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import OWNED_TAINT_KEY
from tests.lab.sessions import refused, service_account_token, token_kubeconfig

from ..conftest import RecordingFaults
from ..monitoring_crds import install_monitoring_crds
from ..test_manifests import PLURALS
from .conftest import ControllerHarness
from .test_gang_restart import restart_a_placed_gang_as
from .test_node_remediation import GROUP, GV, install_fake_remediator
from .test_remediation_ownership import external as external_of

SYSTEM = chart.NAMESPACE
ACCOUNT = "devheal-controller"
NODE = "gpu-node-005"
INSTALLED = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
"""What the controller's runs need installed for real: its identity, RBAC and admission policies."""
LAB_TEMPLATES = json.dumps([{"apiGroup": GROUP, "kind": "FakeRemediationTemplate"}])
EVERY_TEMPLATE = json.dumps(
    [
        {"apiGroup": "self-node-remediation.medik8s.io", "kind": "SelfNodeRemediationTemplate"},
        {"apiGroup": "fence-agents-remediation.medik8s.io", "kind": "FenceAgentsRemediationTemplate"},
        {"apiGroup": "machine-deletion-remediation.medik8s.io", "kind": "MachineDeletionRemediationTemplate"},
        {"apiGroup": GROUP, "kind": "FakeRemediationTemplate", "resource": "fakeremediationtemplates"},
    ]
)


def rendered(*args: str) -> list[dict[str, Any]]:
    try:
        ensure_helm()
    except ToolchainError as exc:
        pytest.skip(f"helm could not be built from its Go module: {exc}")
    return [d for d in yaml.safe_load_all(chart.render(*args)) if d]


def path_of(doc: dict[str, Any]) -> str:
    meta = doc["metadata"]
    return api_path(doc["apiVersion"], PLURALS[doc["kind"]], namespace=meta.get("namespace"), name=meta["name"])


async def apply(kube: KubeClient, doc: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    params = {"fieldManager": "devheal-test", "force": "true", **({"dryRun": "All"} if dry_run else {})}
    return await kube.request(
        "PATCH", path_of(doc), params=params, body=doc, content_type="application/apply-patch+yaml"
    )


async def ensure_namespace(kube: KubeClient) -> None:
    await apply(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}})


async def test_the_chart_with_every_option_passes_server_side_validation(kube: KubeClient) -> None:
    await install_monitoring_crds(kube)
    await ensure_namespace(kube)
    docs = rendered(
        "--include-crds",
        "--set-json",
        f"remediation.templates={EVERY_TEMPLATE}",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set-json",
        'agent.classification={"rules": [{"name": "temperature-high", "atLeast": 85}]}',
    )
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "DaemonSet", "PodDisruptionBudget", "Service"} <= kinds
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ValidatingAdmissionPolicy"} <= kinds
    for doc in docs:
        await apply(kube, doc, dry_run=True)


@pytest.fixture
async def chart_controller(lab: Lab, kube: KubeClient, tmp_path: Path) -> AsyncIterator[Path]:
    """The chart's RBAC and admission policies installed (remediation.templates naming the lab's fake
    remediator); a kubeconfig holding only the controller service account's token."""
    await ensure_namespace(kube)
    docs = [d for d in rendered("--set-json", f"remediation.templates={LAB_TEMPLATES}") if d["kind"] in INSTALLED]
    for doc in docs:
        await apply(kube, doc)
    try:
        policy = next(d for d in docs if d["metadata"]["name"] == "devheal-controller-pod-writes")
        checked = await wait_until(
            lambda: kube.get(path_of(policy)),
            lambda p: "typeChecking" in (p.get("status") or {}),
            timeout=10,
            what="the controller's admission policy type-checked",
        )
        assert not (checked["status"]["typeChecking"].get("expressionWarnings") or []), checked["status"]
        token = await service_account_token(kube, SYSTEM, ACCOUNT)
        yield token_kubeconfig(lab, token, tmp_path / "controller.kubeconfig")
    finally:
        for doc in reversed(docs):
            if doc["kind"] != "ServiceAccount":
                with contextlib.suppress(errors.NotFound):
                    await kube.delete(path_of(doc))


async def test_what_the_controller_must_not_do_is_refused(
    kube: KubeClient, namespace: str, chart_controller: Path
) -> None:
    client = await KubeClient.connect(str(chart_controller))
    pod = await kube.create(api_path("v1", "pods", namespace=namespace), gpu_pod("victim", gpus=0, node=NODE))
    pod_path = api_path("v1", "pods", namespace=namespace, name="victim")
    try:
        for path in (
            api_path("v1", "secrets", namespace=namespace),
            api_path("v1", "secrets", namespace="kube-system"),
        ):
            with pytest.raises(errors.Forbidden):
                await client.get(path)
        with pytest.raises(errors.Forbidden):  # another node's report: only agents write NodeDevices
            await client.apply(
                api_path(GROUP_VERSION, "nodedevices", name=NODE),
                {
                    "apiVersion": GROUP_VERSION,
                    "kind": "NodeDevices",
                    "metadata": {"name": NODE},
                    "spec": {"nodeName": NODE},
                },
            )
        with pytest.raises(errors.Forbidden):  # templates are read, never listed or written
            await client.get(api_path(GV, "fakeremediationtemplates", namespace="default"))
        with pytest.raises(errors.Forbidden):  # a remediator group not in remediation.templates
            await client.get(api_path("remediation.medik8s.io/v1alpha1", "selfnoderemediations", namespace="default"))

        image = {"spec": {"containers": [{"name": pod["spec"]["containers"][0]["name"], "image": "evil:latest"}]}}

        async def refusal() -> str:
            # A dry run goes through admission, and changes nothing if it is let through.
            try:
                await client.request(
                    "PATCH",
                    pod_path,
                    params={"dryRun": "All"},
                    body=image,
                    content_type="application/strategic-merge-patch+json",
                )
            except errors.Forbidden as exc:
                return str(exc)
            return ""

        # The API server loads a new policy asynchronously: wait until it is enforced.
        message = await wait_until(refusal, bool, timeout=15, what="the policy to refuse a pod's new image")
        assert "may not change a pod's containers" in message
        with pytest.raises(errors.Forbidden, match=r"only change a pod's devheal\.io/ annotations"):
            await client.patch(pod_path, {"metadata": {"labels": {"app": "hijacked"}}})
        with pytest.raises(errors.Forbidden, match=r"only change a pod's devheal\.io/ annotations"):
            await client.patch(pod_path, {"metadata": {"annotations": {"example.com/note": "x"}}})
        # What a gang restart writes is let through.
        patched = await client.patch(pod_path, {"metadata": {"annotations": {"devheal.io/restart-generation": "1"}}})
        assert patched["metadata"]["annotations"]["devheal.io/restart-generation"] == "1"
    finally:
        await client.close()
        with contextlib.suppress(errors.NotFound):
            await kube.request("DELETE", pod_path, params={"gracePeriodSeconds": 0})


async def test_the_controller_as_the_charts_service_account_restarts_a_gang(
    kube: KubeClient, namespace: str, harness: ControllerHarness, faults: RecordingFaults, chart_controller: Path
) -> None:
    """Annotations, the placement gate, pod status, evictions and records, under RBAC and the pod-writes policy."""
    await restart_a_placed_gang_as(
        harness, kube, namespace, faults, chart_controller, "the gang restart as the chart's service account"
    )


async def test_the_controller_as_the_charts_service_account_remediates_a_node_through_a_template(
    kube: KubeClient, harness: ControllerHarness, faults: RecordingFaults, chart_controller: Path
) -> None:
    """Taint, the external remediation object from the template remediation.templates names, and the lift."""
    await install_fake_remediator(kube)
    await harness.label_nodes(NODE)
    await harness.policy(
        {
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "2s",
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

    async def pods_on_node() -> list[dict[str, Any]]:
        items, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={NODE}"})
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    await wait_until(pods_on_node, lambda ps: not ps, timeout=60, what=f"{NODE} idle")
    controller = harness.start(f"--kubeconfig={chart_controller}")
    started = time.monotonic()
    for gpu in range(8):
        faults.xid(NODE, gpu, 79)

    async def external() -> dict[str, Any] | None:
        try:
            return await kube.get(api_path(GV, "fakeremediations", namespace="default", name=NODE))
        except errors.NotFound:
            return None

    obj = await wait_until(external, lambda o: o is not None, timeout=40, what="FakeRemediation for the node")
    assert obj is not None and obj["spec"] == {"strategy": "Reboot"}
    assert time.monotonic() - started >= 2.0, "not before the policy's remediateAfter"
    node = await kube.get(api_path("v1", "nodes", name=NODE))
    assert any(t["key"] == OWNED_TAINT_KEY for t in node["spec"].get("taints") or [])

    for gpu in range(8):
        faults.recover(NODE, gpu)
    await wait_until(external, lambda o: o is None, timeout=30, what="FakeRemediation removed after recovery")
    expected = {"Taint": "Succeeded", "RemediateNode": "Succeeded", "Lift": "Succeeded"}

    def phases(records: list[dict[str, Any]]) -> dict[str, str]:
        return {
            r["spec"]["action"]: get_path(r, "status", "phase") for r in records if r["spec"]["target"]["name"] == NODE
        }

    records = await wait_until(
        harness.remediations, lambda rs: phases(rs) == expected, timeout=40, what=f"remediations of {NODE} done"
    )
    assert phases(records) == expected
    output = controller.output()
    assert not refused(output), output[-3000:]


async def test_a_template_kind_the_chart_does_not_grant_fails_forbidden_with_an_event_then_escalates(
    kube: KubeClient, harness: ControllerHarness, faults: RecordingFaults, chart_controller: Path
) -> None:
    """A policy's first step names a kind outside remediation.templates: its record ends Failed (Forbidden)
    with a warning Event on the node, and the next step, a granted kind, takes over."""
    await install_fake_remediator(kube)
    await harness.label_nodes(NODE)
    ungranted = {"apiVersion": "remediation.ungranted.devheal.io/v1", "kind": "FakeRemediationTemplate"}
    await harness.policy(
        {
            "node": {
                "taint": True,
                "capacityGapAfter": "1s",
                "remediateAfter": "1s",
                "holdDown": "2s",
                "escalation": [
                    {"template": {**ungranted, "name": "reboot", "namespace": "default"}, "timeout": "10m"},
                    {
                        "template": {
                            "apiVersion": GV,
                            "kind": "FakeRemediationTemplate",
                            "name": "reboot",
                            "namespace": "default",
                        },
                        "timeout": "10m",
                    },
                ],
            },
            "budgets": {"maxUnhealthyNodes": 1},
        },
        nodes_only=True,
    )

    async def pods_on_node() -> list[dict[str, Any]]:
        items, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": f"spec.nodeName={NODE}"})
        return [p for p in items if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    await wait_until(pods_on_node, lambda ps: not ps, timeout=60, what=f"{NODE} idle")
    harness.start(f"--kubeconfig={chart_controller}")
    for gpu in range(8):
        faults.xid(NODE, gpu, 79)

    def remediations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(
            (r for r in records if r["spec"]["action"] == "RemediateNode" and r["spec"]["target"]["name"] == NODE),
            key=lambda r: int(r["metadata"]["labels"].get("devheal.io/step") or 0),  # created within one second
        )

    def escalated(records: list[dict[str, Any]]) -> bool:
        steps = remediations(records)
        return len(steps) == 2 and get_path(steps[1], "status", "phase") == "InProgress"

    records = await harness.wait_remediation(escalated, "the second step after a Forbidden first", timeout=60)
    first, second = remediations(records)
    assert second["metadata"]["labels"].get("devheal.io/step") == "1", second["metadata"]
    assert (first["status"]["phase"], first["status"]["reason"]) == ("Failed", "Forbidden")
    assert (
        "not allowed to read remediation template FakeRemediationTemplate default/reboot" in first["status"]["message"]
    )
    # The record is written before its external object is created: wait for the object.
    obj = await wait_until(
        lambda: external_of(kube, NODE), lambda o: o is not None, timeout=15, what="the second step's object"
    )
    assert obj is not None and obj["spec"] == {"strategy": "Reboot"}

    async def warnings() -> list[dict[str, Any]]:
        items, _ = await kube.list_all(
            api_path("v1", "events", namespace="default"), {"fieldSelector": f"involvedObject.name={NODE}"}
        )
        return [e for e in items if e.get("reason") == "DevhealRemediateNodeFailed"]

    (event, *_) = await wait_until(warnings, bool, timeout=15, what="a warning Event on the node")
    assert event["type"] == "Warning" and "not allowed to read" in event["message"]
    for gpu in range(8):
        faults.recover(NODE, gpu)

    async def external() -> dict[str, Any] | None:
        try:
            return await kube.get(api_path(GV, "fakeremediations", namespace="default", name=NODE))
        except errors.NotFound:
            return None

    await wait_until(external, lambda o: o is None, timeout=30, what="FakeRemediation removed after recovery")
