"""Read a kubelet's pod-resources v1 API (real or simulated) over its unix socket.

The node agent uses this to learn which pod holds which accelerator. gRPC errors
stop here: callers see ``PodResourcesUnavailable`` (the kubelet is down, the
endpoint is disabled, the call timed out, ...) and never a grpc exception, so no
caller has to depend on grpc.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from types import TracebackType
from typing import TypeVar, cast

import grpc

from . import _convert, api_pb2, api_pb2_grpc
from .types import ContainerDevices, PodResources

__all__ = ["PodResourcesClient", "PodResourcesError", "PodResourcesUnavailable"]

_T = TypeVar("_T")

# The kubelet's own pod-resources client accepts answers up to 16 MiB (gRPC's
# default is 4 MiB), which a node with many pods can need.
_MAX_RECEIVE_BYTES = 16 * 1024 * 1024

_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
    # After a kubelet restart the socket is back within seconds; gRPC's default
    # reconnect backoff (up to 120 s) would keep a long-lived client failing long after.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class PodResourcesError(Exception):
    """Base class for everything this client raises."""


class PodResourcesUnavailable(PodResourcesError):
    """The pod-resources API at ``socket_path`` could not answer.

    ``code`` is the gRPC status name (``"UNAVAILABLE"``, ``"DEADLINE_EXCEEDED"``,
    ...) when the failure came from gRPC, None otherwise.
    """

    def __init__(self, socket_path: Path, detail: str, code: str | None = None) -> None:
        super().__init__(f"pod-resources API at {socket_path} unavailable: {detail}")
        self.socket_path = socket_path
        self.detail = detail
        self.code = code


class PodResourcesClient:
    """An async context manager holding one gRPC channel to a pod-resources socket.

    The channel reconnects by itself, so one client can outlive kubelet restarts;
    every call checks that the socket file exists first, to say so plainly instead
    of gRPC's connection error.
    """

    def __init__(self, socket_path: Path, timeout: float = 2.0) -> None:
        self._socket_path = Path(socket_path).absolute()
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerAsyncStub | None = None

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    async def __aenter__(self) -> PodResourcesClient:
        if self._channel is not None:
            raise RuntimeError("PodResourcesClient is already open")
        self._channel = grpc.aio.insecure_channel(f"unix://{self._socket_path}", options=_CHANNEL_OPTIONS)
        # The stub's constructor is overloaded on the channel type, which mypy cannot
        # see because grpc ships no type information.
        self._stub = cast(
            "api_pb2_grpc.PodResourcesListerAsyncStub", api_pb2_grpc.PodResourcesListerStub(self._channel)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def list_pods(self) -> list[PodResources]:
        """Every pod the kubelet reports, with the devices of each container."""
        response = await self._call(self._open_stub().List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout))
        return [_convert.pod_from_pb(pod) for pod in response.pod_resources]

    async def allocatable(self) -> list[ContainerDevices]:
        """Every device the node can hand out, assigned or not."""
        response = await self._call(
            self._open_stub().GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=self._timeout)
        )
        return [_convert.devices_from_pb(devices) for devices in response.devices]

    async def get_pod(self, namespace: str, name: str) -> PodResources | None:
        """One pod's resources, or None when the node does not run it."""
        if not name:
            raise ValueError("pod name must not be empty")
        request = api_pb2.GetPodResourcesRequest(pod_namespace=namespace, pod_name=name)
        try:
            response = await self._open_stub().Get(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            if _is_pod_not_found(exc, namespace, name):
                return None
            raise self._unavailable(exc) from None
        return _convert.pod_from_pb(response.pod_resources)

    def _open_stub(self) -> api_pb2_grpc.PodResourcesListerAsyncStub:
        if self._stub is None:
            raise RuntimeError("use PodResourcesClient as 'async with PodResourcesClient(...) as client'")
        if not self._socket_path.exists():
            raise PodResourcesUnavailable(
                self._socket_path,
                "the socket path does not exist (is the kubelet running, with its pod-resources endpoint?)",
            )
        return self._stub

    async def _call(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except grpc.RpcError as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: grpc.RpcError) -> PodResourcesUnavailable:
        # grpc.aio raises AioRpcError, which carries the status; anything else is opaque.
        if not isinstance(exc, grpc.aio.AioRpcError):
            return PodResourcesUnavailable(self._socket_path, repr(exc))
        code = exc.code()
        return PodResourcesUnavailable(self._socket_path, f"{code.name}: {exc.details()}", code=code.name)


def _is_pod_not_found(exc: grpc.RpcError, namespace: str, name: str) -> bool:
    """Whether a failed Get means "no such pod", from our server or from a real kubelet."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return False
    code = exc.code()
    if code == grpc.StatusCode.NOT_FOUND:
        return True
    # The kubelet returns a plain Go error for a missing pod, which gRPC sends as UNKNOWN.
    return bool(code == grpc.StatusCode.UNKNOWN and exc.details() == f"pod {name} in namespace {namespace} not found")
