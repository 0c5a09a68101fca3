"""KubeClient against the in-memory API server: failures become our errors, retries back off exactly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path, env_proxy, retrying
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ns")


async def test_a_server_that_is_gone_is_unavailable(api: MemApi, kube: KubeClient) -> None:
    await api.close()
    with pytest.raises(errors.Unavailable, match="GET /api/v1/nodes"):
        await kube.get(api_path("v1", "nodes"))


async def test_an_answer_that_is_not_an_object_is_permanent(api: MemApi, kube: KubeClient) -> None:
    api.fail_next(404, verb="get")  # a Status body: decoded and mapped
    with pytest.raises(errors.NotFound, match="injected 404"):
        await kube.get(f"{PODS}/p")
    with pytest.raises(errors.NotFound, match="HTTP 404"):  # a path the server does not serve
        await kube.get("/metrics")


async def test_a_missing_kubeconfig_is_a_permanent_error(tmp_path: Path) -> None:
    with pytest.raises(errors.PermanentError, match="cannot load Kubernetes configuration"):
        await KubeClient.connect(str(tmp_path / "missing"))


async def test_a_watch_error_event_maps_its_code(api: MemApi, kube: KubeClient) -> None:
    api.gone_next_watch()
    with pytest.raises(errors.Gone, match="too old resource version"):
        async for _ in kube.watch(PODS, "5"):
            pass


async def test_retrying_backs_off_exponentially_on_temporary_errors(api: MemApi, kube: KubeClient) -> None:
    await kube.create(PODS, {"metadata": {"name": "p"}})
    api.fail_next(500, verb="get", times=3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    pod = await retrying(lambda: kube.get(f"{PODS}/p"), base_delay=0.1)
    assert pod["metadata"]["name"] == "p"
    # Each wait is max(the error's own delay, the backoff): Unavailable asks for 1 s.
    assert [round(c.at - started, 6) for c in api.calls("get")] == [0.0, 1.0, 2.0, 3.0]


async def test_retrying_uses_the_backoff_when_it_exceeds_the_errors_delay(api: MemApi, kube: KubeClient) -> None:
    await kube.create(PODS, {"metadata": {"name": "p"}})
    api.fail_next(409, verb="get", times=4)  # Conflict asks for 0.05 s
    started = asyncio.get_running_loop().time()
    await retrying(lambda: kube.get(f"{PODS}/p"), base_delay=0.1, max_delay=0.3)
    assert [round(c.at - started, 6) for c in api.calls("get")] == [0.0, 0.1, 0.3, 0.6, 0.9]


async def test_retrying_gives_up_after_its_tries_and_never_retries_permanent_errors(
    api: MemApi, kube: KubeClient
) -> None:
    api.fail_next(429, verb="get", times=3)
    with pytest.raises(errors.TooManyRequests):
        await retrying(lambda: kube.get(f"{PODS}/p"), tries=3)
    assert len(api.calls("get")) == 3
    with pytest.raises(errors.NotFound):
        await retrying(lambda: kube.get(f"{PODS}/p"), tries=3)
    assert len(api.calls("get")) == 4


async def test_a_list_the_watch_cache_is_not_ready_for_is_sent_again_after_the_servers_delay(
    api: MemApi, kube: KubeClient
) -> None:
    for name in "abc":
        api.create(PODS, {"metadata": {"name": name}})
    api.too_large_resource_version(times=2)
    items, version = await kube.list_all(PODS)
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    assert version == "3"
    assert [round(c.at, 6) for c in api.calls("list")] == [0.0, 1.0, 2.0]  # retryAfterSeconds: 1


async def test_a_continuation_the_watch_cache_is_not_ready_for_is_sent_again(api: MemApi, kube: KubeClient) -> None:
    for name in "abc":
        api.create(PODS, {"metadata": {"name": name}})
    # While the first page is served, set up the answer to the next request: the continuation.
    api.meanwhile(api.too_large_resource_version, verb="list")
    items, _ = await kube.list_all(PODS, page_size=2)
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    lists = api.calls("list")
    assert ["continue" in c.params for c in lists] == [False, True, True]
    assert lists[1].params["continue"] == lists[2].params["continue"]


async def test_a_list_the_watch_cache_never_catches_up_with_fails_after_ten_tries(
    api: MemApi, kube: KubeClient
) -> None:
    api.too_large_resource_version(times=100)
    with pytest.raises(errors.ResourceVersionTooLarge, match="Too large resource version"):
        await kube.list_all(PODS)
    assert len(api.calls("list")) == 10


@pytest.mark.parametrize(
    ("server", "env", "expected"),
    [
        ("https://api.cluster.test:6443", {"HTTPS_PROXY": "http://proxy.test:3128"}, "http://proxy.test:3128"),
        ("http://api.cluster.test:8080", {"HTTP_PROXY": "http://proxy.test:3128"}, "http://proxy.test:3128"),
        ("https://api.cluster.test:6443", {"HTTP_PROXY": "http://proxy.test:3128"}, None),
        (
            "https://api.cluster.test:6443",
            {"HTTPS_PROXY": "http://proxy.test:3128", "NO_PROXY": "cluster.test"},
            None,
        ),
        ("https://api.cluster.test:6443", {}, None),
    ],
)
async def test_the_environments_proxy_for_the_server_is_read_once_as_kubectl_reads_it(
    monkeypatch: pytest.MonkeyPatch, server: str, env: dict[str, str], expected: str | None
) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proxy, _ = env_proxy(server)
    assert proxy == expected
