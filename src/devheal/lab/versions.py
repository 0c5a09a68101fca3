"""The pinned versions of every control-plane component the lab builds.

One place, so that a version bump is one edit and the cache directory name
(which embeds all of them) changes with it.
"""

from __future__ import annotations

KUBERNETES = "1.37.2"
"""k8s.io/kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl."""

ETCD = "3.6.16"
"""go.etcd.io/etcd/server/v3."""

KWOK = "0.8.0"
"""sigs.k8s.io/kwok: the simulated kubelets."""

GO_MINIMUM = (1, 26)
"""The oldest Go toolchain whose go command can build all three."""


def cache_key() -> str:
    """Name of the per-version cache directory."""
    return f"k8s-{KUBERNETES}_etcd-{ETCD}_kwok-{KWOK}"
