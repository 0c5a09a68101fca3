"""Kubelet's device plugin v1beta1 gRPC API: a plugin server that registers with a real kubelet.

The server needs the generated ``api_pb2`` modules, which only exist after
``python -m devheal.kubelet.codegen`` has run; that command imports this package
first, so the server is loaded on first use rather than here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import DevicePluginServer, PluginDevice

__all__ = ["DevicePluginServer", "PluginDevice"]

_LAZY = {"DevicePluginServer": "server", "PluginDevice": "server"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
