"""The kubelet pod-resources v1 gRPC API: wire-compatible server, client and plain value types.

The client and server need the generated ``api_pb2`` modules, which only exist
after ``python -m devheal.kubelet.codegen`` has run; that command
imports this package first, so those names are loaded on first use rather than
here. The value types have no such dependency and are imported eagerly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
