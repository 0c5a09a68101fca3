"""Serve the kubelet pod-resources v1 API on a unix socket, from an in-memory source.

The lab runs hundreds of simulated kubelets; each needs a socket that a real
pod-resources client (the devheal node agent, dcgm-exporter, ...) can talk to
exactly as it would to ``/var/lib/kubelet/pod-resources/kubelet.sock``.

Why one ``grpc.aio.Server`` per socket, even in ``PodResourcesServerGroup``: a
single server listening on many unix sockets cannot tell them apart (on every
socket ``context.peer()`` is just ``"unix:"``, and the auth context and request
metadata are identical), so it could not answer with the right node's data. And
it is cheap: measured with grpcio 1.85 on Linux, 1,000 servers with one socket
each take about 20 MiB more RSS than one server with 1,000 ports (62 vs 42 MiB,
~20 KiB per server), share the same 8 gRPC core threads, use one file descriptor
per socket either way, start in about half a second and idle at ~0% CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from pathlib import Path
from types import TracebackType
from typing import NoReturn

import grpc

from . import _convert, api_pb2, api_pb2_grpc
from .types import PodResourcesSource

__all__ = ["PodResourcesServer", "PodResourcesServerGroup"]

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 107


def _check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"unix socket path is {len(os.fsencode(path))} bytes, longer than the "
            f"{_MAX_SOCKET_PATH_BYTES} the kernel allows: {path}"
        )


def _is_listening(path: Path) -> bool:
    """True when some process accepts connections on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
    return True


def _remove_stale_socket(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        # Never delete something that is not a socket: the path is probably wrong.
        raise FileExistsError(f"{path} exists and is not a unix socket")
    if _is_listening(path):
        raise FileExistsError(f"another server is already listening on {path}")
    path.unlink(missing_ok=True)


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    # abort() always raises; this only tells the type checker so.
    raise AssertionError("grpc.aio.ServicerContext.abort() returned")


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    """Answers the three RPCs from a ``PodResourcesSource``.

    A failing source becomes INTERNAL with the exception text, rather than gRPC's
    opaque UNKNOWN, so a broken simulation is easy to diagnose from the client side.
    """

    def __init__(self, source: PodResourcesSource) -> None:
        self._source = source

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        try:
            pods = self._source.list_pods()
        except Exception as exc:
            await _abort(context, grpc.StatusCode.INTERNAL, f"listing pods failed: {exc!r}")
        return _convert.list_response(pods)

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        try:
            devices = self._source.allocatable()
        except Exception as exc:
            await _abort(context, grpc.StatusCode.INTERNAL, f"listing allocatable devices failed: {exc!r}")
        return _convert.allocatable_response(devices)

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        namespace, name = request.pod_namespace, request.pod_name
        if not name:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "pod_name must not be empty")
        try:
            pod = self._source.get_pod(namespace, name)
        except Exception as exc:
            await _abort(context, grpc.StatusCode.INTERNAL, f"looking up pod {namespace}/{name} failed: {exc!r}")
        if pod is None:
            # The kubelet's own wording (it sends it as UNKNOWN; NOT_FOUND is the
            # accurate code), so clients can recognise the answer from either server.
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"pod {name} in namespace {namespace} not found")
        return api_pb2.GetPodResourcesResponse(pod_resources=_convert.pod_to_pb(pod))


class PodResourcesServer:
    """The pod-resources API of one (simulated) kubelet, on one unix socket."""

    def __init__(self, source: PodResourcesSource, socket_path: Path) -> None:
        self._source = source
        self._socket_path = Path(socket_path).absolute()
        self._server: grpc.aio.Server | None = None
        # Identity of the socket file we bound, so stop() never unlinks a socket
        # that someone else created at the same path after us.
        self._socket_id: tuple[int, int] | None = None

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    @property
    def source(self) -> PodResourcesSource:
        return self._source

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Bind the socket and start answering; raises if the socket cannot be taken."""
        if self._server is not None:
            raise RuntimeError(f"pod-resources server on {self._socket_path} is already started")
        path = self._socket_path
        _check_socket_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_socket(path)

        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self._source), server)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise OSError(f"cannot listen on unix socket {path}: {exc}") from exc
        await server.start()
        self._server = server
        st = path.stat()
        self._socket_id = (st.st_dev, st.st_ino)

    async def stop(self, grace: float = 0.5) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds) and remove the socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            await server.stop(grace)
        finally:
            self._remove_own_socket()

    def _remove_own_socket(self) -> None:
        socket_id, self._socket_id = self._socket_id, None
        with contextlib.suppress(FileNotFoundError):
            st = self._socket_path.lstat()
            if (st.st_dev, st.st_ino) == socket_id:
                self._socket_path.unlink()

    async def __aenter__(self) -> PodResourcesServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class PodResourcesServerGroup:
    """Many simulated kubelets' pod-resources sockets in one process, one per node.

    Each node gets its own ``PodResourcesServer`` (see the module docstring for why
    that is both necessary and cheap). Adding and removing nodes is serialised, so
    concurrent callers cannot race for a node name or a socket path.
    """

    def __init__(self) -> None:
        self._servers: dict[str, PodResourcesServer] = {}
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._servers)

    def __contains__(self, node_name: object) -> bool:
        return node_name in self._servers

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._servers)

    def socket_path(self, node_name: str) -> Path:
        """The socket a node's pod-resources API listens on; KeyError for unknown nodes."""
        return self._servers[node_name].socket_path

    async def add(self, node_name: str, source: PodResourcesSource, socket_path: Path) -> None:
        """Start serving ``source`` for ``node_name`` on ``socket_path``."""
        async with self._lock:
            if node_name in self._servers:
                raise ValueError(f"node {node_name!r} already has a pod-resources server")
            server = PodResourcesServer(source, socket_path)
            for other, existing in self._servers.items():
                if existing.socket_path == server.socket_path:
                    raise ValueError(f"socket {server.socket_path} is already used by node {other!r}")
            await server.start()
            self._servers[node_name] = server

    async def remove(self, node_name: str, grace: float = 0.5) -> None:
        """Stop serving ``node_name`` and remove its socket; KeyError for unknown nodes."""
        async with self._lock:
            server = self._servers.pop(node_name)
            await server.stop(grace)

    async def stop(self, grace: float = 0.5) -> None:
        """Stop every node's server (concurrently) and remove all their sockets."""
        async with self._lock:
            servers = list(self._servers.values())
            self._servers.clear()
            results = await asyncio.gather(*(s.stop(grace) for s in servers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def __aenter__(self) -> PodResourcesServerGroup:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
