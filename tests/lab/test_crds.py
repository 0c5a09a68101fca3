"""devheal's CRDs on a real kube-apiserver: installed, served, and validating as documented.

Every invalid policy here is rejected by the API server (HTTP 422, ``errors.Invalid``, the
message naming the field) and by ``parse_policy``, so a policy that reaches the controller
by another route (a file, an older CRD) fails the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import CRD_NAMES, crd_path, install_crds
from devheal.lab import toolchain
from devheal.lab.cluster import Lab
from devheal.model.api import GROUP_VERSION
from devheal.model.badput import Badput, remediation_badput
from devheal.model.policy import PolicyError, Quantity, RemediationMode, parse_policy

API = GROUP_VERSION


@pytest.fixture
async def installed(kube: KubeClient) -> KubeClient:
    await install_crds(kube)
    return kube


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def delete_quietly(kube: KubeClient, path: str) -> None:
    with contextlib.suppress(errors.NotFound):
        await kube.delete(path)


@pytest.fixture
async def cleanup(installed: KubeClient) -> AsyncIterator[list[str]]:
    """Paths of cluster-scoped objects to delete when the test ends."""
    created: list[str] = []
    yield created
    for path in created:
        await delete_quietly(installed, path)


def policy_path(name: str | None = None) -> str:
    return api_path(API, "remediationpolicies", name=name)


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "RemediationPolicy", "metadata": {"name": name}, "spec": spec}


FULL_SPEC: dict[str, Any] = {
    "selector": {
        "namespaces": ["training", "serving"],
        "podSelector": {
            "matchLabels": {"team": "ml"},
            "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["scratch"]},
                {"key": "devheal.io/skip", "operator": "DoesNotExist"},
            ],
        },
        "nodeSelector": {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "Exists"}]},
    },
    "actions": {"inference": "Deschedule", "batch": "FailPod", "gang": "RestartGang", "standalone": "Notify"},
    "deviceErrorExitCodes": [42, 255],
    "crashLoopRestarts": 2,
    "node": {
        "taint": True,
        "cordon": True,
        "capacityGapAfter": "90s",
        "remediateAfter": "1h30m",
        "remediation": "Drain",
        "template": {
            "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
            "kind": "SelfNodeRemediationTemplate",
            "name": "automatic",
            "namespace": "medik8s",
        },
        "holdDown": "5m",
    },
    "budgets": {
        "maxUnhealthyNodes": "25%",
        "maxUnhealthyNodesPerPool": 2,
        "poolLabel": "cloud.google.com/gke-nodepool",
        "maxConcurrentRemediations": 4,
        "workloadDisruptionInterval": "2m",
        "gangRestartsPerHour": 1,
        "circuitBreaker": {"maxFaultyNodesPercent": 20, "window": "15m"},
    },
    "allowDelete": True,
    "dryRun": True,
    "paused": False,
}


def _crd_conditions(crd: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in crd["status"]["conditions"]}


async def test_crds_become_established_and_install_is_idempotent(kube: KubeClient) -> None:
    await install_crds(kube)
    await install_crds(kube)  # again: server-side apply converges, nothing conflicts
    for name in CRD_NAMES:
        crd = await kube.get(crd_path(name))
        assert _crd_conditions(crd)["Established"] == "True", name
        assert _crd_conditions(crd)["NamesAccepted"] == "True", name
        assert any(f["manager"] == "devheal" for f in crd["metadata"]["managedFields"]), name


async def test_printer_columns_are_in_the_crds_and_shown_by_kubectl(
    installed: KubeClient, lab: Lab, cleanup: list[str]
) -> None:
    expected = {
        "remediationpolicies.devheal.io": ["DryRun", "Paused", "MaxUnhealthy", "Age"],
        "remediations.devheal.io": [
            "Finding",
            "Target",
            "Node",
            "Action",
            "Phase",
            "Reason",
            "Lost GPU-h",
            "Cause",
            "Validation",
            "Age",
        ],
        "nodedevices.devheal.io": ["Healthy", "Total", "Worst", "Age"],
    }
    for name, columns in expected.items():
        crd = await installed.get(crd_path(name))
        (version,) = crd["spec"]["versions"]
        assert [c["name"] for c in version["additionalPrinterColumns"]] == columns

    name = unique("rpol-table")
    cleanup.append(policy_path(name))
    await installed.create(
        policy_path(),
        policy(
            name,
            {
                "selector": {"podSelector": {}},
                "dryRun": True,
                "paused": False,
                "budgets": {"maxUnhealthyNodes": "5%"},
            },
        ),
    )
    process = await asyncio.create_subprocess_exec(
        str(toolchain.CONTROL_PLANE.binary("kubectl")),
        f"--kubeconfig={lab.kubeconfig}",
        "get",
        "rpol",
        name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    header, row = out.decode().splitlines()
    assert header.split() == ["NAME", "DRYRUN", "PAUSED", "MAXUNHEALTHY", "AGE"]
    assert row.split()[:4] == [name, "true", "false", "5%"]


async def test_a_full_policy_is_accepted_and_round_trips(installed: KubeClient, cleanup: list[str]) -> None:
    name = unique("rpol-full")
    cleanup.append(policy_path(name))
    created = await installed.create(policy_path(), policy(name, copy.deepcopy(FULL_SPEC)))
    assert created["spec"] == FULL_SPEC
    fetched = await installed.get(policy_path(name))
    assert fetched["spec"] == FULL_SPEC
    parsed = parse_policy(fetched)
    assert parsed.name == name and parsed.generation == 1
    assert parsed.budgets.max_unhealthy_nodes == Quantity(25, True)
    assert parsed.budgets.max_unhealthy_nodes_per_pool == Quantity(2, False)
    assert parsed.node.remediation is RemediationMode.DRAIN and parsed.node.template is not None
    assert parsed.node.remediate_after == 5400.0
    assert parsed.dry_run and parsed.allow_delete and not parsed.paused


async def test_a_policy_selecting_every_pod_explicitly_is_accepted(installed: KubeClient, cleanup: list[str]) -> None:
    name = unique("rpol-every-pod")
    cleanup.append(policy_path(name))
    created = await installed.create(policy_path(), policy(name, {"selector": {"podSelector": {}}}))
    assert created["spec"]["selector"] == {"podSelector": {}}  # an empty selector object is kept, not pruned
    assert parse_policy(created).budgets.max_unhealthy_nodes == Quantity(10, True)


@pytest.mark.parametrize(
    "spec",
    [{}, {"selector": {}}, {"selector": {"namespaces": []}}, {"dryRun": True}],
    ids=["empty", "no-keys", "no-namespaces", "dry-run"],
)
async def test_a_policy_without_a_selector_is_refused_by_the_api_server_and_by_parse_policy(
    installed: KubeClient, cleanup: list[str], spec: dict[str, Any]
) -> None:
    name = unique("rpol-no-selector")
    cleanup.append(policy_path(name))
    with pytest.raises(errors.Invalid) as info:
        await installed.create(policy_path(), policy(name, spec))
    assert "spec.selector" in str(info.value) and "podSelector" in str(info.value), str(info.value)
    with pytest.raises(PolicyError, match=r"spec\.selector: a policy acts only on what it selects"):
        parse_policy(policy(name, spec))


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("bad-action", {"actions": {"batch": "Reboot"}}, "spec.actions.batch"),
    (
        "in-without-values",
        {"selector": {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}},
        "spec.selector.podSelector.matchExpressions[0].values",
    ),
    (
        "exists-with-values",
        {"selector": {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}},
        "spec.selector.nodeSelector.matchExpressions[0].values",
    ),
    (
        "bad-operator",
        {"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is", "values": ["x"]}]}}},
        "spec.selector.podSelector.matchExpressions[0].operator",
    ),
    ("drain-without-template", {"node": {"remediation": "Drain"}}, "spec.node.template"),
    (
        "template-and-escalation",
        {
            "node": {
                "template": {"apiVersion": "a/v1", "kind": "XTemplate", "name": "t", "namespace": "n"},
                "escalation": [
                    {"template": {"apiVersion": "a/v1", "kind": "YTemplate", "name": "t", "namespace": "n"}}
                ],
            }
        },
        "spec.node.escalation",
    ),
    (
        "escalation-bad-timeout",
        {
            "node": {
                "escalation": [
                    {
                        "template": {"apiVersion": "a/v1", "kind": "XTemplate", "name": "t", "namespace": "n"},
                        "timeout": "ten minutes",
                    }
                ]
            }
        },
        "spec.node.escalation[0].timeout",
    ),
    (
        "template-without-namespace",
        {"node": {"template": {"apiVersion": "a/v1", "kind": "XTemplate", "name": "t"}}},
        "spec.node.template.namespace",
    ),
    ("percent-over-100", {"budgets": {"maxUnhealthyNodes": "150%"}}, "spec.budgets.maxUnhealthyNodes"),
    ("not-a-quantity", {"budgets": {"maxUnhealthyNodesPerPool": "half"}}, "spec.budgets.maxUnhealthyNodesPerPool"),
    ("negative-count", {"budgets": {"maxUnhealthyNodes": -1}}, "spec.budgets.maxUnhealthyNodes"),
    ("bad-duration", {"node": {"remediateAfter": "5 minutes"}}, "spec.node.remediateAfter"),
    ("empty-duration", {"budgets": {"circuitBreaker": {"window": ""}}}, "spec.budgets.circuitBreaker.window"),
    ("exit-code-0", {"deviceErrorExitCodes": [0]}, "spec.deviceErrorExitCodes[0]"),
    ("crash-loop-0", {"crashLoopRestarts": 0}, "spec.crashLoopRestarts"),
    ("concurrent-0", {"budgets": {"maxConcurrentRemediations": 0}}, "spec.budgets.maxConcurrentRemediations"),
    (
        "breaker-over-100",
        {"budgets": {"circuitBreaker": {"maxFaultyNodesPercent": 101}}},
        "spec.budgets.circuitBreaker.maxFaultyNodesPercent",
    ),
    ("dry-run-string", {"dryRun": "yes"}, "spec.dryRun"),
    ("duration-as-number", {"node": {"holdDown": 300}}, "spec.node.holdDown"),
    ("duration-trailing-newline", {"node": {"holdDown": "5m\n"}}, "spec.node.holdDown"),
    ("percent-trailing-newline", {"budgets": {"maxUnhealthyNodes": "10%\n"}}, "spec.budgets.maxUnhealthyNodes"),
    ("exit-code-true", {"deviceErrorExitCodes": [True]}, "spec.deviceErrorExitCodes[0]"),
    ("empty-pool-label", {"budgets": {"poolLabel": ""}}, "spec.budgets.poolLabel"),
    ("label-value-not-a-string", {"selector": {"podSelector": {"matchLabels": {"tier": 1}}}}, "matchLabels.tier"),
    ("namespace-not-a-dns-label", {"selector": {"namespaces": ["Foo_Bar"]}}, "spec.selector.namespaces[0]"),
]


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
async def test_an_invalid_policy_is_rejected_by_the_api_server(
    installed: KubeClient, cleanup: list[str], case: str, spec: dict[str, Any], field: str
) -> None:
    name = unique(f"rpol-{case}")
    cleanup.append(policy_path(name))
    with pytest.raises(errors.Invalid) as info:
        await installed.create(policy_path(), policy(name, spec))
    assert info.value.status == 422
    assert field in str(info.value), str(info.value)


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_the_same_invalid_policy_is_rejected_by_parse_policy(case: str, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(policy(case, spec))
    # parse_policy names a whole list ("deviceErrorExitCodes", not "[0]"), and a missing
    # key of an object as "spec.node.template: missing namespace".
    named = field.removeprefix("spec.").split("[")[0]
    parent, _, key = named.rpartition(".")
    message = str(info.value)
    assert named in message or (parent in message and key in message), message


async def test_unknown_fields_are_rejected_with_strict_field_validation(
    installed: KubeClient, cleanup: list[str]
) -> None:
    name = unique("rpol-unknown")
    cleanup.append(policy_path(name))
    with pytest.raises(errors.PermanentError, match=r"unknown field \"spec.actions.training\""):
        await installed.request(
            "POST",
            policy_path(),
            params={"fieldValidation": "Strict"},
            body=policy(name, {"selector": {"podSelector": {}}, "actions": {"training": "FailPod"}}),
        )
    with pytest.raises(PolicyError, match="unknown workload class 'training'"):
        parse_policy(policy(name, {"selector": {"podSelector": {}}, "actions": {"training": "FailPod"}}))


# ---- Remediation --------------------------------------------------------------------------------


def remediation_path(name: str | None = None, subresource: str | None = None) -> str:
    return api_path(API, "remediations", name=name, subresource=subresource)


def remediation(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Remediation",
        "metadata": {"name": name},
        "spec": {
            "action": "FailPod",
            "target": {"kind": "Pod", "namespace": "ml", "name": "train-3", "uid": "0f0e", "node": "gpu-node-001"},
            "workload": {"kind": "Job", "namespace": "ml", "name": "train", "class": "batch"},
            "finding": {
                "kind": "DeviceFailed",
                "source": "nvml",
                "evidence": "XID 79 (fell off the bus) on GPU-aa",
                "deviceIDs": ["GPU-aa"],
                "since": "2026-01-01T00:00:00Z",
            },
            "policy": "default",
            "dryRun": False,
        },
    }


async def test_a_remediation_records_progress_in_status_and_its_spec_is_immutable(
    installed: KubeClient, cleanup: list[str]
) -> None:
    name = unique("rem")
    cleanup.append(remediation_path(name))
    body = remediation(name)
    created = await installed.create(remediation_path(), body)
    assert created["spec"] == body["spec"]
    assert "status" not in created

    # Status goes through /status only; a status written with the main resource is dropped.
    await installed.patch(remediation_path(name), {"status": {"phase": "Failed"}})
    assert "status" not in await installed.get(remediation_path(name))
    status = {
        "phase": "Succeeded",
        "reason": "PodFailed",
        "message": "condition devheal.io/DeviceFailed set, pod failed",
        "attempts": 1,
        "startedAt": "2026-01-01T00:00:01Z",
        "completedAt": "2026-01-01T00:00:02Z",
        "observedAt": "2026-01-01T00:00:02Z",
        "steps": [
            {"name": "ConditionSet", "at": "2026-01-01T00:00:01Z", "message": "devheal.io/DeviceFailed=True"},
            {"name": "PodFailed", "at": "2026-01-01T00:00:02Z"},
        ],
    }
    patched = await installed.patch(remediation_path(name, "status"), {"status": status})
    assert patched["status"] == status
    assert patched["spec"] == body["spec"]
    # The record of an old controller has no badput, and stays readable; a new one adds it as it ends.
    badput = remediation_badput("faulty-gpu", 8, 1767225600.0, 1767226050.0, 1767226950.0)  # 1 + 2 GPU-hours
    assert badput is not None
    booked = {"gpus": 8, "badput": badput.to_status()}
    patched = await installed.patch(remediation_path(name, "status"), {"status": booked})
    assert patched["status"] == {**status, **booked}
    assert Badput.from_status(patched["status"]["badput"]) == badput
    with pytest.raises(errors.Invalid, match=r"status\.badput\.gpus"):
        await installed.patch(remediation_path(name, "status"), {"status": {"badput": {**booked["badput"], "gpus": 0}}})

    with pytest.raises(errors.Invalid, match="spec is immutable: a Remediation records one decision"):
        await installed.patch(remediation_path(name), {"spec": {"action": "Deschedule"}})
    with pytest.raises(errors.Invalid, match="spec is immutable"):
        await installed.patch(remediation_path(name), {"spec": {"finding": {"evidence": "rewritten"}}})
    # Metadata stays writable (labels, finalizers).
    labelled = await installed.patch(remediation_path(name), {"metadata": {"labels": {"devheal.io/node": "n1"}}})
    assert labelled["metadata"]["labels"] == {"devheal.io/node": "n1"}
    assert (await installed.get(remediation_path(name)))["spec"]["action"] == "FailPod"


async def test_kubectl_shows_what_a_remediation_cost(installed: KubeClient, lab: Lab, cleanup: list[str]) -> None:
    name = unique("rem-cost")
    cleanup.append(remediation_path(name))
    await installed.create(remediation_path(), remediation(name))
    badput = remediation_badput("gpu-hbm3", 64, 1767225600.0, 1767225630.0, 1767225780.0)
    assert badput is not None
    status = {"phase": "Succeeded", "reason": "PodFailed", "gpus": 64, "badput": badput.to_status()}
    await installed.patch(remediation_path(name, "status"), {"status": status})
    process = await asyncio.create_subprocess_exec(
        str(toolchain.CONTROL_PLANE.binary("kubectl")),
        f"--kubeconfig={lab.kubeconfig}",
        "get",
        "rem",
        name,
        "-o",
        "wide",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    header, row = out.decode().splitlines()
    assert header.split()[6:10] == ["REASON", "LOST", "GPU-H", "CAUSE"]
    assert row.split()[6:9] == ["PodFailed", "3.2", "gpu-hbm3"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"action": "Reboot"}, "spec.action"),
        ({"target": {"kind": "Pod", "name": "p"}}, "spec.target.namespace"),
        ({"target": {"kind": "Service", "name": "s"}}, "spec.target.kind"),
        ({"workload": {"class": "training"}}, "spec.workload.class"),
        ({"finding": {"since": "yesterday"}}, "spec.finding.since"),
    ],
)
async def test_an_invalid_remediation_is_rejected(
    installed: KubeClient, cleanup: list[str], change: dict[str, Any], field: str
) -> None:
    name = unique("rem-bad")
    cleanup.append(remediation_path(name))
    body = remediation(name)
    body["spec"].update(change)
    with pytest.raises(errors.Invalid) as info:
        await installed.create(remediation_path(), body)
    assert field in str(info.value), str(info.value)


async def test_a_remediation_with_a_bad_phase_is_rejected_on_status(installed: KubeClient, cleanup: list[str]) -> None:
    name = unique("rem-phase")
    cleanup.append(remediation_path(name))
    await installed.create(remediation_path(), remediation(name))
    with pytest.raises(errors.Invalid, match=r"status\.phase"):
        await installed.patch(remediation_path(name, "status"), {"status": {"phase": "Done"}})


# ---- NodeDevices --------------------------------------------------------------------------------


def node_devices_path(name: str | None = None, subresource: str | None = None) -> str:
    return api_path(API, "nodedevices", name=name, subresource=subresource)


async def test_node_devices_status_is_written_through_the_status_subresource(
    installed: KubeClient, cleanup: list[str]
) -> None:
    name = unique("gpu-node")
    cleanup.append(node_devices_path(name))
    created = await installed.create(
        node_devices_path(),
        {"apiVersion": API, "kind": "NodeDevices", "metadata": {"name": name}, "spec": {"nodeName": name}},
    )
    assert created["spec"] == {"nodeName": name}
    status = {
        "devices": [
            {
                "id": "GPU-aa",
                "index": 0,
                "model": "NVIDIA H100 80GB HBM3",
                "resource": "nvidia.com/gpu",
                "health": "Unhealthy",
                "reasons": [
                    {
                        "source": "xid",
                        "code": 79,
                        "message": "GPU has fallen off the bus",
                        "firstSeen": "2026-01-01T00:00:00Z",
                        "lastSeen": "2026-01-01T00:00:05Z",
                        "count": 2,
                    }
                ],
                "pod": {"namespace": "ml", "name": "train-3", "container": "trainer"},
            },
            {
                "id": "GPU-bb",
                "index": 1,
                "model": "NVIDIA H100 80GB HBM3",
                "resource": "nvidia.com/gpu",
                "health": "Healthy",
            },
        ],
        "healthy": 1,
        "total": 2,
        "worstReason": "XID 79",
        "updatedAt": "2026-01-01T00:00:05Z",
        "conditions": [
            {
                "type": "AgentReady",
                "status": "True",
                "reason": "Publishing",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    patched = await installed.patch(node_devices_path(name, "status"), {"status": status})
    assert patched["status"] == status
    assert (await installed.get(node_devices_path(name)))["status"] == status

    with pytest.raises(errors.Invalid, match=r"status\.devices\[0\]\.health"):
        await installed.patch(
            node_devices_path(name, "status"),
            {"status": {"devices": [{"id": "GPU-aa", "health": "Broken"}]}},
        )
    with pytest.raises(errors.Invalid, match=r"status\.healthy"):
        await installed.patch(node_devices_path(name, "status"), {"status": {"healthy": 3}})


async def test_node_devices_must_be_named_after_its_node(installed: KubeClient, cleanup: list[str]) -> None:
    name = unique("gpu-node")
    cleanup.append(node_devices_path(name))
    with pytest.raises(errors.Invalid, match=r"spec\.nodeName"):
        await installed.create(
            node_devices_path(),
            {"apiVersion": API, "kind": "NodeDevices", "metadata": {"name": name}, "spec": {"nodeName": "other"}},
        )
