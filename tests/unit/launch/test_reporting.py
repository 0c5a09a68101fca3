"""``report_step`` against the launcher's real step endpoint, and when there is none."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from devheal.launch import reporting
from devheal.launch.reporting import (
    ADDR_ENV,
    collective,
    enter_collective,
    leave_collective,
    report_checkpoint,
    report_collective,
    report_joined,
    report_step,
)
from devheal.launch.steps import StepStats
from devheal.launch.steps_server import StepsServer, parse_steps_address


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    reporting._state.update(suspended_until=0.0, told_absent=False)
    reporting._connection.close()
    yield
    reporting._state.update(suspended_until=0.0, told_absent=False)
    reporting._connection.close()


@pytest.fixture
async def server() -> AsyncIterator[StepsServer]:
    srv = StepsServer(StepStats(window=10), "127.0.0.1", 0, extra=lambda: {"generation": 4})
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def get_json(address: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{address}/steps", timeout=2) as resp:
        data: dict[str, object] = json.load(resp)
        return data


async def test_reported_steps_are_aggregated_and_served(server: StepsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    for i in range(5):
        await asyncio.to_thread(report_step, 0.1 * (i + 1), i)
    await asyncio.to_thread(report_step, 0.6)
    snap = await asyncio.to_thread(get_json, server.address)
    assert snap["count"] == 6 and snap["last_step"] == 4 and snap["generation"] == 4
    assert snap["mean_seconds"] == pytest.approx(0.35)


async def test_a_run_reports_reaching_its_rendezvous(server: StepsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    assert server.stats.joined_at is None
    await asyncio.to_thread(report_joined)
    assert server.stats.joined_at is not None and server.stats.count == 0, "not a step"


async def test_a_run_reports_its_checkpoints(server: StepsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    assert server.stats.checkpoint_at is None
    await asyncio.to_thread(report_checkpoint)
    first = server.stats.checkpoint_at
    assert first is not None and server.stats.count == 0, "not a step"
    await asyncio.to_thread(report_checkpoint)
    assert server.stats.checkpoint_at is not None and server.stats.checkpoint_at >= first, "the latest counts"


def test_reporting_a_checkpoint_without_a_launcher_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDR_ENV, raising=False)
    report_checkpoint()  # no launcher: nothing to tell, nothing raised


def test_reporting_the_rendezvous_without_a_launcher_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDR_ENV, raising=False)
    report_joined()  # no launcher: nothing to tell, nothing raised
    monkeypatch.setenv(ADDR_ENV, "127.0.0.1:1")  # nobody listening
    report_joined()
    assert reporting._state["suspended_until"] > 0


async def test_collectives_are_counted_in_memory_and_posted_by_a_thread_when_the_count_changed(
    server: StepsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    monkeypatch.setattr(reporting, "_collectives", reporting._CollectiveCounter())
    posts: list[int] = []
    real_send = reporting._send
    monkeypatch.setattr(reporting, "_send", lambda *a: (posts.append(a[2]["collectives"]), real_send(*a))[1])
    started = time.monotonic()
    for _ in range(1000):
        report_collective()
    assert time.monotonic() - started < 0.5, "no post on the calling thread"
    await wait_for(lambda: server.stats.collectives == 1000)
    await asyncio.sleep(3 * reporting.COLLECTIVES_POST_SECONDS)
    assert posts == [1000], "one post for the burst, none while the count stands still"
    report_collective()
    await wait_for(lambda: server.stats.collectives == 1001)
    assert server.stats.count == 0, "not a step"


async def test_marked_collectives_tell_the_launcher_whether_the_rank_is_inside_one(
    server: StepsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    monkeypatch.setattr(reporting, "_collectives", reporting._CollectiveCounter())
    stats = server.stats
    with collective():
        await wait_for(lambda: stats.inside_since is not None)
        assert (stats.collectives, stats.exits) == (1, 0)
        assert time.monotonic() - stats.inside_since < 5
    await wait_for(lambda: stats.inside_since is None)
    assert (stats.collectives, stats.exits) == (1, 1)
    # Several in flight at once (DDP's buckets), each left on the thread that completes it: inside until the last.
    enter_collective()
    enter_collective()
    await asyncio.to_thread(leave_collective)
    await asyncio.sleep(3 * reporting.COLLECTIVES_POST_SECONDS)
    assert (stats.collectives, stats.exits) == (3, 2) and stats.inside_since is not None
    await asyncio.to_thread(leave_collective)
    await wait_for(lambda: stats.inside_since is None and stats.exits == 3)
    leave_collective()  # without an open entry: ignored
    report_collective()  # an entry with no exit mark, as older loops count
    await wait_for(lambda: stats.collectives == 4)
    assert stats.exits == 3 and stats.inside_since is None


def test_a_block_that_raises_still_marks_the_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDR_ENV, raising=False)
    counter = reporting._CollectiveCounter()
    monkeypatch.setattr(reporting, "_collectives", counter)
    with pytest.raises(RuntimeError), collective():
        raise RuntimeError("the collective timed out")
    assert (counter.count, counter.exits, counter.depth) == (1, 1, 0)


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_counting_collectives_without_a_launcher_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDR_ENV, raising=False)
    counter = reporting._CollectiveCounter()
    counter.count = 3
    counter.post_if_changed()  # no launcher: nothing to tell, nothing raised
    assert counter.posted == (0, 0, False)
    monkeypatch.setenv(ADDR_ENV, "127.0.0.1:1")  # nobody listening
    counter.post_if_changed()
    assert counter.posted == (0, 0, False) and reporting._state["suspended_until"] > 0


async def test_bad_reports_are_dropped_client_side(server: StepsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    await asyncio.to_thread(report_step, float("nan"), 1)
    await asyncio.to_thread(report_step, -1.0, 1)
    await asyncio.to_thread(report_step, "x", 1)  # type: ignore[arg-type]
    await asyncio.to_thread(report_step, 0.5, "seven")  # type: ignore[arg-type]
    assert server.stats.count == 1 and server.stats.last_step is None


async def test_bad_posts_get_400(server: StepsServer) -> None:
    def post(body: bytes) -> int:
        req = urllib.request.Request(f"http://{server.address}/steps", data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert await asyncio.to_thread(post, b"not json") == 400
    assert await asyncio.to_thread(post, b"[1]") == 400
    assert await asyncio.to_thread(post, b'{"duration_seconds": -2}') == 400
    assert await asyncio.to_thread(post, b'{"duration_seconds": 2, "step": 3}') == 204
    assert await asyncio.to_thread(post, b'{"collectives": -1}') == 400
    assert await asyncio.to_thread(post, b'{"collectives": "7"}') == 400
    assert await asyncio.to_thread(post, b'{"collectives": 7}') == 204
    assert server.stats.collectives == 7
    assert await asyncio.to_thread(post, b'{"collectives": 8, "exits": 9, "inside_seconds": null}') == 400
    assert await asyncio.to_thread(post, b'{"collectives": 8, "exits": 8, "inside_seconds": 0.5}') == 400
    assert await asyncio.to_thread(post, b'{"collectives": 8, "exits": 7, "inside_seconds": -1}') == 400
    assert (server.stats.collectives, server.stats.exits) == (7, None), "a refused post keeps nothing"
    assert await asyncio.to_thread(post, b'{"collectives": 8, "exits": 7, "inside_seconds": 0.5}') == 204
    assert (server.stats.collectives, server.stats.exits) == (8, 7) and server.stats.inside_since is not None
    assert server.stats.count == 1


def test_without_a_launcher_it_does_nothing(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(ADDR_ENV, raising=False)
    caplog.set_level("DEBUG", logger=reporting.__name__)
    report_step(0.1, 1)
    report_step(0.1, 2)
    assert [r.getMessage() for r in caplog.records].count(
        f"{ADDR_ENV} is not set (not run by devheal launch); step reports are dropped"
    ) == 1


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:notaport", ""])
def test_a_bad_address_never_raises(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    monkeypatch.setenv(ADDR_ENV, address)
    report_step(0.1, 1)


def test_a_silent_launcher_costs_one_short_timeout_then_reports_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections, never answers
    try:
        monkeypatch.setenv(ADDR_ENV, f"127.0.0.1:{listener.getsockname()[1]}")
        started = time.monotonic()
        report_step(0.1, 1)
        first = time.monotonic() - started
        started = time.monotonic()
        for i in range(50):
            report_step(0.1, i)
        rest = time.monotonic() - started
    finally:
        listener.close()
    assert first < 1.0
    assert rest < 0.1, "reports are skipped while the launcher does not answer"


def test_nobody_listening_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv(ADDR_ENV, f"127.0.0.1:{port}")
    report_step(0.1, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:0", ("127.0.0.1", 0)), ("localhost:9000", ("localhost", 9000)), ("[::1]:80", ("::1", 80))],
)
def test_steps_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_steps_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.0.0.0:9000", "loopback"),
        ("10.1.2.3:9000", "loopback"),
        ("example.com:80", "loopback IP address or localhost"),
        ("127.0.0.1", "HOST:PORT"),
        ("127.0.0.1:99999", "port"),
    ],
)
def test_steps_address_must_be_loopback(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_steps_address(text)


async def test_reports_share_one_kept_alive_connection(server: StepsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDR_ENV, server.address)
    await asyncio.to_thread(report_step, 0.1, 1)
    conn = reporting._connection.conn
    assert conn is not None and conn.sock is not None
    sock = conn.sock
    for i in range(20):
        await asyncio.to_thread(report_step, 0.1, i)
    assert reporting._connection.conn is conn and conn.sock is sock
    assert server.stats.count == 21


async def test_a_connection_closed_by_a_restarted_launcher_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    first = StepsServer(StepStats(), "127.0.0.1", 0)
    await first.start()
    port = int(first.address.rsplit(":", 1)[1])
    monkeypatch.setenv(ADDR_ENV, first.address)
    await asyncio.to_thread(report_step, 0.1, 1)
    await first.close()
    second = StepsServer(StepStats(), "127.0.0.1", port)
    await second.start()
    try:
        await asyncio.to_thread(report_step, 0.1, 2)
        assert second.stats.count == 1 and second.stats.last_step == 2
        assert reporting._state["suspended_until"] == 0.0
    finally:
        await second.close()


async def test_a_forked_process_reports_on_its_own_connection(
    server: StepsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    monkeypatch.setenv(ADDR_ENV, server.address)
    await asyncio.to_thread(report_step, 0.1, 1)

    def fork_and_report() -> int:
        pid = os.fork()
        if pid == 0:  # the child: report twice, exit at once
            try:
                report_step(0.2, 100)
                report_step(0.2, 101)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        return status

    assert await asyncio.to_thread(fork_and_report) == 0
    await asyncio.to_thread(report_step, 0.1, 2)
    assert server.stats.count == 4
