"""The in-memory API server keeps the API server's rules, seen through the real KubeClient."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from devheal.kube import errors
from devheal.kube.client import JSON_PATCH, STRATEGIC_PATCH, WATCH_IDLE_TIMEOUT, KubeClient, api_path
from tests.shell.fixtures import connect
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ns")
NODES = api_path("v1", "nodes")
THINGS = api_path("example.com/v1", "things")


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"},
    }


async def collect(kube: KubeClient, path: str, since: str, count: int, **params: Any) -> list[tuple[str, str]]:
    """The first ``count`` watch events as (type, name)."""
    seen: list[tuple[str, str]] = []
    async for event in kube.watch(path, since, **params):
        seen.append((event["type"], event["object"]["metadata"].get("name", "")))
        if len(seen) == count:
            break
    return seen


async def test_virtual_time_is_exact_and_instant() -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    await asyncio.sleep(3600)
    assert loop.time() == 3600
    assert time.monotonic() - started < 1.0


async def test_create_sets_server_fields_and_a_second_create_conflicts(kube: KubeClient) -> None:
    await asyncio.sleep(5)
    made = await kube.create(PODS, pod("a"))
    meta = made["metadata"]
    assert meta["namespace"] == "ns"
    assert meta["uid"]
    assert meta["generation"] == 1
    assert meta["creationTimestamp"] == "2030-01-01T00:00:05Z"
    assert made["status"] == {"phase": "Running"}
    with pytest.raises(errors.AlreadyExists):
        await kube.create(PODS, pod("a"))
    assert await kube.get(f"{PODS}/a") == made


async def test_resource_versions_come_from_one_counter_across_resources(kube: KubeClient) -> None:
    first = await kube.create(PODS, pod("a"))
    node = await kube.create(NODES, {"metadata": {"name": "n1"}})
    thing = await kube.create(THINGS, {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}})
    versions = [int(o["metadata"]["resourceVersion"]) for o in (first, node, thing)]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert "namespace" not in node["metadata"]


async def test_get_of_a_missing_object_is_not_found(kube: KubeClient) -> None:
    with pytest.raises(errors.NotFound):
        await kube.get(f"{PODS}/nope")


async def test_list_pages_through_one_snapshot(api: MemApi, kube: KubeClient) -> None:
    for i in range(7):
        await kube.create(PODS, pod(f"p{i}"))
    listed_at = api.store.rv
    first = await kube.request("GET", PODS, params={"limit": 3})
    assert [p["metadata"]["name"] for p in first["items"]] == ["p0", "p1", "p2"]
    assert first["metadata"]["resourceVersion"] == str(listed_at)
    assert first["metadata"]["remainingItemCount"] == 4
    # Changes after the first page do not show in the later pages of the same list.
    await kube.delete(f"{PODS}/p5")
    await kube.create(PODS, pod("p3a"))
    token = first["metadata"]["continue"]
    second = await kube.request("GET", PODS, params={"limit": 3, "continue": token})
    assert [p["metadata"]["name"] for p in second["items"]] == ["p3", "p4", "p5"]
    third = await kube.request("GET", PODS, params={"limit": 3, "continue": second["metadata"]["continue"]})
    assert [p["metadata"]["name"] for p in third["items"]] == ["p6"]
    assert "continue" not in third["metadata"]
    assert third["metadata"]["resourceVersion"] == str(listed_at)


async def test_a_selective_list_pages_through_one_snapshot_without_counting(api: MemApi, kube: KubeClient) -> None:
    for i in range(8):
        await kube.create(PODS, pod(f"p{i}", app="x" if i % 2 else "y"))
    first = await kube.request("GET", PODS, params={"limit": 2, "labelSelector": "app=x"})
    assert [p["metadata"]["name"] for p in first["items"]] == ["p1", "p3"]
    # As the API server does: with a selector, how many items remain is not said.
    assert "remainingItemCount" not in first["metadata"]
    # The last object served and one still to come change meanwhile; the list goes on from where it was.
    await kube.delete(f"{PODS}/p3")
    await kube.patch(f"{PODS}/p5", {"metadata": {"labels": {"app": "y"}}})
    await kube.create(PODS, pod("p4a", app="x"))
    token = first["metadata"]["continue"]
    second = await kube.request("GET", PODS, params={"limit": 2, "labelSelector": "app=x", "continue": token})
    assert [p["metadata"]["name"] for p in second["items"]] == ["p5", "p7"]
    assert second["items"][0]["metadata"]["labels"] == {"app": "x"}, "as it was when the list began"
    assert "continue" not in second["metadata"]


async def test_a_list_across_namespaces_pages_in_namespace_then_name_order(kube: KubeClient) -> None:
    for namespace in ("b", "a"):
        for name in ("z", "y"):
            await kube.create(api_path("v1", "pods", namespace=namespace), pod(name))
    items, _ = await kube.list_all(api_path("v1", "pods"), page_size=1)
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in items] == [
        ("a", "y"),
        ("a", "z"),
        ("b", "y"),
        ("b", "z"),
    ]


async def test_list_all_follows_continue_tokens(api: MemApi, kube: KubeClient) -> None:
    for i in range(5):
        await kube.create(PODS, pod(f"p{i}"))
    items, version = await kube.list_all(PODS, page_size=2)
    assert [p["metadata"]["name"] for p in items] == [f"p{i}" for i in range(5)]
    assert version == str(api.store.rv)
    assert [c.params.get("continue", "") != "" for c in api.calls("list")] == [False, True, True]


async def test_a_continue_token_older_than_the_history_is_gone(api: MemApi, kube: KubeClient) -> None:
    for i in range(3):
        await kube.create(PODS, pod(f"p{i}"))
    first = await kube.request("GET", PODS, params={"limit": 1})
    await kube.create(PODS, pod("later"))
    api.compact()
    with pytest.raises(errors.Gone):
        await kube.request("GET", PODS, params={"limit": 1, "continue": first["metadata"]["continue"]})


async def test_list_filters_by_namespace_and_selectors(kube: KubeClient) -> None:
    await kube.create(PODS, pod("a", app="x"))
    await kube.create(PODS, pod("b", app="y"))
    await kube.create(api_path("v1", "pods", namespace="other"), pod("c", app="x"))
    every, _ = await kube.list_all(api_path("v1", "pods"))
    assert sorted(p["metadata"]["name"] for p in every) == ["a", "b", "c"]
    assert all("kind" not in p for p in every)  # built-in kinds list their items bare
    selected, _ = await kube.list_all(api_path("v1", "pods"), {"labelSelector": "app in (x),app!=z"})
    assert sorted(p["metadata"]["name"] for p in selected) == ["a", "c"]
    fields, _ = await kube.list_all(PODS, {"fieldSelector": "metadata.name=b,spec.nodeName=n1"})
    assert [p["metadata"]["name"] for p in fields] == ["b"]


async def test_replace_is_optimistic(kube: KubeClient) -> None:
    made = await kube.create(PODS, pod("a"))
    made["spec"]["nodeName"] = "n2"
    updated = await kube.replace(f"{PODS}/a", made)
    assert updated["metadata"]["generation"] == 2
    made["spec"]["nodeName"] = "n3"  # still the old resourceVersion
    with pytest.raises(errors.Conflict):
        await kube.replace(f"{PODS}/a", made)
    updated["metadata"]["labels"] = {"k": "v"}
    relabelled = await kube.replace(f"{PODS}/a", updated)
    assert relabelled["metadata"]["generation"] == 2  # metadata changes leave the generation alone


async def test_status_is_written_only_through_its_subresource(kube: KubeClient) -> None:
    made = await kube.create(PODS, pod("a"))
    made["status"] = {"phase": "Failed"}
    made["spec"]["nodeName"] = "n2"
    kept = await kube.replace(f"{PODS}/a", made)
    assert kept["status"] == {"phase": "Running"}
    assert kept["spec"]["nodeName"] == "n2"
    kept["status"] = {"phase": "Failed"}
    kept["spec"]["nodeName"] = "n9"
    status = await kube.replace(f"{PODS}/a/status", kept)
    assert status["status"] == {"phase": "Failed"}
    assert status["spec"]["nodeName"] == "n2"
    assert status["metadata"]["generation"] == kept["metadata"]["generation"]


async def test_merge_patch_merges_and_null_removes(kube: KubeClient) -> None:
    await kube.create(PODS, pod("a", app="x", tier="web"))
    patched = await kube.patch(f"{PODS}/a", {"metadata": {"labels": {"tier": None, "new": "1"}}})
    assert patched["metadata"]["labels"] == {"app": "x", "new": "1"}


async def test_a_patch_naming_a_uid_or_version_makes_it_a_precondition(kube: KubeClient) -> None:
    made = await kube.create(PODS, pod("a"))
    with pytest.raises(errors.Conflict):
        await kube.patch(f"{PODS}/a", {"metadata": {"uid": "someone-else", "labels": {"x": "1"}}})
    with pytest.raises(errors.Conflict):
        await kube.patch(f"{PODS}/a", {"metadata": {"resourceVersion": "1000", "labels": {"x": "1"}}})
    ok = await kube.patch(f"{PODS}/a", {"metadata": {"uid": made["metadata"]["uid"], "labels": {"x": "1"}}})
    assert ok["metadata"]["labels"]["x"] == "1"


async def test_json_patch_and_its_test_operation(kube: KubeClient) -> None:
    await kube.create(PODS, pod("a"))
    ops = [{"op": "add", "path": "/metadata/labels/k", "value": "v"}, {"op": "remove", "path": "/spec/nodeName"}]
    patched = await kube.patch(f"{PODS}/a", ops, content_type=JSON_PATCH)
    assert patched["metadata"]["labels"] == {"k": "v"}
    assert "nodeName" not in patched["spec"]
    with pytest.raises(errors.Invalid):
        await kube.patch(
            f"{PODS}/a", [{"op": "test", "path": "/metadata/labels/k", "value": "w"}], content_type=JSON_PATCH
        )


async def test_strategic_patch_merges_conditions_and_deletes_gates(kube: KubeClient) -> None:
    body = pod("a")
    body["spec"]["schedulingGates"] = [{"name": "devheal.io/placement"}, {"name": "other"}]
    body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    await kube.create(PODS, body)
    await kube.patch(
        f"{PODS}/a/status",
        {"status": {"conditions": [{"type": "DeviceFailed", "status": "True"}]}},
        content_type=STRATEGIC_PATCH,
    )
    patched = await kube.patch(
        f"{PODS}/a",
        {"spec": {"schedulingGates": [{"name": "devheal.io/placement", "$patch": "delete"}]}},
        content_type=STRATEGIC_PATCH,
    )
    assert [c["type"] for c in patched["status"]["conditions"]] == ["Ready", "DeviceFailed"]
    assert patched["spec"]["schedulingGates"] == [{"name": "other"}]


async def test_delete_with_a_stale_uid_conflicts_and_finalizers_defer_it(api: MemApi, kube: KubeClient) -> None:
    await kube.create(PODS, pod("a"))
    with pytest.raises(errors.Conflict):
        await kube.delete(f"{PODS}/a", {"preconditions": {"uid": "other"}})
    await kube.delete(f"{PODS}/a")
    with pytest.raises(errors.NotFound):
        await kube.delete(f"{PODS}/a")
    held = pod("b")
    held["metadata"]["finalizers"] = ["example.com/keep"]
    await kube.create(PODS, held)
    marked = await kube.delete(f"{PODS}/b")
    assert marked["metadata"]["deletionTimestamp"]
    await kube.patch(f"{PODS}/b", {"metadata": {"finalizers": None}})
    with pytest.raises(errors.NotFound):
        await kube.get(f"{PODS}/b")
    assert [e.type for e in api.store.log if e.key[3] == "b"] == ["ADDED", "MODIFIED", "DELETED"]


async def test_eviction_deletes_the_pod_unless_refused(api: MemApi, kube: KubeClient) -> None:
    made = await kube.create(PODS, pod("a"))
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": "ns"}}
    api.fail_next(429, verb="create", path=f"{PODS}/a/eviction", message="would violate the disruption budget")
    with pytest.raises(errors.TooManyRequests, match="disruption budget"):
        await kube.create(f"{PODS}/a/eviction", eviction)
    with pytest.raises(errors.Conflict):
        await kube.create(f"{PODS}/a/eviction", {**eviction, "deleteOptions": {"preconditions": {"uid": "x"}}})
    ok = {**eviction, "deleteOptions": {"preconditions": {"uid": made["metadata"]["uid"]}}}
    assert (await kube.create(f"{PODS}/a/eviction", ok))["status"] == "Success"
    with pytest.raises(errors.NotFound):
        await kube.create(f"{PODS}/a/eviction", eviction)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, errors.NotFound),
        (409, errors.Conflict),
        (410, errors.Gone),
        (422, errors.Invalid),
        (429, errors.TooManyRequests),
        (500, errors.Unavailable),
        (504, errors.Unavailable),
    ],
)
async def test_injected_faults_answer_once(
    api: MemApi, kube: KubeClient, status: int, error: type[errors.KubeError]
) -> None:
    await kube.create(PODS, pod("a"))
    api.fail_next(status, verb="get")
    with pytest.raises(error) as raised:
        await kube.get(f"{PODS}/a")
    assert raised.value.status == status
    assert (await kube.get(f"{PODS}/a"))["metadata"]["name"] == "a"


async def test_faults_can_hit_one_client_only(api: MemApi, kube: KubeClient, tmp_path: Path) -> None:
    await kube.create(PODS, pod("a"))
    other = await connect(api, tmp_path, "b")
    try:
        api.fail_next(503, user="b", times=2)
        assert (await kube.get(f"{PODS}/a"))["metadata"]["name"] == "a"  # another client's request
        with pytest.raises(errors.Unavailable):
            await other.get(f"{PODS}/a")
        assert [c.user for c in api.calls("get")] == ["", "b"]
        assert [c.verb for c in api.calls(user="b")] == ["get"]
    finally:
        await other.close()


async def test_watch_streams_changes_after_a_version(kube: KubeClient) -> None:
    await kube.create(PODS, pod("before"))
    _, version = await kube.list_all(PODS)
    watcher = asyncio.create_task(collect(kube, PODS, version, 3))
    made = await kube.create(PODS, pod("a"))
    await kube.patch(f"{PODS}/a", {"metadata": {"labels": {"k": "v"}}})
    await kube.delete(f"{PODS}/a", {"preconditions": {"uid": made["metadata"]["uid"]}})
    assert await watcher == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


async def test_watch_from_zero_starts_with_the_current_objects(kube: KubeClient) -> None:
    await kube.create(PODS, pod("a"))
    await kube.create(PODS, pod("b"))
    assert await collect(kube, PODS, "0", 2) == [("ADDED", "a"), ("ADDED", "b")]


async def test_a_selector_watch_sees_objects_move_in_and_out(kube: KubeClient) -> None:
    watcher = asyncio.create_task(collect(kube, PODS, "1", 2, labelSelector="app=x"))
    await kube.create(PODS, pod("a", app="y"))
    await kube.patch(f"{PODS}/a", {"metadata": {"labels": {"app": "x"}}})
    await kube.patch(f"{PODS}/a", {"metadata": {"labels": {"app": "z"}}})
    assert await watcher == [("ADDED", "a"), ("DELETED", "a")]


async def test_a_watch_older_than_the_history_is_gone(api: MemApi, kube: KubeClient) -> None:
    await kube.create(PODS, pod("a"))
    _, version = await kube.list_all(PODS)
    await kube.create(PODS, pod("b"))
    api.compact()
    with pytest.raises(errors.Gone):
        await collect(kube, PODS, version, 1)
    api.gone_next_watch()
    with pytest.raises(errors.Gone):
        await collect(kube, PODS, str(api.store.rv), 1)


async def test_the_history_keeps_a_window_of_events(api: MemApi, kube: KubeClient) -> None:
    api.store.window = 2
    first = await kube.create(PODS, pod("a"))
    await kube.create(PODS, pod("b"))
    assert await collect(kube, PODS, first["metadata"]["resourceVersion"], 1) == [("ADDED", "b")]
    await kube.create(PODS, pod("c"))
    await kube.create(PODS, pod("d"))
    with pytest.raises(errors.Gone):
        await collect(kube, PODS, first["metadata"]["resourceVersion"], 1)


async def test_each_resource_keeps_its_own_history(api: MemApi, kube: KubeClient) -> None:
    """As the API server's watch cache: a busy resource's writes expire only its own watches' versions."""
    api.store.window = 2
    await kube.create(NODES, {"metadata": {"name": "n1"}})
    _, quiet = await kube.list_all(NODES)
    busy = await kube.create(PODS, pod("a"))
    for name in "bcd":
        await kube.create(PODS, pod(name))
    with pytest.raises(errors.Gone):  # the pods' own history no longer reaches back
        await collect(kube, PODS, busy["metadata"]["resourceVersion"], 1)
    await kube.create(NODES, {"metadata": {"name": "n2"}})
    assert await collect(kube, NODES, quiet, 1) == [("ADDED", "n2")]
    api.compact()
    with pytest.raises(errors.Gone):  # a compaction reaches every resource
        await collect(kube, NODES, quiet, 1)


async def test_a_failed_watch_request_maps_its_status(api: MemApi, kube: KubeClient) -> None:
    api.fail_next(500, verb="watch")
    with pytest.raises(errors.Unavailable):
        await collect(kube, PODS, "0", 1)


async def test_bookmarks_carry_the_latest_version(api: MemApi, kube: KubeClient) -> None:
    await kube.create(NODES, {"metadata": {"name": "n1"}})
    events: list[dict[str, Any]] = []

    async def watch() -> None:
        async for event in kube.watch(PODS, str(api.store.rv)):
            events.append(event)
            return

    task = asyncio.create_task(watch())
    await until(lambda: api.watching(PODS) == 1, "the watch to open")
    api.bookmark()
    await task
    assert events == [
        {
            "type": "BOOKMARK",
            "object": {"kind": "Bookmark", "apiVersion": "v1", "metadata": {"resourceVersion": str(api.store.rv)}},
        }
    ]


async def test_a_closed_watch_ends_and_a_stalled_one_times_out(api: MemApi, kube: KubeClient) -> None:
    assert await asyncio.wait_for(closing(api, kube), timeout=5) == []
    api.stall_watches(PODS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(collect(kube, PODS, "0", 1, timeout_seconds=10))
    await kube.create(PODS, pod("a"))  # held back by the stall, like the server's own end of the watch
    with pytest.raises(errors.WatchStalled):
        await task  # nothing for the client's idle timeout (the server's timeout_seconds never shows)
    assert loop.time() - started == pytest.approx(WATCH_IDLE_TIMEOUT, abs=0.01)
    api.resume_watches()
    assert await collect(kube, PODS, "0", 1) == [("ADDED", "a")]


async def closing(api: MemApi, kube: KubeClient) -> list[tuple[str, str]]:
    task = asyncio.create_task(collect(kube, PODS, "0", 1))
    await until(lambda: api.watching(PODS) == 1, "the watch to open")
    api.close_watches()
    return await task


async def test_a_slow_answer_runs_into_the_clients_timeout(api: MemApi, kube: KubeClient) -> None:
    await kube.create(PODS, pod("a"))
    api.slow_next(60, verb="get")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.Unavailable, match="TimeoutError"):
        await kube.request("GET", f"{PODS}/a", timeout=5)
    assert loop.time() - started == pytest.approx(5)
    api.slow_next(3, verb="get")
    assert (await kube.get(f"{PODS}/a"))["metadata"]["name"] == "a"
    assert loop.time() - started == pytest.approx(8)


async def test_server_side_apply_creates_then_merges(kube: KubeClient) -> None:
    path = api_path("devheal.io/v1alpha1", "nodedevices", name="n1")
    body = {"apiVersion": "devheal.io/v1alpha1", "kind": "NodeDevices", "metadata": {"name": "n1"}, "spec": {"a": 1}}
    created = await kube.apply(path, body)
    assert created["metadata"]["generation"] == 1
    applied = await kube.apply(path, {**body, "spec": {"b": 2}})
    assert applied["spec"] == {"a": 1, "b": 2}  # a merge, not field ownership: close enough for tests
    assert applied["metadata"]["generation"] == 2
