"""The Eviction requests devheal sends for pods on failed devices (Deschedule, gang ranks it replaces)."""

from __future__ import annotations

from devheal.kube.client import Obj
from devheal.model.policy import Policy


def delete_options(uid: str, grace_seconds: int | None) -> Obj:
    """Delete options: only this incarnation of the pod (by UID), with the policy's grace period when it sets one.

    A process stuck on a dead GPU often ignores SIGTERM; a short grace period keeps it from
    holding up its replacement for the pod's whole ``terminationGracePeriodSeconds``.
    """
    options: Obj = {"preconditions": {"uid": uid}} if uid else {}
    if grace_seconds is not None:
        options["gracePeriodSeconds"] = grace_seconds
    return options


def failed_device_grace(policy: Policy | None) -> int | None:
    return policy.failed_device_grace_period if policy is not None else None


def eviction(namespace: str, name: str, uid: str, grace_seconds: int | None) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": delete_options(uid, grace_seconds),
    }
