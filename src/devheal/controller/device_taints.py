"""Actions on one DRA device: ``TaintDevice`` (devheal's DeviceTaintRule) and ``UntaintDevice`` (remove it).

A DeviceTaintRule (``resource.k8s.io/v1``, KEP-5055) taints the devices its selector matches; devheal's
selects exactly one device by driver, pool and device name, carries the label
``app.kubernetes.io/managed-by=devheal`` and names the device in an annotation, and has a name derived from
the device (``devheal.model.dra.rule_name``), so a repeated pass finds the rule it made instead of making a
second one. ``NoSchedule`` keeps new claims off the device; ``NoExecute`` (when the policy's
``devices.taintEffect`` asks for it) also has the kube-controller-manager evict the pods using it. Nothing
else on the node changes. ``UntaintDevice`` deletes only a rule devheal owns, and only the one it read.

Before it makes a rule, ``TaintDevice`` reads the device's ResourceSlices afresh from the API server and
refuses (Failed, ``DeviceNotPublished``) a device that no slice publishes on the action's node: the engine
already counts no other (``devheal.engine.dra``), and a rule on a device nobody publishes would never be
lifted, since nothing would ever say the device is healthy again.
"""

from __future__ import annotations

import contextlib

from devheal.controller.action_family import Outcome, Policies, StepFailed, Steps
from devheal.controller.dra_projections import project_resource_slice
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.dra import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    RESOURCE_API,
    DraDevice,
    device_taint_rule,
    parse_device_id,
    rule_name,
)
from devheal.model.plan import Action, Phase, RemediationReason

RULES = api_path(RESOURCE_API, "devicetaintrules")
SLICES = api_path(RESOURCE_API, "resourceslices")
NOT_PUBLISHED = "DeviceNotPublished"
"""The reason of a TaintDevice refused because no ResourceSlice publishes the device on its node."""


async def published_on(client: KubeClient, device: DraDevice, node: str) -> bool:
    """Whether a ResourceSlice of the device's driver publishes it on ``node`` (read from the API server: a slice
    that cannot be read publishes nothing)."""
    selector = f"spec.driver={device.driver},spec.nodeName={node}"  # both served as field selectors
    # Closed at once when found: the next page, asked for meanwhile, is not wanted.
    async with contextlib.aclosing(client.list_pages(SLICES, {"fieldSelector": selector})) as pages:
        async for page in pages:
            for item in page.items:
                try:
                    devices = project_resource_slice(item)
                except Exception:  # whatever is wrong with it, it vouches for no device
                    continue
                if any(d.device == device and d.node == node for d in devices):
                    return True
    return False


class TaintDevice:
    def __init__(self, client: KubeClient, policies: Policies) -> None:
        self.client = client
        self.policies = policies

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        device = parse_device_id(action.target)
        if device is None:
            raise StepFailed(
                f"{action.target!r} is not a DRA device (driver/pool/device)", retry=False, reason="InvalidDevice"
            )
        try:
            published = await published_on(self.client, device, action.node)
        except errors.NotFound as exc:
            raise StepFailed(
                f"the API server does not serve ResourceSlices ({RESOURCE_API})", retry=False, reason=NOT_PUBLISHED
            ) from exc
        except errors.Forbidden as exc:
            raise StepFailed(
                f"not allowed to list ResourceSlices: {exc}", retry=False, reason=RemediationReason.FORBIDDEN
            ) from exc
        if not published:
            raise StepFailed(
                f"no ResourceSlice publishes {action.target} on node {action.node}: no DeviceTaintRule for a device "
                "its node does not publish (nothing would ever lift it)",
                retry=False,
                reason=NOT_PUBLISHED,
            )
        policy = self.policies().get(action.policy)
        effect = policy.devices.taint_effect if policy is not None else "NoSchedule"
        body = device_taint_rule(device, effect, action.finding.evidence)
        name = rule_name(device)
        try:
            await self.client.create(RULES, body)
            steps = ["device-taint"]
        except errors.AlreadyExists:
            steps = []  # an earlier pass made it
        except errors.NotFound as exc:
            raise StepFailed(
                f"the API server does not serve DeviceTaintRules ({RESOURCE_API}): enable DRADeviceTaintRules",
                retry=False,
                reason="DeviceTaintRulesMissing",
            ) from exc
        except errors.Forbidden as exc:
            raise StepFailed(
                f"not allowed to create DeviceTaintRules: {exc}", retry=False, reason=RemediationReason.FORBIDDEN
            ) from exc
        return (
            Outcome(
                Phase.SUCCEEDED,
                RemediationReason.TAINTED,
                f"DeviceTaintRule {name} taints {action.target} {body['spec']['taint']['key']}:{effect}; "
                f"node {action.node} untouched",
            ),
            steps,
        )


class UntaintDevice:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        device = parse_device_id(action.target)
        if device is None:
            raise StepFailed(
                f"{action.target!r} is not a DRA device (driver/pool/device)", retry=False, reason="InvalidDevice"
            )
        name = rule_name(device)
        path = f"{RULES}/{name}"
        try:
            rule = await self.client.get(path)
        except errors.NotFound:
            return Outcome(Phase.SUCCEEDED, RemediationReason.LIFTED, f"DeviceTaintRule {name} already gone"), []
        labels = (rule.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
            return (
                Outcome(Phase.SKIPPED, RemediationReason.CONFLICT, f"DeviceTaintRule {name} is not devheal's: kept"),
                [],
            )
        uid = (rule.get("metadata") or {}).get("uid")
        try:
            await self.client.delete(path, {"preconditions": {"uid": uid}} if uid else None)
        except errors.NotFound:
            return Outcome(Phase.SUCCEEDED, RemediationReason.LIFTED, f"DeviceTaintRule {name} already gone"), []
        return (
            Outcome(Phase.SUCCEEDED, RemediationReason.LIFTED, f"removed DeviceTaintRule {name} from {action.target}"),
            ["device-untaint"],
        )
