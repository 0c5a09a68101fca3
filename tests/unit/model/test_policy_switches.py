"""Policy switches: pause (field or annotation), dry-run, actions per class, node rules and templates."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.cluster import WorkloadClass
from devheal.model.policy import ActionKind, RemediationMode, TemplateRef, parse_policy


def parse(spec: Any, **meta: Any) -> Any:
    return parse_policy({"metadata": {"name": "p", **meta}, "spec": {"selector": {"podSelector": {}}, **spec}})


@pytest.mark.parametrize(("value", "paused"), [("true", True), ("True", True), ("false", False), ("yes", False)])
def test_paused_by_annotation(value: str, paused: bool) -> None:
    assert parse({}, annotations={"devheal.io/paused": value}).paused is paused


def test_paused_by_field_or_annotation() -> None:
    assert parse({"paused": True}).paused
    assert parse({"paused": True}, annotations={"devheal.io/paused": "false"}).paused
    assert not parse({"paused": False}, annotations={"other": "true"}).paused


def test_dry_run_and_allow_delete() -> None:
    p = parse({"dryRun": True, "allowDelete": True})
    assert (p.dry_run, p.allow_delete) == (True, True)


def test_actions_override_only_the_named_classes() -> None:
    p = parse({"actions": {"inference": "Notify", "gang": "RestartGang"}})
    assert p.actions[WorkloadClass.INFERENCE] is ActionKind.NOTIFY
    assert p.actions[WorkloadClass.GANG] is ActionKind.RESTART_GANG
    assert p.actions[WorkloadClass.BATCH] is ActionKind.FAIL_POD
    assert p.actions[WorkloadClass.STANDALONE] is ActionKind.NOTIFY


def test_exit_codes_and_crash_loop_threshold() -> None:
    p = parse({"deviceErrorExitCodes": [74, 79], "crashLoopRestarts": 5})
    assert p.device_error_exit_codes == frozenset({74, 79})
    assert p.crash_loop_restarts == 5


def test_node_rules_and_template() -> None:
    template = {
        "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
        "kind": "SelfNodeRemediationTemplate",
        "name": "snr",
        "namespace": "medik8s",
    }
    p = parse({"node": {"taint": False, "cordon": True, "remediation": "Drain", "template": template}})
    assert (p.node.taint, p.node.cordon, p.node.remediation) == (False, True, RemediationMode.DRAIN)
    assert p.node.template == TemplateRef(
        "self-node-remediation.medik8s.io/v1alpha1", "SelfNodeRemediationTemplate", "snr", "medik8s"
    )


@pytest.mark.parametrize(
    ("kind", "remediation_kind"),
    [
        ("SelfNodeRemediationTemplate", "SelfNodeRemediation"),
        ("MachineDeletionRemediationTemplate", "MachineDeletionRemediation"),
        ("NodeReboot", "NodeReboot"),
    ],
)
def test_template_remediation_kind_strips_template(kind: str, remediation_kind: str) -> None:
    assert TemplateRef("v1", kind, "n", "ns").remediation_kind == remediation_kind


def test_failed_device_grace_period_is_unset_by_default_and_parsed_when_given() -> None:
    assert parse({}).failed_device_grace_period is None
    assert parse({"failedDeviceGracePeriodSeconds": 5}).failed_device_grace_period == 5
