"""Kubelet's device plugin v1beta1 gRPC API: a plugin server that registers with a real kubelet.

The server needs the generated ``api_pb2`` modules, which only exist after
``python -m devheal.kubelet.codegen`` has run; that command imports this package
first, so the server is loaded on first use rather than here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devheal.kubelet import lazy_exports

if TYPE_CHECKING:
    from .server import DevicePluginServer, PluginDevice

__all__ = ["DevicePluginServer", "PluginDevice"]

_LAZY = {"DevicePluginServer": "server", "PluginDevice": "server"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__, globals())
