"""Events are counted on one object and rate-limited per involved object, like client-go's EventRecorder.

The recorder writes through the real client to the in-memory API on virtual time; what the
tests read back is the Event objects the API server holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devheal.controller.events import BURST, REFILL, WINDOW, EventRecorder
from devheal.controller.records import Records
from devheal.kube.client import KubeClient, api_path
from devheal.model.plan import Action, Blocked, EventReason, Finding, FindingKind, FindingSource, Rail, TargetKind
from devheal.model.policy import ActionKind
from tests.shell.fixtures import EPOCH, unix_clock
from tests.shell.memapi import MemApi
from tests.unit.shell.controller.test_loop import PODS, REMEDIATIONS, events, gone, inference_pod, running, seed

pytestmark = pytest.mark.asyncio(loop_scope="function")

EVENTS = api_path("v1", "events", namespace="ml")
Obj = dict[str, Any]


def pod(name: str = "train-0") -> Obj:
    return {"kind": "Pod", "namespace": "ml", "name": name, "uid": f"uid-{name}", "apiVersion": "v1"}


def stored(api: MemApi, name: str = "", reason: str = "") -> list[Obj]:
    """The Event objects the API holds (on ``name``, of ``reason``), oldest first."""
    return [obj for obj in events(api, reason) if not name or obj["involvedObject"]["name"] == name]


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("devheal_events_dropped_total", {"reason": reason}) or 0.0


async def test_repeats_are_counted_on_one_event(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    for _ in range(20):
        await recorder.record(pod(), "DevhealDescheduleFailed", "eviction refused", "Warning")
        await asyncio.sleep(1)
    [event] = stored(api)
    assert (event["count"], event["reason"], event["type"]) == (20, "DevhealDescheduleFailed", "Warning")
    assert event["firstTimestamp"] == "2030-01-01T00:00:00Z"
    assert event["lastTimestamp"] == "2030-01-01T00:00:19Z"
    assert len(api.calls("create", EVENTS)) == 1


async def test_past_the_burst_writes_are_dropped_and_the_next_one_carries_the_true_count(
    api: MemApi, kube: KubeClient
) -> None:
    recorder = EventRecorder(kube, unix_clock)
    before = dropped("Flood")
    for _ in range(100):
        await recorder.record(pod(), "Flood", "the same thing again")
    [event] = stored(api)
    assert event["count"] == BURST  # 1 create and 24 patches; the other 75 dropped
    assert dropped("Flood") - before == 100 - BURST
    writes = len(api.calls(path=EVENTS))
    assert writes == BURST
    await asyncio.sleep(REFILL)  # one token back
    await recorder.record(pod(), "Flood", "the same thing again")
    [event] = stored(api)
    assert event["count"] == 101  # the dropped occurrences were counted all the same
    assert len(api.calls(path=EVENTS)) == writes + 1


async def test_each_involved_object_has_its_own_limit_and_its_own_event(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    for _ in range(30):
        await recorder.record(pod("a"), "Flood", "again")
        await recorder.record(pod("b"), "Flood", "again")
    [a] = stored(api, "a")
    [b] = stored(api, "b")
    assert (a["count"], b["count"]) == (BURST, BURST)
    assert a["metadata"]["name"] != b["metadata"]["name"]


async def test_a_different_reason_type_or_message_is_another_event(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    await recorder.record(pod(), "A", "one")
    await recorder.record(pod(), "B", "one")
    await recorder.record(pod(), "A", "one", "Warning")
    await recorder.record(pod(), "A", "two")
    await recorder.record(pod(), "A", "one")
    counts = sorted((e["reason"], e["type"], e["message"], e["count"]) for e in stored(api))
    assert counts == [
        ("A", "Normal", "one", 2),
        ("A", "Normal", "two", 1),
        ("A", "Warning", "one", 1),
        ("B", "Normal", "one", 1),
    ]


async def test_after_the_window_a_repeat_is_a_new_event(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    for _ in range(3):
        await recorder.record(pod(), "Again", "same")
    await asyncio.sleep(WINDOW + 1)
    await recorder.record(pod(), "Again", "same")
    first, second = stored(api)
    assert (first["count"], second["count"]) == (3, 1)
    assert second["firstTimestamp"] == "2030-01-01T00:10:01Z"


async def test_many_distinct_messages_of_one_reason_are_combined(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    for i in range(15):
        await recorder.record(pod(), "Blocked", f"waited {i}s")
    shown = [(e["message"], e["count"]) for e in stored(api)]
    assert shown[:9] == [(f"waited {i}s", 1) for i in range(9)]
    assert shown[9:] == [("(combined from similar events): waited 14s", 6)]


async def test_a_failed_write_is_logged_not_raised_and_the_next_one_counts_it(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    api.fail_next(500, verb="create", path=EVENTS)
    await recorder.record(pod(), "Flaky", "once")
    assert stored(api) == []
    await recorder.record(pod(), "Flaky", "once")
    [event] = stored(api)
    assert event["count"] == 2


async def test_an_event_the_server_deleted_is_created_again_with_its_count(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    await recorder.record(pod(), "Gone", "x")
    [event] = stored(api)
    api.delete(f"{EVENTS}/{event['metadata']['name']}")  # the API server's Event TTL
    await recorder.record(pod(), "Gone", "x")
    [event] = stored(api)
    assert event["count"] == 2


async def test_racing_occurrences_make_one_event(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock)
    await asyncio.gather(*(recorder.record(pod(), "Race", "x") for _ in range(10)))
    [event] = stored(api)
    assert event["count"] == 10
    assert len(api.calls("create", EVENTS)) == 1


async def test_memory_is_bounded_least_recently_used_forgotten_first(api: MemApi, kube: KubeClient) -> None:
    recorder = EventRecorder(kube, unix_clock, capacity=2)
    for name in ("a", "b", "a", "c", "a", "b"):
        await recorder.record(pod(name), "Seen", "x")
    # "b" was forgotten when "c" came (it was the least recently used): its repeat is a new object.
    assert sorted((e["involvedObject"]["name"], e["count"]) for e in stored(api)) == [
        ("a", 3),
        ("b", 1),
        ("b", 1),
        ("c", 1),
    ]


def blocked_action() -> Action:
    finding = Finding(
        FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "GPU-0 Unhealthy", EPOCH.timestamp(), "ml/p"
    )
    return Action(ActionKind.DESCHEDULE, TargetKind.POD, "ml/p", "n1", finding, "p", target_uid="u1")


async def test_the_same_blocked_decision_for_60_rounds_is_one_event(api: MemApi, kube: KubeClient) -> None:
    records = Records(kube, unix_clock)
    item = Blocked(blocked_action(), "policy p is paused", Rail.PAUSED)
    for _ in range(60):  # even were it announced every round, it is one object
        await records.event(item.action, EventReason.BLOCKED, f"Deschedule not taken: {item.why}", "Warning")
        await asyncio.sleep(1)
    [event] = stored(api, "p")
    assert event["count"] == BURST  # the rest were counted, and dropped by the per-object limit
    assert event["involvedObject"] == {"kind": "Pod", "namespace": "ml", "name": "p", "uid": "u1", "apiVersion": "v1"}


async def test_a_workload_interval_block_over_60_rounds_is_one_event_and_one_status_write(
    api: MemApi, kube: KubeClient
) -> None:
    seed(api, "infer-0", budgets={"workloadDisruptionInterval": "10m"})
    async with running(kube) as run:
        await asyncio.sleep(5)
        assert gone(api)()
        api.create(PODS, inference_pod("infer-1", device="GPU-1"))  # the same Deployment
        await asyncio.sleep(60)
    assert run.rounds >= 60
    [event] = stored(api, "infer-1", "DevhealBlocked")
    assert event["count"] == 1
    assert "was disrupted at" in event["message"]
    blocked = [o for k, o in api.store.objects.items() if k[1] == "remediations" and "infer-1" in str(o["spec"])]
    [record] = blocked
    assert len(api.calls("patch", f"{REMEDIATIONS}/{record['metadata']['name']}")) == 1
