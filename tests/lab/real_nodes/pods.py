"""Waiting for a pod on a real node to reach a phase (the real-node tests' one wait for their pods)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from devheal.kube.client import KubeClient, api_path
from devheal.lab.workloads import get_path, wait_until

ENDED = ("Succeeded", "Failed")


async def pod_in_phase(
    kube: KubeClient, namespace: str, name: str, phases: Collection[str] = ENDED, timeout: float = 120
) -> Any:
    """The pod once its phase is one of ``phases``; ``WaitTimeout`` (naming the pod and its last state) if not
    within ``timeout`` seconds."""
    return await wait_until(
        lambda: kube.get(api_path("v1", "pods", namespace=namespace, name=name)),
        lambda pod: get_path(pod, "status", "phase") in phases,
        timeout=timeout,
        what=f"pod {namespace}/{name} in phase {' or '.join(phases)}",
        interval=0.5,
    )
