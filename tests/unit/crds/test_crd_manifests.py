"""The CRD manifests: well-formed, named right, and in step with the documented policy spec.

The API server's own checks (structural schema, CEL compilation and cost) run in
tests/lab/test_crds.py; here a small validator for the OpenAPI subset the manifests use
checks example policies against the schema without a cluster, next to ``parse_policy``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from devheal import crds
from devheal.kube import errors as kube_errors
from devheal.kube.client import KubeClient
from devheal.kube.crds import CRD_NAMES, CRDNotEstablished, install_crds
from devheal.model import api
from devheal.model import policy as policy_module
from devheal.model.policy import (
    DEFAULT_POLICY,
    RECOMMENDED_POLICY,
    SELECTOR_REQUIRED,
    PolicyError,
    parse_duration,
    parse_policy,
)

Schema = dict[str, Any]
POLICY_DOC = Path(__file__).resolve().parents[3] / "docs" / "policy.md"


def by_kind() -> dict[str, dict[str, Any]]:
    return {m["spec"]["names"]["kind"]: m for m in crds.manifests()}


def version(kind: str) -> dict[str, Any]:
    (only,) = by_kind()[kind]["spec"]["versions"]
    return dict(only)


def schema(kind: str) -> Schema:
    return dict(version(kind)["schema"]["openAPIV3Schema"])


def spec_schema(kind: str) -> Schema:
    return dict(schema(kind)["properties"]["spec"])


def documented_block() -> str:
    """The YAML block under docs/policy.md's "Every field and its default"."""
    text = POLICY_DOC.read_text()
    section = text.split("### Every field and its default", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def documented_spec() -> dict[str, Any]:
    """The ``spec:`` of the documented block, as YAML (it is valid YAML)."""
    parsed = yaml.safe_load(documented_block())
    assert isinstance(parsed, dict)
    return dict(parsed["spec"])


def documented_optional() -> set[str]:
    """Spec fields without a default, shown commented out (``# field: example``) in the block, with the fields
    of such a section indented under it (``#   size: 2`` is ``spares.size``)."""
    found: set[str] = set()
    parents: list[str] = []
    for indent, key in re.findall(r"^ {2}# ( *)([A-Za-z]+):", documented_block(), flags=re.MULTILINE):
        parents = [*parents[: len(indent) // 2], key]
        found.add(".".join(parents))
    return found


def paths(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        if isinstance(value, dict):
            yield from paths(value, path)


def schema_at(root: Schema, path: str) -> Schema | None:
    node: Schema | None = root
    for part in path.split("."):
        if node is None:
            return None
        node = (node.get("properties") or {}).get(part)
    return node


def schema_paths(root: Schema, prefix: str = "") -> Iterator[str]:
    for key, sub in (root.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        yield from schema_paths(sub, path)


# ---- a validator for the OpenAPI subset the manifests use (CEL rules excluded) ----------------


def violations(value: Any, node: Schema, where: str = "spec") -> list[str]:
    found: list[str] = []
    if node.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            found.append(f"{where}: not an int or a string")
        return found
    kind = node.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind not in checks or not checks[kind](value):
        return [f"{where}: expected {kind}, got {value!r}"]
    if "enum" in node and value not in node["enum"]:
        found.append(f"{where}: {value!r} not in {node['enum']}")
    if kind == "string":
        if len(value) < node.get("minLength", 0) or len(value) > node.get("maxLength", 1 << 30):
            found.append(f"{where}: length of {value!r}")
        if "pattern" in node and not re.search(node["pattern"], value):
            found.append(f"{where}: {value!r} does not match {node['pattern']}")
    if kind == "integer" and not node.get("minimum", -(1 << 63)) <= value <= node.get("maximum", 1 << 63):
        found.append(f"{where}: {value} out of range")
    if kind == "array":
        if len(value) > node.get("maxItems", 1 << 30):
            found.append(f"{where}: too many items")
        for i, item in enumerate(value):
            found += violations(item, node["items"], f"{where}[{i}]")
    if kind == "object":
        found += [f"{where}.{k}: required" for k in node.get("required", []) if k not in value]
        props = node.get("properties")
        for key, item in value.items():
            if props is not None and key in props:
                found += violations(item, props[key], f"{where}.{key}")
            elif props is None and "additionalProperties" in node:
                found += violations(item, node["additionalProperties"], f"{where}.{key}")
            else:
                found.append(f"{where}.{key}: unknown field")
    return found


# ---- the manifests --------------------------------------------------------------------------


def test_three_cluster_scoped_crds_in_group_devheal_io() -> None:
    manifests = crds.manifests()
    assert tuple(m["metadata"]["name"] for m in manifests) == CRD_NAMES
    for m in manifests:
        assert m["apiVersion"] == "apiextensions.k8s.io/v1"
        assert m["spec"]["group"] == api.GROUP == "devheal.io"
        assert m["spec"]["scope"] == "Cluster"
        assert m["metadata"]["name"] == f"{m['spec']['names']['plural']}.devheal.io"
        (v,) = m["spec"]["versions"]
        assert (v["name"], v["served"], v["storage"]) == (api.VERSION, True, True)
        assert v["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    ("kind", "plural", "singular", "short"),
    [
        ("RemediationPolicy", "remediationpolicies", "remediationpolicy", "rpol"),
        ("Remediation", "remediations", "remediation", "rem"),
        ("NodeDevices", "nodedevices", "nodedevices", "nd"),
    ],
)
def test_names(kind: str, plural: str, singular: str, short: str) -> None:
    names = by_kind()[kind]["spec"]["names"]
    assert (names["plural"], names["singular"], names["shortNames"]) == (plural, singular, [short])
    assert names["listKind"] == f"{kind}List"


def test_manifests_are_fresh_copies() -> None:
    first = crds.manifests()
    first[0]["spec"]["group"] = "changed"
    assert crds.manifests()[0]["spec"]["group"] == "devheal.io"


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        (
            "RemediationPolicy",
            [
                ("DryRun", ".spec.dryRun"),
                ("Paused", ".spec.paused"),
                ("MaxUnhealthy", ".spec.budgets.maxUnhealthyNodes"),
                ("Age", ".metadata.creationTimestamp"),
            ],
        ),
        (
            "Remediation",
            [
                ("Finding", ".spec.finding.kind"),
                ("Target", ".spec.target.name"),
                ("Node", ".spec.target.node"),
                ("Action", ".spec.action"),
                ("Phase", ".status.phase"),
                ("Reason", ".status.reason"),
                ("Lost GPU-h", ".status.badput.gpuHours"),
                ("Cause", ".status.badput.cause"),
                ("Validation", ".status.validation.result"),
                ("Age", ".metadata.creationTimestamp"),
            ],
        ),
        (
            "NodeDevices",
            [
                ("Healthy", ".status.healthy"),
                ("Total", ".status.total"),
                ("Worst", ".status.worstReason"),
                ("Age", ".metadata.creationTimestamp"),
            ],
        ),
    ],
)
def test_printer_columns_point_at_schema_fields(kind: str, columns: list[tuple[str, str]]) -> None:
    printed = [(c["name"], c["jsonPath"]) for c in version(kind)["additionalPrinterColumns"]]
    assert printed == columns
    for _, path in columns:
        if not path.startswith(".metadata."):
            assert schema_at(schema(kind), path.lstrip(".")) is not None, path


def test_every_cel_rule_has_a_message() -> None:
    def rules(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            yield from node.get("x-kubernetes-validations", [])
            for value in node.values():
                yield from rules(value)
        elif isinstance(node, list):
            for value in node:
                yield from rules(value)

    for kind in by_kind():
        for rule in rules(schema(kind)):
            assert rule.get("message") or rule.get("messageExpression"), (kind, rule)


# ---- RemediationPolicy against policy.py ------------------------------------------------------


def test_every_documented_spec_field_is_in_the_schema() -> None:
    documented = documented_spec()
    root = spec_schema("RemediationPolicy")
    missing = [p for p in paths(documented) if schema_at(root, p) is None]
    assert missing == []
    for selector in ("podSelector", "nodeSelector"):
        assert schema_at(root, f"selector.{selector}.matchLabels") is not None
        assert schema_at(root, f"selector.{selector}.matchExpressions") is not None


def test_every_schema_field_is_documented() -> None:
    documented = set(paths(documented_spec())) | documented_optional()
    internal = (
        "selector.podSelector.",
        "selector.nodeSelector.",
        "node.template.",
        "spares.nodeSelector.",
        "signals.",  # two maps, documented with their defaults in signals_policy.py and docs/policy.md
    )
    undocumented = [
        p for p in schema_paths(spec_schema("RemediationPolicy")) if p not in documented and not p.startswith(internal)
    ]
    assert undocumented == []


def test_pod_and_node_selectors_share_one_schema() -> None:
    selector = spec_schema("RemediationPolicy")["properties"]["selector"]["properties"]

    def without_descriptions(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
        return [without_descriptions(v) for v in node] if isinstance(node, list) else node

    assert without_descriptions(selector["podSelector"]) == without_descriptions(selector["nodeSelector"])


DURATIONS = (
    "node.capacityGapAfter",
    "node.remediateAfter",
    "node.holdDown",
    "budgets.workloadDisruptionInterval",
    "budgets.circuitBreaker.window",
)


@pytest.mark.parametrize("path", DURATIONS)
@pytest.mark.parametrize(
    "text", ["30s", "1.5s", "5m", "1h", "1h30m", "2h0m10s", "0s", "5 minutes", "5", "m", "1d", "-1s", "1m1h", "1.5m"]
)
def test_duration_pattern_agrees_with_parse_duration(path: str, text: str) -> None:
    node = schema_at(spec_schema("RemediationPolicy"), path)
    assert node is not None
    assert node["type"] == "string" and node["minLength"] == 1
    by_schema = re.search(node["pattern"], text) is not None
    try:
        parse_duration(text, path)
        by_parser = True
    except PolicyError:
        by_parser = False
    assert by_schema == by_parser, text


def test_documented_defaults_pass_the_schema_and_parse_to_the_built_in_defaults() -> None:
    spec = documented_spec()
    # null in the docs ("no template"): the API server drops a null of a non-nullable field.
    del spec["node"]["template"]
    assert violations(spec, spec_schema("RemediationPolicy")) == []
    parsed = parse_policy({"metadata": {"name": DEFAULT_POLICY.name}, "spec": spec})
    assert parsed == dataclasses.replace(DEFAULT_POLICY, dry_run=False)
    # The recommended policy differs only where it says so: gangs restart in place, more often; stragglers go now;
    # lemons stay out.
    recommended = dataclasses.replace(RECOMMENDED_POLICY, name=DEFAULT_POLICY.name)
    changed = {
        "actions": recommended.actions,
        "budgets": recommended.budgets,
        "stragglers": recommended.stragglers,
        "node": recommended.node,
    }
    assert dataclasses.replace(parsed, **changed) == recommended


def test_the_schema_refuses_a_policy_without_a_selector_as_parse_policy_does() -> None:
    """The CEL rule on spec says what parse_policy says (the lab checks the API server evaluates it)."""
    rules = spec_schema("RemediationPolicy")["x-kubernetes-validations"]
    (rule,) = [r for r in rules if r.get("fieldPath") == ".selector"]
    assert rule["message"] == f"selector: {SELECTOR_REQUIRED}"
    for name in ("namespaces", "podSelector", "nodeSelector"):
        assert f"has(self.selector.{name})" in rule["rule"]
    assert schema("RemediationPolicy")["required"] == ["spec"]


EXAMPLES: list[dict[str, Any]] = [
    {"selector": {"podSelector": {}}},
    {"selector": {"namespaces": ["ml"]}, "dryRun": True},
    {"selector": {"nodeSelector": {"matchLabels": {"pool": "a"}}}, "paused": True, "allowDelete": True},
    {
        "selector": {
            "namespaces": ["training", "serving"],
            "podSelector": {
                "matchLabels": {"team": "ml"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                    {"key": "devheal.io/skip", "operator": "DoesNotExist"},
                ],
            },
            "nodeSelector": {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "Exists"}]},
        },
        "actions": {"inference": "Deschedule", "batch": "FailPod", "gang": "RestartGang", "standalone": "Notify"},
        "deviceErrorExitCodes": [1, 42, 255],
        "crashLoopRestarts": 1,
        "node": {
            "taint": False,
            "cordon": True,
            "capacityGapAfter": "90s",
            "remediateAfter": "1h30m",
            "remediation": "Drain",
            "template": {
                "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediationTemplate",
                "name": "automatic",
                "namespace": "openshift-workload-availability",
            },
            "holdDown": "0.5s",
        },
        "budgets": {
            "maxUnhealthyNodes": 3,
            "maxUnhealthyNodesPerPool": "100%",
            "poolLabel": "cloud.google.com/gke-nodepool",
            "maxConcurrentRemediations": 1,
            "workloadDisruptionInterval": "10m",
            "gangRestartsPerHour": 0,
            "circuitBreaker": {"maxFaultyNodesPercent": 0, "window": "1h"},
        },
    },
    {"selector": {"podSelector": {}}, "budgets": {"maxUnhealthyNodes": "0%", "maxUnhealthyNodesPerPool": "7"}},
    {
        "selector": {"podSelector": {}},
        "budgets": {"maxUnhealthyNodes": 0, "circuitBreaker": {"maxFaultyNodesPercent": 100}},
    },
    {"selector": {"podSelector": {}}, "node": {"remediation": "IdleOnly", "remediateAfter": "2h"}},
]


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda s: ",".join(sorted(s)) or "empty")
def test_examples_are_accepted_by_the_schema_and_by_parse_policy(spec: dict[str, Any]) -> None:
    assert violations(spec, spec_schema("RemediationPolicy")) == []
    parse_policy({"metadata": {"name": "example"}, "spec": spec})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"actions": {"batch": "Reboot"}}, "actions.batch"),
        ({"deviceErrorExitCodes": [0]}, "deviceErrorExitCodes"),
        ({"deviceErrorExitCodes": [256]}, "deviceErrorExitCodes"),
        ({"crashLoopRestarts": 0}, "crashLoopRestarts"),
        ({"node": {"holdDown": "5 minutes"}}, "node.holdDown"),
        ({"node": {"remediateAfter": ""}}, "node.remediateAfter"),
        ({"node": {"remediation": "Reboot"}}, "node.remediation"),
        ({"node": {"template": {"kind": "X", "name": "n", "namespace": "ns"}}}, "node.template"),
        ({"budgets": {"maxConcurrentRemediations": 0}}, "budgets.maxConcurrentRemediations"),
        ({"budgets": {"gangRestartsPerHour": -1}}, "budgets.gangRestartsPerHour"),
        ({"budgets": {"circuitBreaker": {"maxFaultyNodesPercent": 101}}}, "budgets.circuitBreaker"),
        ({"selector": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}}, "matchExpressions"),
    ],
)
def test_the_schema_and_parse_policy_reject_the_same_field(spec: dict[str, Any], field: str) -> None:
    found = violations(spec, spec_schema("RemediationPolicy"))
    assert found and all(field in f for f in found), found
    with pytest.raises(PolicyError, match=re.escape(field)):
        parse_policy({"metadata": {"name": "bad"}, "spec": spec})


# ---- Remediation and NodeDevices --------------------------------------------------------------


def test_remediation_actions_are_every_action_kind() -> None:
    action = spec_schema("Remediation")["properties"]["action"]
    assert action["enum"] == [a.value for a in policy_module.ActionKind]


def test_remediation_spec_is_immutable() -> None:
    rules = spec_schema("Remediation")["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf", "message": "spec is immutable: a Remediation records one decision"} in rules


def test_remediation_workload_classes_are_the_models() -> None:
    from devheal.model.cluster import WorkloadClass

    workload = spec_schema("Remediation")["properties"]["workload"]["properties"]["class"]
    assert workload["enum"] == [c.value for c in WorkloadClass]


def test_an_example_remediation_and_node_devices_pass_their_schemas() -> None:
    remediation = {
        "spec": {
            "action": "FailPod",
            "target": {"kind": "Pod", "namespace": "ml", "name": "train-0", "uid": "u-1", "node": "gpu-node-003"},
            "workload": {"kind": "Job", "namespace": "ml", "name": "train", "class": "batch"},
            "finding": {
                "kind": "DeviceFailed",
                "source": "nvml",
                "evidence": "XID 79",
                "deviceIDs": ["GPU-1"],
                "since": "2026-01-01T00:00:00Z",
            },
            "policy": "default",
            "dryRun": False,
        },
        "status": {
            "phase": "Succeeded",
            "reason": "PodFailed",
            "message": "",
            "attempts": 1,
            "startedAt": "2026-01-01T00:00:01Z",
            "completedAt": "2026-01-01T00:00:02Z",
            "observedAt": "2026-01-01T00:00:02Z",
            "steps": [{"name": "ConditionSet", "at": "2026-01-01T00:00:01Z", "message": "DeviceFailed"}],
        },
    }
    node_devices = {
        "spec": {"nodeName": "gpu-node-003"},
        "status": {
            "devices": [
                {
                    "id": "GPU-1",
                    "index": 0,
                    "model": "NVIDIA H100 80GB HBM3",
                    "resource": "nvidia.com/gpu",
                    "health": "Unhealthy",
                    "reasons": [
                        {
                            "source": "xid",
                            "code": 79,
                            "message": "fell off the bus",
                            "firstSeen": "2026-01-01T00:00:00Z",
                            "lastSeen": "2026-01-01T00:00:00Z",
                            "count": 1,
                        }
                    ],
                    "pod": {"namespace": "ml", "name": "train-0", "container": "trainer"},
                }
            ],
            "healthy": 7,
            "total": 8,
            "worstReason": "XID 79",
            "updatedAt": "2026-01-01T00:00:00Z",
            "conditions": [
                {
                    "type": "AgentReady",
                    "status": "True",
                    "reason": "Publishing",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }
    for kind, obj in (("Remediation", remediation), ("NodeDevices", node_devices)):
        for part in ("spec", "status"):
            assert violations(obj[part], schema(kind)["properties"][part], part) == [], kind


# ---- install_crds against a fake API server ----------------------------------------------------


class FakeApi:
    """Answers apply/get like an API server whose CRDs carry the given conditions."""

    def __init__(self, conditions: list[dict[str, str]], list_failures: int = 0) -> None:
        self.conditions = conditions
        self.list_failures = list_failures
        self.applied: list[str] = []

    async def apply(self, path: str, body: dict[str, Any], *, field_manager: str = "") -> dict[str, Any]:
        assert field_manager == "devheal"
        self.applied.append(path)
        return {**body, "status": {"conditions": self.conditions}}

    async def get(self, path: str, **params: str | int) -> dict[str, Any]:
        if "customresourcedefinitions" in path:
            return {"status": {"conditions": self.conditions}}
        if self.list_failures:
            self.list_failures -= 1
            raise kube_errors.TooManyRequests("storage is (re)initializing", status=429)
        return {"items": []}


READY = [{"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "True"}]


async def test_install_applies_every_crd_and_waits_until_its_resource_is_served() -> None:
    api = FakeApi(READY, list_failures=2)
    await install_crds(cast(KubeClient, api), timeout=5)
    assert api.applied == [f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}" for n in CRD_NAMES]
    assert api.list_failures == 0


async def test_install_fails_at_once_naming_the_crd_whose_names_were_refused() -> None:
    refused = [{"type": "NamesAccepted", "status": "False", "reason": "MultipleNamesNotAllowed", "message": "taken"}]
    with pytest.raises(CRDNotEstablished, match=r"remediationpolicies\.devheal\.io: names not accepted.*taken"):
        await install_crds(cast(KubeClient, FakeApi(refused)), timeout=30)


async def test_install_times_out_naming_the_crd() -> None:
    pending = [{"type": "NamesAccepted", "status": "True"}]
    with pytest.raises(CRDNotEstablished, match=r"remediationpolicies\.devheal\.io: not established within 0.3s"):
        await install_crds(cast(KubeClient, FakeApi(pending)), timeout=0.3)
