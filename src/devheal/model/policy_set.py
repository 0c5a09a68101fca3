"""Which RemediationPolicy governs a node or a pod.

The policies come sorted by name (the cache keeps them so); the first whose selectors match
governs, and none: devheal must not touch the node or pod. Every engine module asks here, so the
rule has one definition.
"""

from __future__ import annotations

from collections.abc import Sequence

from devheal.model.cluster import Node, Pod
from devheal.model.policy import Policy


def policy_for_node(policies: Sequence[Policy], node: Node) -> Policy | None:
    """The first policy (by name) whose node selector matches; None: devheal must not touch the node."""
    return next((p for p in policies if p.selects_node(node.labels)), None)


def policy_for_pod(policies: Sequence[Policy], pod: Pod, node: Node | None) -> Policy | None:
    """The first policy (by name) selecting the pod by its namespace, its labels and its node's labels (none
    without a node); None: devheal must not touch the pod."""
    node_labels = node.labels if node is not None else {}
    return next((p for p in policies if p.selects_pod(pod.namespace, pod.labels, node_labels)), None)
