"""The Reflector lists, then watches from the list's version; 410 means list again and diff; failures back off."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devheal.kube import informer
from devheal.kube.client import KubeClient, api_path
from devheal.kube.informer import Reflector, raw
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

PODS = api_path("v1", "pods", namespace="ns")
Obj = dict[str, Any]


class NoJitter:
    """Stands in for ``random`` in the informer: backoffs and watch timeouts without jitter."""

    @staticmethod
    def uniform(low: float, high: float) -> float:
        return 1.0

    @staticmethod
    def randint(low: int, high: int) -> int:
        return low


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer, "random", NoJitter)


def pod(name: str, **labels: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {}}


class Changes:
    """A handler that records (what, key) for every change it is told about."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, key: str, old: Any, new: Any) -> None:
        self.seen.append(("add" if old is None else "delete" if new is None else "update", key))


@contextlib.asynccontextmanager
async def running(reflector: Reflector[Any]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(reflector.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def watching(api: MemApi, reflector: Reflector[Any], watches: int = 1) -> None:
    """Wait until the reflector has made ``watches`` watch requests and one of them is open."""
    await until(lambda: len(api.calls("watch")) >= watches and api.watching(reflector.path) == 1, "the watch")


def times(api: MemApi, verb: str) -> list[float]:
    return [round(c.at, 6) for c in api.calls(verb)]


def gaps(moments: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(moments)]


async def test_lists_then_watches_from_the_lists_version(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, pod("a"))
    api.create(PODS, pod("b"))
    changes = Changes()
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw, [changes])
    async with running(reflector):
        await reflector.synced.wait()
        await watching(api, reflector)
        assert api.calls("watch")[0].params["resourceVersion"] == reflector.resource_version == "2"
        api.create(PODS, pod("c"))
        api.patch(f"{PODS}/a", {"metadata": {"labels": {"k": "v"}}})
        api.delete(f"{PODS}/b")
        await until(lambda: "ns/b" not in reflector.store, "the deletion")
    assert changes.seen == [("add", "ns/a"), ("add", "ns/b"), ("add", "ns/c"), ("update", "ns/a"), ("delete", "ns/b")]
    assert reflector.store["ns/a"]["metadata"]["labels"] == {"k": "v"}
    assert reflector.resource_version == str(api.store.rv)
    assert reflector.relists == 1


async def test_pages_through_a_large_collection(api: MemApi, kube: KubeClient) -> None:
    for i in range(1201):
        api.create(PODS, pod(f"p{i:04d}"))
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await reflector.synced.wait()
    assert len(reflector.store) == 1201
    lists = api.calls("list")
    assert [c.params["limit"] for c in lists] == ["500"] * 3
    assert ["continue" in c.params for c in lists] == [False, True, True]
    assert reflector.resource_version == str(api.store.rv)


async def test_a_selector_reaches_the_list_and_the_watch(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, pod("in", app="x"))
    api.create(PODS, pod("out", app="y"))
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw, params={"labelSelector": "app=x"})
    async with running(reflector):
        await reflector.synced.wait()
        assert set(reflector.store) == {"ns/in"}
        await watching(api, reflector)
        api.patch(f"{PODS}/in", {"metadata": {"labels": {"app": "y"}}})
        await until(lambda: not reflector.store, "the pod to leave the selection")


async def test_after_410_it_lists_again_and_sees_what_it_missed(api: MemApi, kube: KubeClient) -> None:
    for name in "abc":
        api.create(PODS, pod(name))
    changes = Changes()
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw, [changes])
    async with running(reflector):
        await watching(api, reflector)
        # The watch drops and cannot come back at once; meanwhile history moves on and is compacted.
        api.fail_next(500, verb="watch")
        api.close_watches()
        await until(lambda: len(api.calls("watch")) == 2, "the failed watch")
        api.delete(f"{PODS}/a")
        api.create(PODS, pod("d"))
        api.patch(f"{PODS}/c", {"metadata": {"labels": {"k": "v"}}})
        api.compact()
        await watching(api, reflector, watches=4)
    watches = api.calls("watch")
    assert watches[2].params["resourceVersion"] == watches[0].params["resourceVersion"]  # answered 410
    assert len(api.calls("list")) == 2
    assert reflector.relists == 2
    assert set(reflector.store) == {"ns/b", "ns/c", "ns/d"}
    assert reflector.store["ns/c"]["metadata"]["labels"] == {"k": "v"}
    assert ("delete", "ns/a") in changes.seen
    assert ("add", "ns/d") in changes.seen
    assert watches[3].params["resourceVersion"] == str(api.store.rv)


async def test_a_410_lists_again_at_once(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await watching(api, reflector)
        await asyncio.sleep(5)
        api.gone_next_watch()
        api.close_watches()
        await watching(api, reflector, watches=3)
    assert times(api, "list") == [0.0, times(api, "watch")[1]]  # no backoff before the relist
    assert times(api, "watch")[1] == times(api, "watch")[2]
    assert reflector.relists == 2


async def test_server_errors_back_off_exponentially_up_to_four_seconds(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await watching(api, reflector)
        api.fail_next(500, verb="watch", times=7)
        api.close_watches()
        await watching(api, reflector, watches=9)
        # A watch that ran and ended resets the backoff.
        api.fail_next(504, verb="watch")
        api.close_watches()
        await watching(api, reflector, watches=11)
    watches = times(api, "watch")
    assert gaps(watches[1:9]) == [0.2, 0.4, 0.8, 1.6, 3.2, 4.0, 4.0]
    assert gaps(watches[9:]) == [0.2]
    assert len(api.calls("list")) == 1  # a temporary error resumes the watch from its version
    assert {c.params["resourceVersion"] for c in api.calls("watch")} == {reflector.resource_version}


async def test_a_failing_list_backs_off_and_sync_waits_for_it(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, pod("a"))
    api.fail_next(500, verb="list", times=2)
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await reflector.synced.wait()
        assert asyncio.get_running_loop().time() == pytest.approx(0.6)
    assert times(api, "list") == [0.0, 0.2, 0.6]
    assert set(reflector.store) == {"ns/a"}


async def test_a_permanent_watch_error_lists_again_after_a_backoff(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await watching(api, reflector)
        api.fail_next(404, verb="watch")
        api.close_watches()
        await watching(api, reflector, watches=3)
    assert times(api, "list")[1] - times(api, "watch")[1] == pytest.approx(0.2)
    assert reflector.relists == 2


async def test_bookmarks_move_the_version_and_nothing_else(api: MemApi, kube: KubeClient) -> None:
    changes = Changes()
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw, [changes])
    async with running(reflector):
        await watching(api, reflector)
        api.create(api_path("v1", "nodes"), {"metadata": {"name": "n1"}})
        api.bookmark()
        await until(lambda: reflector.resource_version == str(api.store.rv), "the bookmark")
    assert changes.seen == []
    assert reflector.store == {}
    assert api.calls("watch")[0].params["allowWatchBookmarks"] == "true"


async def bookmarks(api: MemApi, every: float) -> None:
    """A bookmark to every watch every ``every`` seconds, as the API server sends them."""
    while True:
        await asyncio.sleep(every)
        api.bookmark()


async def test_a_watch_ending_at_its_timeout_resumes_from_its_version(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    marker = asyncio.create_task(bookmarks(api, 40))
    async with running(reflector):
        await watching(api, reflector)
        api.create(PODS, pod("a"))
        await asyncio.sleep(300)
    marker.cancel()
    first, second = api.calls("watch")
    assert first.params["timeoutSeconds"] == "240"
    assert round(second.at, 6) == 240.0
    assert second.params["resourceVersion"] == str(api.store.rv)
    assert reflector.relists == 1


async def test_a_hung_watch_is_given_up_after_its_idle_timeout(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await watching(api, reflector)
        api.stall_watches(PODS)
        api.create(PODS, pod("a"))
        await until(lambda: len(api.calls("watch")) == 3, "a third watch", timeout=600, step=1.0)
        api.resume_watches()
        await until(lambda: "ns/a" in reflector.store, "the pod created during the stall")
    assert times(api, "watch") == [0.0, 50.0, 100.0]  # nothing for 50 s: watch again at once
    assert {c.params["resourceVersion"] for c in api.calls("watch")} == {"0"}
    assert reflector.relists == 1


async def test_a_stalled_watch_is_caught_up_within_a_minute(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await watching(api, reflector)
        await asyncio.sleep(30)
        api.create(PODS, pod("a"))
        await until(lambda: "ns/a" in reflector.store, "the pod before the stall")
        api.stall_watches(PODS, later=False)  # the connection hangs; a new one would work
        stalled = asyncio.get_running_loop().time()
        api.create(PODS, pod("b"))
        api.delete(f"{PODS}/a")
        await until(lambda: set(reflector.store) == {"ns/b"}, "the changes made during the stall", timeout=60)
        caught_up = asyncio.get_running_loop().time() - stalled
    assert round(caught_up, 6) <= 50  # the idle timeout, counted from the last event received
    _, second = api.calls("watch")
    assert second.params["resourceVersion"] == "1"  # from the version reached, no list
    assert reflector.relists == 1


async def test_a_quiet_watch_that_receives_bookmarks_stays_open(api: MemApi, kube: KubeClient) -> None:
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    marker = asyncio.create_task(bookmarks(api, 45))
    async with running(reflector):
        await watching(api, reflector)
        await asyncio.sleep(230)
    marker.cancel()
    assert len(api.calls("watch")) == 1


async def test_the_cache_catches_up_within_five_seconds_of_the_api_coming_back(api: MemApi, kube: KubeClient) -> None:
    api.create(PODS, pod("a"))
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw)
    async with running(reflector):
        await watching(api, reflector)
        api.fail_next(503, times=1_000_000)  # an outage: every request fails
        api.close_watches()
        api.create(PODS, pod("b"))
        api.delete(f"{PODS}/a")
        await asyncio.sleep(120)
        assert set(reflector.store) == {"ns/a"}
        api.stop_failing()
        back = asyncio.get_running_loop().time()
        await until(lambda: set(reflector.store) == {"ns/b"}, "the changes made during the outage", timeout=5)
        caught_up = asyncio.get_running_loop().time() - back
    assert caught_up <= 4.0
    assert max(gaps(times(api, "watch")[1:])) == 4.0  # the backoff's cap


async def test_a_malformed_object_or_a_failing_handler_does_not_stop_the_watch(api: MemApi, kube: KubeClient) -> None:
    def project(obj: Obj) -> str:
        labels = obj["metadata"].get("labels") or {}
        if labels.get("bad"):
            raise ValueError("malformed")
        return str(labels.get("v", ""))

    def broken(key: str, old: Any, new: Any) -> None:
        raise RuntimeError("handler bug")

    changes = Changes()
    reflector: Reflector[str] = Reflector(kube, PODS, project, [broken, changes])
    async with running(reflector):
        await watching(api, reflector)
        api.create(PODS, pod("a", v="1"))
        api.patch(f"{PODS}/a", {"metadata": {"labels": {"bad": "yes"}}})
        await until(lambda: "ns/a" in reflector.invalid, "the unreadable version")
        # Never decided on from its older copy: an unreadable version leaves the store, and is listed as such.
        assert "ns/a" not in reflector.store
        assert "unexpected ValueError: malformed" in reflector.invalid["ns/a"].message
        api.patch(f"{PODS}/a", {"metadata": {"labels": {"bad": None, "v": "2"}}})
        await until(lambda: reflector.store.get("ns/a") == "2", "the good copy")
    assert changes.seen == [("add", "ns/a"), ("delete", "ns/a"), ("add", "ns/a")]
    assert reflector.invalid == {}
    assert reflector.resource_version == str(api.store.rv)


async def test_an_unreadable_object_is_reported_once_per_version_and_may_keep_a_fallback(
    api: MemApi, kube: KubeClient
) -> None:
    def project(obj: Obj) -> str:
        labels = obj["metadata"].get("labels") or {}
        if labels.get("bad"):
            raise ValueError(f"bad is {labels['bad']}")
        return "read"

    reported: list[tuple[str, str]] = []
    reflector: Reflector[str] = Reflector(
        kube,
        PODS,
        project,
        kind="Pod",
        expected=(ValueError,),
        fallback=lambda obj: "identity only",
        on_invalid=[lambda item: reported.append((item.key, item.message))],
    )
    async with running(reflector):
        await watching(api, reflector)
        api.create(PODS, pod("a"))
        api.patch(f"{PODS}/a", {"metadata": {"labels": {"bad": "1"}}})
        await until(lambda: reflector.store.get("ns/a") == "identity only", "the fallback")
        version = reflector.invalid["ns/a"].version
        api.patch(f"{PODS}/a", {"metadata": {"labels": {"bad": "2"}}})
        await until(lambda: reflector.invalid["ns/a"].version != version, "the second unreadable version")
        api.gone_next_watch()  # a relist of the same versions reports nothing again
        api.close_watches()
        await until(lambda: reflector.relists == 2, "the relist")
        api.delete(f"{PODS}/a")
        await until(lambda: "ns/a" not in reflector.store, "the deletion")
    assert [message for _, message in reported] == [
        "bad is 1; the Pod is left out of every decision until a version that can be read arrives",
        "bad is 2; the Pod is left out of every decision until a version that can be read arrives",
    ]
    assert reflector.invalid == {}


class Raw(dict[str, Any]):
    """A decoded object that can be watched for garbage collection (plain dicts cannot be weakly referenced)."""

    __hash__ = object.__hash__  # by identity, to sit in a WeakSet


async def test_a_relist_stores_page_by_page_and_never_holds_more_than_two_pages_of_raw_objects(
    api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(450):
        api.create(PODS, pod(f"p{i:04d}"))
    request = kube.request
    alive: weakref.WeakSet[Raw] = weakref.WeakSet()
    held: list[int] = []
    pages: list[int] = []

    async def tracked(*args: Any, **kwargs: Any) -> Obj:
        answer = await request(*args, **kwargs)
        if "items" in answer:
            answer["items"] = [Raw(item) for item in answer["items"]]
            alive.update(answer["items"])
            held.append(len(alive))  # this page, and whatever is left of the pages before
        return answer

    monkeypatch.setattr(kube, "request", tracked)

    def project(obj: Obj) -> str:
        assert isinstance(obj, Raw)
        alive.add(obj)
        held.append(len(alive))
        pages.append(len(api.calls("list")))
        return str(obj["metadata"]["name"])

    reflector: Reflector[str] = Reflector(kube, PODS, project, page_size=100)
    async with running(reflector):
        await reflector.synced.wait()
    assert len(reflector.store) == 450
    # Stored as each page arrived: the next page is asked for meanwhile, never the one after it.
    assert all(index // 100 + 1 <= asked <= index // 100 + 2 for index, asked in enumerate(pages))
    assert pages[-1] == 5
    assert max(held) <= 200  # the page projected and the next one


async def test_a_relist_cut_by_410_lists_again_from_the_start_and_sees_the_deletions(
    api: MemApi, kube: KubeClient
) -> None:
    for name in "abcde":
        api.create(PODS, pod(name))
    changes = Changes()
    reflector: Reflector[Obj] = Reflector(kube, PODS, raw, [changes], page_size=2)
    async with running(reflector):
        await watching(api, reflector)
        lists = len(api.calls("list"))

        def meanwhile() -> None:
            if len(api.calls("list")) == lists + 2:  # before the first continuation of the second list
                api.delete(f"{PODS}/a")
                api.delete(f"{PODS}/d")
                api.create(PODS, pod("f"))
                api.compact()

        api.meanwhile(meanwhile, verb="list", times=2)
        api.gone_next_watch()
        api.close_watches()
        await watching(api, reflector, watches=3)
    continuations = ["continue" in c.params for c in api.calls("list")]
    assert continuations == [False, True, True, False, True, False, True]  # the cut list started over
    assert reflector.relists == 2
    assert set(reflector.store) == {"ns/b", "ns/c", "ns/e", "ns/f"}
    assert [c for c in changes.seen if c[0] != "update"][-3:] == [
        ("add", "ns/f"),
        ("delete", "ns/a"),
        ("delete", "ns/d"),
    ]


async def test_the_next_page_is_asked_for_while_the_caller_still_reads_this_one(api: MemApi, kube: KubeClient) -> None:
    for i in range(5):
        api.create(PODS, pod(f"p{i}"))
    pages = kube.list_pages(PODS, page_size=2)
    first = await anext(pages)
    assert [p["metadata"]["name"] for p in first.items] == ["p0", "p1"]
    await until(lambda: len(api.calls("list")) == 2, "the second page's request, before the caller asks for it")
    assert [[p["metadata"]["name"] for p in page.items] async for page in pages] == [["p2", "p3"], ["p4"]]
    assert len(api.calls("list")) == 3  # nothing asked for past the last page


async def test_a_caller_that_stops_early_leaves_no_request_behind(api: MemApi, kube: KubeClient) -> None:
    for i in range(5):
        api.create(PODS, pod(f"p{i}"))
    pages = kube.list_pages(PODS, page_size=2)
    await anext(pages)
    api.slow_next(30.0, verb="list")  # the second page does not come
    await until(lambda: len(api.calls("list")) == 2, "the second page's request")
    await pages.aclose()
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and "_list_page" in repr(t)]
