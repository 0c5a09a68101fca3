"""``node.validation``: the pod a node passes after a remediation; bad input names the policy and the field."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.policy import PolicyError, parse_policy
from devheal.model.validation_policy import DEFAULT_VALIDATION_TIMEOUT

TEMPLATE = {"apiVersion": "example.com/v1", "kind": "ResetTemplate", "namespace": "ops", "name": "reset"}
POD = {"containers": [{"name": "check", "image": "dcgm:4", "command": ["dcgmi", "diag", "-r", "2"]}]}


def with_validation(validation: Any, **node: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"selector": {"nodeSelector": {}}, "node": {"template": TEMPLATE, "validation": validation, **node}},
    }


def test_a_validation_is_read_with_its_defaults() -> None:
    pod_template = {"metadata": {"labels": {"app": "gpu-check"}}, "spec": POD}
    rules = parse_policy(with_validation({"podTemplate": pod_template, "namespace": "ops"})).node
    assert rules.validation is not None
    assert rules.validation.namespace == "ops"
    assert rules.validation.timeout == DEFAULT_VALIDATION_TIMEOUT
    assert rules.validation.pod_template == pod_template
    rules.validation.pod_template["spec"]["containers"].clear()  # each caller gets its own copy
    assert rules.validation.pod_template == pod_template


def test_no_validation_by_default() -> None:
    assert parse_policy({"metadata": {"name": "p"}, "spec": {"selector": {"nodeSelector": {}}}}).node.validation is None


def test_the_timeout_is_read() -> None:
    given = {"podTemplate": {"spec": POD}, "namespace": "ops", "timeout": "90s"}
    validation = parse_policy(with_validation(given)).node.validation
    assert validation is not None and validation.timeout == 90.0


def test_a_policy_with_validation_is_a_value() -> None:
    """Policies are compared and hashed as values: the template is kept as text, not a dict."""
    one = parse_policy(with_validation({"podTemplate": {"spec": POD}, "namespace": "ops"}))
    assert one == parse_policy(with_validation({"podTemplate": {"spec": POD}, "namespace": "ops"}))
    assert hash(one.node) == hash(one.node)


def pod(**spec: Any) -> dict[str, Any]:
    return {"podTemplate": {"spec": {**POD, **spec}}, "namespace": "ops"}


@pytest.mark.parametrize(
    ("validation", "field", "words"),
    [
        ("dcgm", "spec.node.validation", "expected an object"),
        ({"podTemplate": {"spec": POD}, "namespace": "ops", "image": "x"}, "spec.node.validation", "unknown field"),
        ({"namespace": "ops"}, "spec.node.validation.podTemplate", "expected an object"),
        ({"podTemplate": {"spec": POD}}, "spec.node.validation.namespace", "namespace the pod runs in"),
        ({"podTemplate": {"spec": POD}, "namespace": "Ops!"}, "spec.node.validation.namespace", "DNS label"),
        ({"podTemplate": {"spec": POD, "kind": "Pod"}, "namespace": "ops"}, "spec.node.validation.podTemplate", ""),
        ({"podTemplate": {}, "namespace": "ops"}, "spec.node.validation.podTemplate.spec", "expected an object"),
        (
            {"podTemplate": {"metadata": {"name": "x"}, "spec": POD}, "namespace": "ops"},
            "spec.node.validation.podTemplate.metadata",
            "unknown field(s) name",
        ),
        (
            {"podTemplate": {"metadata": {"labels": {"a": 1}}, "spec": POD}, "namespace": "ops"},
            "spec.node.validation.podTemplate.metadata.labels.a",
            "a string",
        ),
        (
            {"podTemplate": {"spec": {"containers": []}}, "namespace": "ops"},
            "spec.node.validation.podTemplate.spec.containers",
            "non-empty list",
        ),
        (pod(restartPolicy="OnFailure"), "spec.node.validation.podTemplate.spec.restartPolicy", "Never"),
        (pod(nodeName="n1"), "spec.node.validation.podTemplate.spec.nodeName", "pins the pod"),
        (
            pod(affinity={"nodeAffinity": {}}),
            "spec.node.validation.podTemplate.spec.affinity.nodeAffinity",
            "pins the pod",
        ),
        (
            pod(tolerations=[{"operator": "Exists"}]),
            "spec.node.validation.podTemplate.spec.tolerations[0]",
            "every taint",
        ),
        (
            pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]),
            "spec.node.validation.podTemplate.spec.tolerations[0]",
            "cordon",
        ),
        ({**pod(), "timeout": "0s"}, "spec.node.validation.timeout", "above 0s"),
        ({**pod(), "timeout": "soon"}, "spec.node.validation.timeout", ""),
    ],
)
def test_bad_validations_are_refused_naming_the_field(validation: Any, field: str, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(with_validation(validation))
    message = str(caught.value)
    assert message.startswith(f"RemediationPolicy p: {field}"), message
    assert words in message


def test_a_validation_needs_a_remediation_to_validate() -> None:
    spec = {"selector": {"nodeSelector": {}}, "node": {"validation": pod()}}
    with pytest.raises(PolicyError, match=r"spec\.node\.validation: .*node\.template or node\.escalation"):
        parse_policy({"metadata": {"name": "p"}, "spec": spec})


def test_a_toleration_of_another_named_taint_is_the_templates_own() -> None:
    """A GPU node's own taint (``nvidia.com/gpu``) must be tolerable, or no GPU pod lands there."""
    given = pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert parse_policy(with_validation(given)).node.validation is not None
