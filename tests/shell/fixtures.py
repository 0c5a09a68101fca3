"""Fixtures for the shell's unit tests: virtual time, the in-memory API server, a real client.

A conftest imports these names; every async test there runs in its own
``VirtualTimeLoop`` (mark the module ``pytest.mark.asyncio(loop_scope="function")``),
starting at 0 on the virtual clock, and fails if it leaves tasks running.
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest
import pytest_asyncio

from devheal.kube.client import KubeClient
from tests.shell.memapi import MemApi
from tests.shell.virtual_time import VirtualTimeLoop

EPOCH = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
"""Wall-clock time at virtual time 0."""


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    marker = item.get_closest_marker("asyncio")
    if marker is None or marker.kwargs.get("loop_scope") != "function":
        # A wider loop scope would make the session's shared loop a virtual-time one.
        raise pytest.UsageError(f"{item.nodeid}: mark it pytest.mark.asyncio(loop_scope='function') for virtual time")
    return {"virtual_time": VirtualTimeLoop}


def wall_clock() -> datetime.datetime:
    """The virtual loop's time as a UTC datetime (EPOCH at 0)."""
    return EPOCH + datetime.timedelta(seconds=asyncio.get_running_loop().time())


def unix_clock() -> float:
    """The virtual loop's time as Unix seconds."""
    return EPOCH.timestamp() + asyncio.get_running_loop().time()


@pytest_asyncio.fixture(loop_scope="function", autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running (after every other fixture is torn down)."""
    yield
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    if left:
        # Tasks being cancelled (closing connections, the server's handlers) get a virtual second to end.
        _, pending = await asyncio.wait(left, timeout=1.0)
        for task in pending:
            task.cancel()
        assert not pending, f"tasks left running: {pending}"


@pytest_asyncio.fixture(loop_scope="function")
async def api() -> AsyncIterator[MemApi]:
    async with MemApi(now=wall_clock) as server:
        yield server


async def connect(api: MemApi, directory: Path, user: str = "", *, token_file: Path | None = None) -> KubeClient:
    """A real client of ``api`` (close it when done); with ``user``, its requests carry that user.

    With ``token_file``, the client reads its token from that file (a kubeconfig's ``tokenFile``).
    """
    with pytest.MonkeyPatch.context() as env:
        # The client builds a TLS context even for plain http; with no CA store to read it takes 1 ms, not 100.
        env.setenv("SSL_CERT_FILE", os.devnull)
        env.setenv("SSL_CERT_DIR", str(directory / "no-certificates"))
        path = api.kubeconfig(directory / (f"kubeconfig-{user}" if user else "kubeconfig"), user, token_file=token_file)
        return await KubeClient.connect(str(path))


@pytest_asyncio.fixture(loop_scope="function")
async def kube(api: MemApi, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await connect(api, tmp_path)
    try:
        yield client
    finally:
        await client.close()
