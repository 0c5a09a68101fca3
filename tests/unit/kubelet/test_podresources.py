"""The pod-resources API must stay wire-compatible with the kubelet's and behave like it.

Everything here runs real gRPC over real unix sockets: the contract with the
kubelet (names, field numbers, error codes) only shows on the wire.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from devheal.kubelet.podresources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesServer,
    PodResourcesServerGroup,
    PodResourcesSource,
    PodResourcesUnavailable,
    api_pb2,
    api_pb2_grpc,
)

GPU = "nvidia.com/gpu"


@dataclass
class FakeSource:
    """An in-memory node, as the lab's simulated kubelets provide one."""

    pods: dict[tuple[str, str], PodResources] = field(default_factory=dict)
    devices: list[ContainerDevices] = field(default_factory=list)
    fail_with: Exception | None = None

    def add(self, pod: PodResources) -> None:
        self.pods[(pod.namespace, pod.name)] = pod

    def list_pods(self) -> Sequence[PodResources]:
        if self.fail_with is not None:
            raise self.fail_with
        return list(self.pods.values())

    def allocatable(self) -> Sequence[ContainerDevices]:
        return list(self.devices)

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        return self.pods.get((namespace, name))


def gpu_pod(namespace: str, name: str, *gpus: str, numa: tuple[int, ...] = ()) -> PodResources:
    return PodResources(
        namespace=namespace,
        name=name,
        containers=(
            ContainerResources(name="main", devices=(ContainerDevices(GPU, tuple(gpus), numa),)),
            ContainerResources(name="sidecar", devices=()),
        ),
    )


def node_source(node: str) -> FakeSource:
    source = FakeSource(devices=[ContainerDevices(GPU, (f"{node}-gpu0", f"{node}-gpu1"), (0,))])
    source.add(gpu_pod("train", f"{node}-job", f"{node}-gpu0", numa=(0,)))
    return source


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # Not tmp_path: pytest's per-test directories can exceed the 107-byte limit on
    # unix socket paths.
    path = Path(tempfile.mkdtemp(prefix="podres-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def source() -> FakeSource:
    source = FakeSource(
        devices=[
            ContainerDevices(GPU, ("GPU-0", "GPU-1"), (0,)),
            ContainerDevices(GPU, ("GPU-2", "GPU-3"), (1,)),
            ContainerDevices("example.com/nic", ("nic-0",)),
        ]
    )
    source.add(gpu_pod("ml", "trainer-0", "GPU-0", "GPU-1", numa=(0,)))
    source.add(gpu_pod("ml", "trainer-1", "GPU-2", numa=(1,)))
    source.add(PodResources(namespace="kube-system", name="coredns", containers=()))
    return source


@pytest.fixture
async def server(source: FakeSource, sock_dir: Path) -> AsyncIterator[PodResourcesServer]:
    async with PodResourcesServer(source, sock_dir / "kubelet.sock") as srv:
        yield srv


# --- the wire contract ----------------------------------------------------------------

_T = FieldDescriptor
# (message, field, number, type, repeated) as in k8s.io/kubelet/pkg/apis/podresources/v1/api.proto.
UPSTREAM_FIELDS = [
    ("ListPodResourcesResponse", "pod_resources", 1, _T.TYPE_MESSAGE, True),
    ("PodResources", "name", 1, _T.TYPE_STRING, False),
    ("PodResources", "namespace", 2, _T.TYPE_STRING, False),
    ("PodResources", "containers", 3, _T.TYPE_MESSAGE, True),
    ("ContainerResources", "name", 1, _T.TYPE_STRING, False),
    ("ContainerResources", "devices", 2, _T.TYPE_MESSAGE, True),
    ("ContainerResources", "cpu_ids", 3, _T.TYPE_INT64, True),
    ("ContainerResources", "memory", 4, _T.TYPE_MESSAGE, True),
    ("ContainerResources", "dynamic_resources", 5, _T.TYPE_MESSAGE, True),
    ("ContainerMemory", "memory_type", 1, _T.TYPE_STRING, False),
    ("ContainerMemory", "size", 2, _T.TYPE_UINT64, False),
    ("ContainerMemory", "topology", 3, _T.TYPE_MESSAGE, False),
    ("ContainerDevices", "resource_name", 1, _T.TYPE_STRING, False),
    ("ContainerDevices", "device_ids", 2, _T.TYPE_STRING, True),
    ("ContainerDevices", "topology", 3, _T.TYPE_MESSAGE, False),
    ("TopologyInfo", "nodes", 1, _T.TYPE_MESSAGE, True),
    ("NUMANode", "ID", 1, _T.TYPE_INT64, False),
    ("DynamicResource", "claim_name", 2, _T.TYPE_STRING, False),
    ("DynamicResource", "claim_namespace", 3, _T.TYPE_STRING, False),
    ("DynamicResource", "claim_resources", 4, _T.TYPE_MESSAGE, True),
    ("ClaimResource", "cdi_devices", 1, _T.TYPE_MESSAGE, True),
    ("ClaimResource", "driver_name", 2, _T.TYPE_STRING, False),
    ("ClaimResource", "pool_name", 3, _T.TYPE_STRING, False),
    ("ClaimResource", "device_name", 4, _T.TYPE_STRING, False),
    ("CDIDevice", "name", 1, _T.TYPE_STRING, False),
    ("AllocatableResourcesResponse", "devices", 1, _T.TYPE_MESSAGE, True),
    ("AllocatableResourcesResponse", "cpu_ids", 2, _T.TYPE_INT64, True),
    ("AllocatableResourcesResponse", "memory", 3, _T.TYPE_MESSAGE, True),
    ("GetPodResourcesRequest", "pod_name", 1, _T.TYPE_STRING, False),
    ("GetPodResourcesRequest", "pod_namespace", 2, _T.TYPE_STRING, False),
    ("GetPodResourcesResponse", "pod_resources", 1, _T.TYPE_MESSAGE, False),
]


@pytest.mark.parametrize(("message", "name", "number", "type_", "repeated"), UPSTREAM_FIELDS)
def test_field_matches_upstream(message: str, name: str, number: int, type_: int, repeated: bool) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    fd = descriptor.fields_by_name[name]
    assert fd.number == number
    assert fd.type == type_
    assert fd.is_repeated == repeated


def test_messages_have_no_fields_beyond_upstream() -> None:
    expected: dict[str, set[str]] = {}
    for message, name, *_ in UPSTREAM_FIELDS:
        expected.setdefault(message, set()).add(name)
    for message, descriptor in api_pb2.DESCRIPTOR.message_types_by_name.items():
        assert set(descriptor.fields_by_name) == expected.get(message, set()), message
    # Upstream dropped DynamicResource field 1; reusing it would misread old peers.
    assert 1 not in api_pb2.DynamicResource.DESCRIPTOR.fields_by_number


def test_service_and_method_names_match_upstream() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1"
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    methods = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}
    assert methods == {
        "List": ("v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse"),
        "GetAllocatableResources": ("v1.AllocatableResourcesRequest", "v1.AllocatableResourcesResponse"),
        "Get": ("v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse"),
    }


def test_encoding_matches_hand_assembled_bytes() -> None:
    # Tags computed by hand from the upstream numbers: (field << 3) | wire type 2.
    msg = api_pb2.ContainerDevices(resource_name="a/b", device_ids=["G0"])
    msg.topology.nodes.add(ID=1)
    assert msg.SerializeToString() == b"\x0a\x03a/b" + b"\x12\x02G0" + b"\x1a\x04" + b"\x0a\x02\x08\x01"


def test_fake_source_satisfies_protocol(source: FakeSource) -> None:
    assert isinstance(source, PodResourcesSource)


# --- server and client together -----------------------------------------------------------


async def test_round_trip_through_real_socket(server: PodResourcesServer, source: FakeSource) -> None:
    async with PodResourcesClient(server.socket_path) as client:
        pods = await client.list_pods()
        allocatable = await client.allocatable()
        one = await client.get_pod("ml", "trainer-1")

    assert sorted(pods, key=lambda p: p.name) == sorted(source.pods.values(), key=lambda p: p.name)
    assert allocatable == source.devices
    assert one == source.pods[("ml", "trainer-1")]
    assert one is not None and one.containers[0].devices[0].numa_nodes == (1,)


async def test_client_sees_source_changes(server: PodResourcesServer, source: FakeSource) -> None:
    async with PodResourcesClient(server.socket_path) as client:
        assert await client.get_pod("ml", "late") is None
        source.add(gpu_pod("ml", "late", "GPU-3"))
        late = await client.get_pod("ml", "late")
    assert late is not None and late.containers[0].devices[0].device_ids == ("GPU-3",)


async def test_generated_stub_uses_kubelet_method_paths(server: PodResourcesServer) -> None:
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        assert {p.name for p in listed.pod_resources} == {"trainer-0", "trainer-1", "coredns"}

        # The same calls with the method paths spelled out, as a Go client sends them.
        def raw(method: str) -> grpc.aio.UnaryUnaryMultiCallable:
            return channel.unary_unary(method, request_serializer=None, response_deserializer=None)

        body = await raw("/v1.PodResourcesLister/List")(b"", timeout=5)
        assert api_pb2.ListPodResourcesResponse.FromString(body) == listed
        body = await raw("/v1.PodResourcesLister/GetAllocatableResources")(b"", timeout=5)
        devices = api_pb2.AllocatableResourcesResponse.FromString(body).devices
        assert [list(d.device_ids) for d in devices] == [["GPU-0", "GPU-1"], ["GPU-2", "GPU-3"], ["nic-0"]]
        request = api_pb2.GetPodResourcesRequest(pod_name="trainer-0", pod_namespace="ml")
        body = await raw("/v1.PodResourcesLister/Get")(request.SerializeToString(), timeout=5)
        got = api_pb2.GetPodResourcesResponse.FromString(body).pod_resources
        assert (got.namespace, got.name, list(got.containers[0].devices[0].device_ids)) == (
            "ml",
            "trainer-0",
            ["GPU-0", "GPU-1"],
        )
        # A device without NUMA information leaves topology unset, as the kubelet does.
        assert devices[0].HasField("topology") and not devices[2].HasField("topology")


async def test_get_unknown_pod_is_not_found(server: PodResourcesServer) -> None:
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Get(api_pb2.GetPodResourcesRequest(pod_name="ghost", pod_namespace="ml"), timeout=5)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert "ghost" in (raised.value.details() or "") and "ml" in (raised.value.details() or "")

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Get(api_pb2.GetPodResourcesRequest(pod_name="", pod_namespace="ml"), timeout=5)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    async with PodResourcesClient(server.socket_path) as client:
        assert await client.get_pod("ml", "ghost") is None
        with pytest.raises(ValueError):
            await client.get_pod("ml", "")


async def test_missing_socket_is_unavailable(sock_dir: Path) -> None:
    path = sock_dir / "nowhere" / "kubelet.sock"
    async with PodResourcesClient(path) as client:
        for call in (client.list_pods(), client.allocatable(), client.get_pod("ml", "x")):
            with pytest.raises(PodResourcesUnavailable) as raised:
                await call
            assert raised.value.socket_path == path
            assert "does not exist" in str(raised.value) and str(path) in str(raised.value)
            assert isinstance(raised.value, PodResourcesError)


async def test_dead_socket_is_unavailable_not_grpc_error(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    # A socket file nobody listens on: what a crashed kubelet leaves behind.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))
    async with PodResourcesClient(path, timeout=2) as client:
        with pytest.raises(PodResourcesUnavailable) as raised:
            await client.list_pods()
    assert raised.value.code == "UNAVAILABLE"
    assert not isinstance(raised.value, grpc.RpcError)


async def test_failing_source_is_reported_as_internal(server: PodResourcesServer, source: FakeSource) -> None:
    source.fail_with = RuntimeError("simulated node exploded")
    async with PodResourcesClient(server.socket_path) as client:
        with pytest.raises(PodResourcesUnavailable) as raised:
            await client.list_pods()
    assert raised.value.code == "INTERNAL"
    assert "simulated node exploded" in raised.value.detail


class KubeletLikeServicer(api_pb2_grpc.PodResourcesListerServicer):
    """Answers like the real kubelet: plain Go errors arrive as UNKNOWN; and it can be slow."""

    def __init__(self, get_disabled: bool = False, delay: float = 0.0) -> None:
        self.get_disabled = get_disabled
        self.delay = delay

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        await asyncio.sleep(self.delay)
        return api_pb2.ListPodResourcesResponse()

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        # What a kubelet older than the method (or a foreign server) answers.
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        raise AssertionError("unreachable")

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        if self.get_disabled:
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        await context.abort(
            grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )
        raise AssertionError("unreachable")


async def _serve(servicer: KubeletLikeServicer, path: Path) -> grpc.aio.Server:
    raw_server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, raw_server)
    raw_server.add_insecure_port(f"unix://{path}")
    await raw_server.start()
    return raw_server


async def test_client_understands_kubelet_errors(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    servicer = KubeletLikeServicer()
    raw_server = await _serve(servicer, path)
    try:
        async with PodResourcesClient(path) as client:
            assert await client.get_pod("ml", "ghost") is None
            servicer.get_disabled = True
            with pytest.raises(PodResourcesUnavailable) as raised:
                await client.get_pod("ml", "ghost")
            assert raised.value.code == "UNKNOWN" and "disabled" in raised.value.detail
            with pytest.raises(PodResourcesUnavailable) as raised:
                await client.allocatable()
            assert raised.value.code == "UNIMPLEMENTED"
    finally:
        await raw_server.stop(None)


async def test_slow_kubelet_times_out(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    raw_server = await _serve(KubeletLikeServicer(delay=5), path)
    try:
        async with PodResourcesClient(path, timeout=0.2) as client:
            with pytest.raises(PodResourcesUnavailable) as raised:
                await client.list_pods()
        assert raised.value.code == "DEADLINE_EXCEEDED"
    finally:
        await raw_server.stop(None)


async def test_client_recovers_after_server_restart(source: FakeSource, sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    async with PodResourcesClient(path) as client:
        async with PodResourcesServer(source, path):
            assert len(await client.list_pods()) == 3
        with pytest.raises(PodResourcesUnavailable, match="does not exist"):
            await client.list_pods()
        async with PodResourcesServer(source, path):
            # The channel reconnects on its own within its (short) backoff.
            for _ in range(50):
                try:
                    pods = await client.list_pods()
                    break
                except PodResourcesUnavailable:
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("client did not reconnect within 5 s")
    assert len(pods) == 3


# --- server lifecycle -----------------------------------------------------------------------


async def test_server_socket_lifecycle(source: FakeSource, sock_dir: Path) -> None:
    path = sock_dir / "deep" / "er" / "kubelet.sock"
    path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))
    server = PodResourcesServer(source, path)
    await server.start()
    assert server.serving and path.is_socket()
    with pytest.raises(RuntimeError):
        await server.start()
    # A second server must not steal a live socket.
    with pytest.raises(FileExistsError, match="already listening"):
        await PodResourcesServer(source, path).start()
    await server.stop()
    assert not server.serving and not path.exists()
    await server.stop()  # idempotent

    fresh = sock_dir / "new" / "dirs" / "kubelet.sock"
    async with PodResourcesServer(source, fresh):
        assert fresh.is_socket()
    assert not fresh.exists()


async def test_server_refuses_bad_paths(source: FakeSource, sock_dir: Path) -> None:
    not_a_socket = sock_dir / "kubelet.sock"
    not_a_socket.write_text("keep me")
    with pytest.raises(FileExistsError, match="not a unix socket"):
        await PodResourcesServer(source, not_a_socket).start()
    assert not_a_socket.read_text() == "keep me"
    with pytest.raises(ValueError, match="107"):
        await PodResourcesServer(source, sock_dir / ("x" * 120)).start()


# --- many nodes in one process ---------------------------------------------------------------


async def test_group_serves_each_node_its_own_data(sock_dir: Path) -> None:
    nodes = [f"node-{i:03d}" for i in range(50)]
    async with PodResourcesServerGroup() as group:
        for node in nodes:
            await group.add(node, node_source(node), sock_dir / node / "kubelet.sock")
        assert len(group) == 50 and group.nodes == frozenset(nodes)

        async def ask(node: str) -> tuple[list[PodResources], list[ContainerDevices]]:
            async with PodResourcesClient(group.socket_path(node)) as client:
                return await client.list_pods(), await client.allocatable()

        answers = await asyncio.gather(*(ask(node) for node in nodes))
        for node, (pods, devices) in zip(nodes, answers, strict=True):
            assert [p.name for p in pods] == [f"{node}-job"]
            assert pods[0].containers[0].devices[0].device_ids == (f"{node}-gpu0",)
            assert devices == [ContainerDevices(GPU, (f"{node}-gpu0", f"{node}-gpu1"), (0,))]

        with pytest.raises(ValueError, match="already has"):
            await group.add("node-000", node_source("x"), sock_dir / "other.sock")
        with pytest.raises(ValueError, match="already used"):
            await group.add("node-new", node_source("x"), sock_dir / "node-001" / "kubelet.sock")

        gone = group.socket_path("node-007")
        await group.remove("node-007")
        assert "node-007" not in group and not gone.exists()
        with pytest.raises(KeyError):
            await group.remove("node-007")
        async with PodResourcesClient(group.socket_path("node-008")) as client:
            assert [p.name for p in await client.list_pods()] == ["node-008-job"]
        sockets = [group.socket_path(n) for n in group.nodes]

    assert len(group) == 0
    assert not any(p.exists() for p in sockets)
