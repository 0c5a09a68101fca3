"""The kubelet pod-resources v1 gRPC API: wire-compatible server, client and plain value types.

The client and server need the generated ``api_pb2`` modules, which only exist
after ``python -m devheal.kubelet.codegen`` has run; that command
imports this package first, so those names are loaded on first use rather than
here. The value types have no such dependency and are imported eagerly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devheal.kubelet import lazy_exports

from .types import (
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
    PodResourcesSource,
)

if TYPE_CHECKING:
    from .client import PodResourcesClient, PodResourcesError, PodResourcesUnavailable
    from .server import PodResourcesServer, PodResourcesServerGroup

__all__ = [
    "ClaimResource",
    "ContainerDevices",
    "ContainerResources",
    "DynamicResource",
    "PodResources",
    "PodResourcesClient",
    "PodResourcesError",
    "PodResourcesServer",
    "PodResourcesServerGroup",
    "PodResourcesSource",
    "PodResourcesUnavailable",
]

_LAZY = {
    "PodResourcesClient": "client",
    "PodResourcesError": "client",
    "PodResourcesUnavailable": "client",
    "PodResourcesServer": "server",
    "PodResourcesServerGroup": "server",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__, globals())
