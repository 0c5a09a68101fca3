"""A device plugin speaking kubelet's v1beta1 API: serve ``DevicePlugin`` on a socket, register with kubelet.

What kubelet's device manager expects of a plugin, and this does:

- serve ``DevicePlugin`` on a unix socket in kubelet's device-plugin directory, then call
  ``Registration.Register`` on ``kubelet.sock`` there with the socket's file name and the resource;
- ``ListAndWatch``: send every device with its health at once, and the whole list again whenever
  one changes (``set_devices``): kubelet counts the Healthy ones as the node's allocatable, and
  with ``ResourceHealthStatus`` reports an Unhealthy one in the status of the pod holding it;
- ``Allocate``: tell the container its devices (``NVIDIA_VISIBLE_DEVICES``, as the NVIDIA plugin
  does); unknown IDs are an ``INVALID_ARGUMENT`` error, which kubelet turns into the pod's
  admission failure;
- ``GetPreferredAllocation``: the devices that must be included, then the lowest IDs available;
- when kubelet restarts it removes every socket in the directory: ``serve_forever`` notices its
  socket is gone and serves and registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from . import api_pb2, api_pb2_grpc

__all__ = ["API_VERSION", "KUBELET_SOCKET", "DevicePluginServer", "PluginDevice"]

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class PluginDevice:
    """One device as the plugin advertises it."""

    id: str
    healthy: bool = True

    def to_proto(self) -> api_pb2.Device:
        return api_pb2.Device(ID=self.id, health=HEALTHY if self.healthy else UNHEALTHY)


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, plugin: DevicePluginServer) -> None:
        self.plugin = plugin

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self.plugin.options()

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = -1
        while True:
            version, devices = await self.plugin.next_devices(version)
            yield api_pb2.ListAndWatchResponse(devices=[d.to_proto() for d in devices])

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            chosen = list(dict.fromkeys(req.must_include_deviceIDs))
            chosen += [d for d in sorted(req.available_deviceIDs) if d not in chosen]
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen[: req.allocation_size]))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        known = {d.id for d in self.plugin.devices}
        responses = []
        for req in request.container_requests:
            unknown = [d for d in req.devices_ids if d not in known]
            if unknown:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self.plugin.resource}: no such device(s) {', '.join(unknown)} on this node",
                )
            responses.append(api_pb2.ContainerAllocateResponse(envs={VISIBLE_DEVICES_ENV: ",".join(req.devices_ids)}))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class DevicePluginServer:
    """One resource's plugin, serving ``<plugin_dir>/<endpoint>`` and registered with ``<plugin_dir>/kubelet.sock``."""

    def __init__(self, plugin_dir: Path, resource: str, endpoint: str, devices: Sequence[PluginDevice]) -> None:
        if "/" in endpoint:
            raise ValueError(f"endpoint must be a file name in {plugin_dir}, got {endpoint!r}")
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.endpoint = endpoint
        self.devices: tuple[PluginDevice, ...] = tuple(devices)
        self._version = 0
        self._changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    @property
    def socket(self) -> Path:
        return self.plugin_dir / self.endpoint

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def set_devices(self, devices: Sequence[PluginDevice]) -> None:
        """Advertise ``devices`` from now on: every ``ListAndWatch`` stream sends the new list."""
        async with self._changed:
            self.devices = tuple(devices)
            self._version += 1
            self._changed.notify_all()

    async def next_devices(self, seen: int) -> tuple[int, tuple[PluginDevice, ...]]:
        """The device list once it is newer than version ``seen`` (at once for a new stream)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != seen)
            return self._version, self.devices

    async def start(self) -> None:
        """Serve on the plugin socket (replacing a stale one) and register with kubelet."""
        await self.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        await self.register()

    async def register(self) -> None:
        kubelet = self.plugin_dir / KUBELET_SOCKET
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource, options=self.options()
                ),
                timeout=10,
            )

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def serve_forever(self, check_every: float = 1.0) -> None:
        """Start, then start again whenever the socket disappears (kubelet restarted and cleared the directory).

        Until kubelet answers, registration is retried every ``check_every`` seconds."""
        while True:
            if self._server is None or not self.socket.exists():
                try:
                    await self.start()
                except grpc.aio.AioRpcError:
                    await self.stop()  # kubelet is not there (yet): try again
            await asyncio.sleep(check_every)
