"""Which RemediationPolicy governs a node or a pod.

The policies come sorted by name (the cache keeps them so); the first whose selectors match
governs, and none: devheal must not touch the node or pod. Every engine module asks here, so the
rule has one definition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from devheal.model.cluster import Node, Pod
from devheal.model.policy import Policy


def policy_for_node(policies: Sequence[Policy], node: Node) -> Policy | None:
    """The first policy (by name) whose node selector matches; None: devheal must not touch the node."""
    labels = node.labels
    for policy in policies:  # ``policy_for_labels`` without two calls: asked many times per node every round
        selector = policy.node_selector
        if not (selector.match_labels or selector.requirements) or selector.matches(labels):
            return policy
    return None


def policy_for_labels(policies: Sequence[Policy], labels: Mapping[str, str]) -> Policy | None:
    """``policy_for_node`` for a node with these labels."""
    for policy in policies:
        if policy.selects_node(labels):
            return policy
    return None


def node_label_keys(policies: Sequence[Policy]) -> frozenset[str]:
    """Every node label key the policies read to choose a node's policy or to count its pool (node selectors,
    ``budgets.poolLabel``): nodes alike in these labels are alike to the budgets."""
    keys: set[str] = set()
    for p in policies:
        keys.update(k for k, _ in p.node_selector.match_labels)
        keys.update(r.key for r in p.node_selector.requirements)
        keys.add(p.budgets.pool_label)
    return frozenset(keys)


def policy_for_pod(policies: Sequence[Policy], pod: Pod, node: Node | None) -> Policy | None:
    """The first policy (by name) selecting the pod by its namespace, its labels and its node's labels (none
    without a node); None: devheal must not touch the pod."""
    node_labels = node.labels if node is not None else {}
    return next((p for p in policies if p.selects_pod(pod.namespace, pod.labels, node_labels)), None)
