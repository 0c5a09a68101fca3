"""The pinned versions of every component the lab builds.

One place, so that a version bump is one edit and the cache directory name
(which embeds all of them) changes with it. The control plane and the real
nodes have a cache directory each: pinning another containerd never rebuilds
the API server, and a lab without real nodes never builds containerd.
"""

from __future__ import annotations

KUBERNETES = "1.37.2"
"""k8s.io/kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl; kubelet, kube-proxy."""

ETCD = "3.6.16"
"""go.etcd.io/etcd/server/v3."""

KWOK = "0.8.0"
"""sigs.k8s.io/kwok: the simulated kubelets."""

CONTAINERD = "2.4.2"
"""github.com/containerd/containerd/v2: containerd, containerd-shim-runc-v2, ctr (real nodes)."""

RUNC = "1.4.4"
"""github.com/opencontainers/runc, built with cgo and libseccomp (real nodes)."""

CNI_PLUGINS = "1.10.0"
"""github.com/containernetworking/plugins: bridge, host-local, loopback, portmap (real nodes)."""

KUEUE = "0.17.0"
"""sigs.k8s.io/kueue: the Kueue controller manager, built only for ``devheal lab up --kueue``."""

GO_MINIMUM = (1, 26)
"""The oldest Go toolchain whose go command can build them all."""


def cache_key() -> str:
    """Name of the control plane's per-version cache directory."""
    return f"k8s-{KUBERNETES}_etcd-{ETCD}_kwok-{KWOK}"


def node_cache_key() -> str:
    """Name of the real nodes' per-version cache directory."""
    return f"node_k8s-{KUBERNETES}_containerd-{CONTAINERD}_runc-{RUNC}_cni-{CNI_PLUGINS}"


def kueue_cache_key() -> str:
    """Name of Kueue's cache directory: its binary and the CRDs and webhook manifests of the same release."""
    return f"kueue-{KUEUE}"
