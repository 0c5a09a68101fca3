"""A bearer token that lives in a file follows the file: rotated tokens reach the next requests."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from devheal.kube import errors, tokens
from devheal.kube.client import KubeClient, api_path
from tests.shell.fixtures import connect
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

NODES = api_path("v1", "nodes")
PODS = api_path("v1", "pods", namespace="ns")


def rotate(path: Path, token: str) -> None:
    """Write a new token the way the kubelet does: a new file swapped in at once."""
    fresh = path.with_suffix(".new")
    fresh.write_text(token + "\n")
    fresh.replace(path)


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    rotate(path, "first")
    return path


@pytest_asyncio.fixture(loop_scope="function")
async def client(api: MemApi, tmp_path: Path, token: Path) -> AsyncIterator[KubeClient]:
    kube = await connect(api, tmp_path, token_file=token)
    try:
        yield kube
    finally:
        await kube.close()


async def test_a_rewritten_token_file_is_sent_once_the_file_is_checked_again(
    api: MemApi, client: KubeClient, token: Path
) -> None:
    await client.get(NODES)
    rotate(token, "second")
    await client.get(NODES)  # within the check interval: the file is not looked at
    await asyncio.sleep(tokens.CHECK_EVERY)
    await client.get(NODES)
    await client.get(NODES)
    assert [c.user for c in api.calls()] == ["first", "first", "second", "second"]
    assert client.token_file is not None and client.token_file.reads == 2


async def test_a_watch_carries_the_current_token(api: MemApi, client: KubeClient, token: Path) -> None:
    rotate(token, "second")
    await asyncio.sleep(tokens.CHECK_EVERY)
    api.create(PODS, {"metadata": {"name": "p"}})
    async for event in client.watch(PODS, "0"):
        assert event["object"]["metadata"]["name"] == "p"
        break
    assert [c.user for c in api.calls("watch")] == ["second"]


async def test_a_refused_token_is_read_again_and_the_request_sent_once_more(
    api: MemApi, client: KubeClient, token: Path
) -> None:
    await client.get(NODES)
    api.fail_next(401, user="first", times=100, reason="Unauthorized")
    rotate(token, "second")
    made = await client.create(PODS, {"metadata": {"name": "p"}})  # at once: no wait for the next check
    assert made["metadata"]["name"] == "p"
    assert [(c.verb, c.user) for c in api.calls()] == [("list", "first"), ("create", "first"), ("create", "second")]
    api.create(PODS, {"metadata": {"name": "q"}})
    api.fail_next(401, verb="watch", user="second", reason="Unauthorized")
    rotate(token, "third")
    async for _ in client.watch(PODS, "0"):
        break
    assert [c.user for c in api.calls("watch")] == ["second", "third"]


async def test_a_refused_token_that_did_not_change_is_not_sent_again(
    api: MemApi, client: KubeClient, token: Path
) -> None:
    api.fail_next(401, user="first", times=100, reason="Unauthorized")
    with pytest.raises(errors.Forbidden, match="401"):
        await client.get(NODES)
    assert len(api.calls()) == 1


async def test_a_token_file_being_swapped_keeps_the_previous_token(
    api: MemApi, client: KubeClient, token: Path
) -> None:
    token.unlink()
    await asyncio.sleep(tokens.CHECK_EVERY)
    await client.get(NODES)
    rotate(token, "second")
    await asyncio.sleep(tokens.CHECK_EVERY)
    await client.get(NODES)
    assert [c.user for c in api.calls()] == ["first", "second"]


async def test_in_cluster_the_service_account_token_file_is_followed(
    tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not used before the first request\n")
    monkeypatch.setattr(tokens, "IN_CLUSTER_TOKEN", token)
    monkeypatch.setattr(tokens, "IN_CLUSTER_CA", ca)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("SSL_CERT_FILE", os.devnull)
    monkeypatch.setattr("ssl.SSLContext.load_verify_locations", lambda *args, **kwargs: None)
    client = await KubeClient.connect(None)
    try:
        assert client.token_file is not None and client.token_file.path == token
        assert client.token_file.authorization() == "Bearer first"
        rotate(token, "second")
        await asyncio.sleep(tokens.CHECK_EVERY)
        assert client.token_file.authorization() == "Bearer second"
    finally:
        await client.close()
