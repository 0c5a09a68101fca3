"""The chart's admission policies hold each devheal identity to the writes its code makes.

RBAC says which verbs, admission says which fields: the controller's node writes (devheal.io/ taints,
labels and annotations, the cordon), its pod status writes (devheal.io/ conditions, FailPod's phase,
a gated pod's nominated node) and a launcher's own-pod annotations. Here: each policy is rendered,
bound with Deny, matches its service account, and allows no more than the keys the code writes
(tests/lab/controller/test_admission_policies.py checks the API server enforces them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.engine.spares import SPARE_LABEL, SPARE_TAINT_KEY
from devheal.lab import chart
from devheal.lab.helm import ensure_helm
from devheal.lab.toolchain import ToolchainError
from devheal.model.cluster import (
    ADMISSION_REJECTED_CONDITION,
    DEVICE_FAILED_CONDITION,
    LAUNCHER_GENERATION_ANNOTATION,
    LIFTS_ANNOTATION,
    OWNED_TAINT_KEY,
    OWNERSHIP_ANNOTATION,
    PLACEMENT_GATE,
)
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY
from devheal.model.node_lifecycle import DEVHEAL_REASON, DRAIN_IN_PROGRESS, DRAINED
from devheal.model.run_failure import RUN_FAILURE_ANNOTATION
from devheal.model.steps import STEPS_ANNOTATION

Obj = dict[str, Any]
CONTROLLER = "system:serviceaccount:gpu-ops:devheal-controller"
POLICIES = {
    "devheal-controller-pod-writes": ["pods"],
    "devheal-controller-node-writes": ["nodes", "nodes/status"],
    "devheal-controller-pod-status": ["pods/status"],
    "devheal-launcher-own-pod": ["pods", "pods/*"],
    "devheal-agent-own-node": ["nodedevices", "nodedevices/status", "nodes", "nodes/status"],
}


@pytest.fixture(scope="module", autouse=True)
def helm() -> Iterator[Path]:
    try:
        yield ensure_helm()
    except ToolchainError as exc:
        pytest.skip(f"helm could not be built from its Go module: {exc}")


def documents(*args: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(chart.render(*args)) if d]


def by_name(docs: list[Obj], kind: str) -> dict[str, Obj]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def expressions(policy: Obj) -> str:
    spec = policy["spec"]
    parts = [v["expression"] for v in spec.get("variables") or []]
    parts += [v["expression"] for v in spec["validations"]]
    return "\n".join(parts)


def test_every_policy_is_bound_with_deny_and_fails_closed() -> None:
    docs = documents("--namespace", "gpu-ops")
    policies = by_name(docs, "ValidatingAdmissionPolicy")
    bindings = by_name(docs, "ValidatingAdmissionPolicyBinding")
    assert set(policies) == set(POLICIES)
    for name, resources in POLICIES.items():
        spec = policies[name]["spec"]
        assert spec["failurePolicy"] == "Fail", name
        assert [r for rule in spec["matchConstraints"]["resourceRules"] for r in rule["resources"]] == resources
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    for name in ("devheal-controller-pod-writes", "devheal-controller-node-writes", "devheal-controller-pod-status"):
        (condition,) = policies[name]["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{CONTROLLER}'"


def test_the_controller_may_patch_nodes_and_their_status_and_never_replace_them() -> None:
    rules = by_name(documents(), "ClusterRole")["devheal-controller"]["rules"]
    node_verbs = {v for rule in rules if "nodes" in rule.get("resources", []) for v in rule["verbs"]}
    assert node_verbs == {"get", "list", "watch", "patch"}
    subresources = {
        (r, v) for rule in rules for r in rule.get("resources", []) if r.startswith("nodes/") for v in rule["verbs"]
    }
    assert subresources == {("nodes/status", "patch")}, "the drain conditions (node_conditions), held by admission"


def test_the_node_policy_lets_through_devheals_drain_conditions_and_nothing_else_of_a_status() -> None:
    policy = by_name(documents(), "ValidatingAdmissionPolicy")["devheal-controller-node-writes"]
    text = expressions(policy)
    assert f"['{DRAIN_IN_PROGRESS}', '{DRAINED}']" in text
    assert f"c.?reason.orValue('') == '{DEVHEAL_REASON}'" in text, "only conditions with devheal's reason change"
    assert f"c.?reason.orValue('') != '{DEVHEAL_REASON}'" in text, "someone else's stay as they are"
    for field in ("capacity", "allocatable", "addresses", "nodeInfo", "images", "declaredFeatures", "labels"):
        assert f".?{field} ==" in text, f"a change of the node's {field} is refused"


def test_what_the_controllers_node_writes_set_is_within_the_node_policy() -> None:
    policy = by_name(documents(), "ValidatingAdmissionPolicy")["devheal-controller-node-writes"]
    operations = {op for rule in policy["spec"]["matchConstraints"]["resourceRules"] for op in rule["operations"]}
    assert operations == {"CREATE", "UPDATE", "DELETE"}, "creates and deletes are matched, to be refused"
    text = expressions(policy)
    assert "t.key.startsWith('devheal.io/')" in text
    for field in ("podCIDR", "podCIDRs", "providerID", "ownerReferences", "finalizers"):
        assert f".?{field} ==" in text, f"a change of the node's {field} is refused"
    # Every key the code writes on a node is one the policy lets through.
    written = (
        OWNED_TAINT_KEY,
        DEGRADED_TAINT_KEY,
        SPARE_TAINT_KEY,
        SPARE_LABEL,
        OWNERSHIP_ANNOTATION,
        LIFTS_ANNOTATION,
    )
    assert all(key.startswith("devheal.io/") for key in written)


def test_the_pod_status_policy_lets_through_what_the_controller_writes_and_nothing_else() -> None:
    policy = by_name(documents(), "ValidatingAdmissionPolicy")["devheal-controller-pod-status"]
    text = expressions(policy)
    assert all(c.startswith("devheal.io/") for c in (DEVICE_FAILED_CONDITION, ADMISSION_REJECTED_CONDITION))
    assert "!c.type.startsWith('devheal.io/')" in text
    assert "'Failed'" in text and "'DeviceFailed'" in text, "FailPod's phase and reason (pod_actions.FailPod)"
    assert f"g.name == '{PLACEMENT_GATE}'" in text, "a node is nominated only for a pod at devheal's gate"
    for field in ("containerStatuses", "podIP", "hostIP", "qosClass", "startTime", "resourceClaimStatuses"):
        assert f".?{field} ==" in text, f"a change of the pod's {field} is refused"


def test_a_launcher_may_write_only_its_own_pods_three_annotations() -> None:
    policy = by_name(documents(), "ValidatingAdmissionPolicy")["devheal-launcher-own-pod"]
    (condition,) = policy["spec"]["matchConditions"]
    assert "endsWith(':devheal-launcher')" in condition["expression"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert yaml.safe_load(variables["writable"]) == [
        LAUNCHER_GENERATION_ANNOTATION,
        STEPS_ANNOTATION,
        RUN_FAILURE_ANNOTATION,
    ]
    assert "authentication.kubernetes.io/pod-name" in variables["pod"]
    assert "authentication.kubernetes.io/pod-uid" in variables["podUID"]
    text = expressions(policy)
    assert "request.name == variables.pod && oldObject.metadata.uid == variables.podUID" in text
    assert "object.spec == oldObject.spec" in text and "object.metadata.?labels == oldObject.metadata.?labels" in text
    renamed = documents("--set", "launcher.serviceAccountName=trainer")
    policy = by_name(renamed, "ValidatingAdmissionPolicy")["devheal-launcher-own-pod"]
    assert "endsWith(':trainer')" in policy["spec"]["matchConditions"][0]["expression"]


def test_each_policy_can_be_turned_off() -> None:
    off = documents(
        "--set",
        "agent.admissionPolicy.enabled=false",
        "--set",
        "controller.admissionPolicy.enabled=false",
        "--set",
        "launcher.admissionPolicy.enabled=false",
    )
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]
    launcher_only = documents("--set", "controller.enabled=false", "--set", "agent.enabled=false")
    assert set(by_name(launcher_only, "ValidatingAdmissionPolicy")) == {"devheal-launcher-own-pod"}


def test_the_plain_manifests_ship_the_launcher_policy_on_its_own() -> None:
    text = (chart.DEPLOY / "launcher-admission-policy.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert "launcher-admission-policy.yaml" in (chart.DEPLOY / "launcher-rbac.yaml").read_text()
