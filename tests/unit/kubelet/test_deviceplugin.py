"""The device plugin v1beta1 API: wire-compatible with kubelet's, and a plugin that behaves as kubelet expects.

Everything here runs real gRPC over real unix sockets; kubelet's side (its ``Registration``
service) is played by a servicer of the same generated API, since this test has no kubelet
(tests/lab/real_nodes registers the plugin with a real one).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from devheal.kubelet.deviceplugin import DevicePluginServer, PluginDevice, api_pb2, api_pb2_grpc

_T = FieldDescriptor
# (message, field, number, type, repeated) as in k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto.
UPSTREAM_FIELDS = [
    ("DevicePluginOptions", "pre_start_required", 1, _T.TYPE_BOOL, False),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, _T.TYPE_BOOL, False),
    ("RegisterRequest", "version", 1, _T.TYPE_STRING, False),
    ("RegisterRequest", "endpoint", 2, _T.TYPE_STRING, False),
    ("RegisterRequest", "resource_name", 3, _T.TYPE_STRING, False),
    ("RegisterRequest", "options", 4, _T.TYPE_MESSAGE, False),
    ("ListAndWatchResponse", "devices", 1, _T.TYPE_MESSAGE, True),
    ("TopologyInfo", "nodes", 1, _T.TYPE_MESSAGE, True),
    ("NUMANode", "ID", 1, _T.TYPE_INT64, False),
    ("Device", "ID", 1, _T.TYPE_STRING, False),
    ("Device", "health", 2, _T.TYPE_STRING, False),
    ("Device", "topology", 3, _T.TYPE_MESSAGE, False),
    ("PreStartContainerRequest", "devices_ids", 1, _T.TYPE_STRING, True),
    ("PreferredAllocationRequest", "container_requests", 1, _T.TYPE_MESSAGE, True),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, _T.TYPE_STRING, True),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, _T.TYPE_STRING, True),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, _T.TYPE_INT32, False),
    ("PreferredAllocationResponse", "container_responses", 1, _T.TYPE_MESSAGE, True),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, _T.TYPE_STRING, True),
    ("AllocateRequest", "container_requests", 1, _T.TYPE_MESSAGE, True),
    ("ContainerAllocateRequest", "devices_ids", 1, _T.TYPE_STRING, True),
    ("CDIDevice", "name", 1, _T.TYPE_STRING, False),
    ("AllocateResponse", "container_responses", 1, _T.TYPE_MESSAGE, True),
    ("ContainerAllocateResponse", "envs", 1, _T.TYPE_MESSAGE, True),
    ("ContainerAllocateResponse", "mounts", 2, _T.TYPE_MESSAGE, True),
    ("ContainerAllocateResponse", "devices", 3, _T.TYPE_MESSAGE, True),
    ("ContainerAllocateResponse", "annotations", 4, _T.TYPE_MESSAGE, True),
    ("ContainerAllocateResponse", "cdi_devices", 5, _T.TYPE_MESSAGE, True),
    ("Mount", "container_path", 1, _T.TYPE_STRING, False),
    ("Mount", "host_path", 2, _T.TYPE_STRING, False),
    ("Mount", "read_only", 3, _T.TYPE_BOOL, False),
    ("DeviceSpec", "container_path", 1, _T.TYPE_STRING, False),
    ("DeviceSpec", "host_path", 2, _T.TYPE_STRING, False),
    ("DeviceSpec", "permissions", 3, _T.TYPE_STRING, False),
]


@pytest.mark.parametrize(("message", "name", "number", "type_", "repeated"), UPSTREAM_FIELDS)
def test_field_matches_upstream(message: str, name: str, number: int, type_: int, repeated: bool) -> None:
    fd = api_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[name]
    assert (fd.number, fd.type, fd.is_repeated) == (number, type_, repeated)


def test_services_and_methods_are_kubelets() -> None:
    services = {name: set(s.methods_by_name) for name, s in api_pb2.DESCRIPTOR.services_by_name.items()}
    assert api_pb2.DESCRIPTOR.package == "v1beta1"  # the gRPC paths are /v1beta1.<Service>/<Method>
    assert services == {
        "Registration": {"Register"},
        "DevicePlugin": {
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        },
    }
    assert api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


class Kubelet(api_pb2_grpc.RegistrationServicer):
    """kubelet's side of registration: remembers each request."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[api_pb2.RegisterRequest] = asyncio.Queue()

    async def Register(self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        await self.requests.put(request)
        return api_pb2.Empty()


@pytest.fixture
async def plugin_dir() -> AsyncIterator[Path]:
    # A short path: unix socket paths must stay under 108 bytes.
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[Kubelet]:
    servicer = Kubelet()
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(grace=None)


DEVICES = [PluginDevice("GPU-a"), PluginDevice("GPU-b"), PluginDevice("GPU-c")]


@pytest.fixture
async def plugin(plugin_dir: Path, kubelet: Kubelet) -> AsyncIterator[DevicePluginServer]:
    server = DevicePluginServer(plugin_dir, "nvidia.com/gpu", "gpu.sock", DEVICES)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def stub(plugin: DevicePluginServer) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
    async with grpc.aio.insecure_channel(f"unix://{plugin.socket}") as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)


async def test_the_plugin_registers_its_socket_and_resource_with_kubelet(
    plugin: DevicePluginServer, kubelet: Kubelet
) -> None:
    request = await asyncio.wait_for(kubelet.requests.get(), 5)
    assert request.version == "v1beta1"
    assert request.endpoint == "gpu.sock" and plugin.socket.name == "gpu.sock"
    assert request.resource_name == "nvidia.com/gpu"
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required


async def test_list_and_watch_sends_the_devices_then_every_health_change(
    plugin: DevicePluginServer, stub: api_pb2_grpc.DevicePluginStub
) -> None:
    stream = stub.ListAndWatch(api_pb2.Empty())
    first = await asyncio.wait_for(stream.read(), 5)
    assert [(d.ID, d.health) for d in first.devices] == [
        ("GPU-a", "Healthy"),
        ("GPU-b", "Healthy"),
        ("GPU-c", "Healthy"),
    ]
    await plugin.set_devices([PluginDevice("GPU-a"), PluginDevice("GPU-b", healthy=False), PluginDevice("GPU-c")])
    second = await asyncio.wait_for(stream.read(), 5)
    assert [(d.ID, d.health) for d in second.devices][1] == ("GPU-b", "Unhealthy")
    stream.cancel()


async def test_allocate_tells_each_container_its_devices_and_refuses_unknown_ones(
    stub: api_pb2_grpc.DevicePluginStub,
) -> None:
    response = await stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=["GPU-a", "GPU-c"]),
                api_pb2.ContainerAllocateRequest(devices_ids=["GPU-b"]),
            ]
        )
    )
    assert [dict(r.envs) for r in response.container_responses] == [
        {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-c"},
        {"NVIDIA_VISIBLE_DEVICES": "GPU-b"},
    ]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-z"])])
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-z" in (refused.value.details() or "")


async def test_preferred_allocation_keeps_the_required_devices_then_the_lowest(
    stub: api_pb2_grpc.DevicePluginStub,
) -> None:
    response = await stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["GPU-c", "GPU-b", "GPU-a"], must_include_deviceIDs=["GPU-c"], allocation_size=2
                )
            ]
        )
    )
    assert list(response.container_responses[0].deviceIDs) == ["GPU-c", "GPU-a"]
    options = await stub.GetDevicePluginOptions(api_pb2.Empty())
    assert options.get_preferred_allocation_available


async def test_the_plugin_serves_and_registers_again_when_kubelet_clears_its_socket(
    plugin_dir: Path, kubelet: Kubelet
) -> None:
    server = DevicePluginServer(plugin_dir, "nvidia.com/gpu", "gpu.sock", DEVICES)
    task = asyncio.create_task(server.serve_forever(check_every=0.05))
    try:
        await asyncio.wait_for(kubelet.requests.get(), 5)
        server.socket.unlink()  # what a restarting kubelet does to every socket in its directory
        again = await asyncio.wait_for(kubelet.requests.get(), 5)
        assert again.endpoint == "gpu.sock" and server.socket.exists()
    finally:
        task.cancel()
        await server.stop()


def test_an_endpoint_must_be_a_file_name_in_the_plugin_directory(plugin_dir: Path) -> None:
    with pytest.raises(ValueError, match="must be a file name"):
        DevicePluginServer(plugin_dir, "nvidia.com/gpu", "sub/gpu.sock", DEVICES)
