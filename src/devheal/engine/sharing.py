"""Pods that share a physical GPU: time-sliced or MPS replicas (``<uuid>::<n>``), MIG instances that name it.

The node agent reports the physical GPU (``GPU-abc``); the kubelet gave each pod a replica or an
instance of it. A GPU-wide failure the agent reports fails every pod on that GPU; a fault of one MIG
instance (reported, or in pod status, under the instance's own ID) fails only the pods on it.
Pure (``devheal.model.gpu_resources`` maps the IDs).
"""

from __future__ import annotations

from devheal.model.cluster import ClusterView, Pod
from devheal.model.gpu_resources import physical_id


def sharers(view: ClusterView, node: str, physical: str) -> list[Pod]:
    """The active pods on ``node`` holding a part of ``physical`` (a replica or a MIG instance of it), not the
    device itself; in key order."""
    found = []
    for pod in view.pods_on(node):
        if pod.active and any(d.device_id != physical and physical_id(d.device_id) == physical for d in pod.devices):
            found.append(pod)
    return sorted(found, key=lambda p: p.key)
