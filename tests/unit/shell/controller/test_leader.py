"""Leader election on a Lease: never two leaders at once, take-over after the lease lapses, step down on time.

Expiry is judged on each replica's monotonic clock (the virtual loop's), never by comparing
the holder's ``renewTime`` with a wall clock, so candidates here may have skewed wall clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from devheal.controller.leader import LeaderElector
from devheal.kube.client import KubeClient
from devheal.model.times import parse_time
from tests.shell.fixtures import EPOCH, connect, wall_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="function")

LEASE = "/apis/coordination.k8s.io/v1/namespaces/devheal/leases/controller"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/devheal/leases"
FOREVER = 10**6
"""Enough requests for a knob to hold for the rest of a test."""


class Referee:
    """Watches every candidate's leadership and notes any instant at which two lead."""

    def __init__(self) -> None:
        self.leaders: set[str] = set()
        self.overlaps: list[tuple[float, set[str]]] = []

    def changed(self, identity: str, leading: bool, at: float) -> None:
        if leading:
            if self.leaders - {identity}:
                self.overlaps.append((at, self.leaders | {identity}))
            self.leaders.add(identity)
        else:
            self.leaders.discard(identity)


class Candidate:
    """One replica's elector, and when it gained or lost leadership (virtual seconds)."""

    def __init__(
        self,
        kube: KubeClient,
        identity: str,
        now: Callable[[], datetime.datetime] = wall_clock,
        referee: Referee | None = None,
    ) -> None:
        self.changes: list[tuple[float, bool]] = []
        self.referee = referee
        self.elector = LeaderElector(kube, "devheal", "controller", identity, on_change=self._changed, now=now)

    def _changed(self, leading: bool) -> None:
        at = round(asyncio.get_running_loop().time(), 6)
        self.changes.append((at, leading))
        if self.referee is not None:
            self.referee.changed(self.elector.identity, leading, at)

    def started(self) -> list[float]:
        return [at for at, leading in self.changes if leading]

    def stopped(self) -> list[float]:
        return [at for at, leading in self.changes if not leading]


@contextlib.asynccontextmanager
async def running(*candidates: Candidate) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(c.elector.run()) for c in candidates]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def clients(api: MemApi, directory: Path, *users: str) -> AsyncIterator[list[KubeClient]]:
    """One client per replica, each sending its own user, so a knob can cut one replica off."""
    made = [await connect(api, directory, user) for user in users]
    try:
        yield made
    finally:
        for client in made:
            await client.close()


def spec(api: MemApi) -> dict[str, Any]:
    return api.get(LEASE)["spec"]


def at(api: MemApi, field: str) -> float:
    """A lease time as virtual seconds."""
    moment = parse_time(spec(api)[field])
    assert moment is not None
    return round(moment - EPOCH.timestamp(), 6)


def ahead(seconds: float) -> Callable[[], datetime.datetime]:
    """A wall clock ``seconds`` ahead of the others."""
    return lambda: wall_clock() + datetime.timedelta(seconds=seconds)


def held_by(holder: str, duration: int = 15) -> dict[str, Any]:
    """A lease written by a replica that is gone."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "controller"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": "2030-01-01T00:00:00.000000Z",
            "renewTime": "2030-01-01T00:00:00.000000Z",
            "leaseTransitions": 0,
        },
    }


async def test_the_first_candidate_creates_the_lease_and_renews_it(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(0.5)
        assert spec(api) == {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "acquireTime": "2030-01-01T00:00:00.000000Z",
            "renewTime": "2030-01-01T00:00:00.000000Z",
            "leaseTransitions": 0,
        }
        await asyncio.sleep(9)
    assert a.changes == [(0.0, True), (9.5, False)]  # the elector stopped: nobody renews, so it stops leading
    assert [round(c.at, 6) for c in api.calls("update", LEASE)] == [2.0, 4.0, 6.0, 8.0]
    assert at(api, "renewTime") == 8.0
    assert at(api, "acquireTime") == 0.0


async def test_a_candidate_waits_while_the_lease_is_renewed_and_takes_it_once_it_lapses(
    api: MemApi, kube: KubeClient
) -> None:
    referee = Referee()
    a, b = Candidate(kube, "a", referee=referee), Candidate(kube, "b", referee=referee)
    async with running(a) as (task_a,):
        await asyncio.sleep(0.5)
        async with running(b):
            await asyncio.sleep(5)  # a renews at 2 and 4, then stops (a crash: no release)
            task_a.cancel()
            await until(lambda: b.elector.leading, "b to lead", timeout=60)
            assert spec(api)["holderIdentity"] == "b"
    # b tries every 2 s from 0.5 and last saw the lease change at 4.5 (a's renew at 4): it has not
    # changed for more than 15 s at 20.5.
    assert b.started() == [20.5]
    assert a.changes == [(0.0, True), (5.5, False)]
    assert referee.overlaps == []
    assert spec(api)["leaseTransitions"] == 1
    assert at(api, "acquireTime") == 20.5


async def test_a_lease_is_judged_by_the_duration_its_holder_wrote(api: MemApi, kube: KubeClient) -> None:
    api.create(LEASES, held_by("gone", duration=30))
    b = Candidate(kube, "b")  # its own lease duration is 15 s
    async with running(b):
        await until(lambda: b.elector.leading, "b to lead")
    assert b.started() == [32.0]  # first try more than 30 s after it first saw the lease (at 0)


async def test_a_lease_never_seen_to_change_counts_from_when_it_was_first_seen(api: MemApi, kube: KubeClient) -> None:
    api.create(LEASES, held_by("gone"))
    await asyncio.sleep(3600)  # renewTime is an hour old on every wall clock: no matter
    b = Candidate(kube, "b")
    async with running(b):
        await until(lambda: b.elector.leading, "b to lead")
    assert b.started() == [3600.0 + 16]


async def test_two_candidates_racing_for_a_lease_cannot_both_win(api: MemApi, kube: KubeClient) -> None:
    a, b = Candidate(kube, "a"), Candidate(kube, "b")
    assert sorted(await asyncio.gather(a.elector.try_acquire_or_renew(), b.elector.try_acquire_or_renew())) == [
        False,
        True,
    ]  # both saw no lease; one create answered AlreadyExists
    assert spec(api)["holderIdentity"] in ("a", "b")


async def test_two_candidates_taking_over_a_lapsed_lease_cannot_both_win(api: MemApi, kube: KubeClient) -> None:
    api.create(LEASES, held_by("gone"))
    a, b = Candidate(kube, "a"), Candidate(kube, "b")
    assert await asyncio.gather(a.elector.try_acquire_or_renew(), b.elector.try_acquire_or_renew()) == [False, False]
    await asyncio.sleep(20)  # unchanged for 20 s: both see it lapsed and both try to take it over
    results = await asyncio.gather(a.elector.try_acquire_or_renew(), b.elector.try_acquire_or_renew())
    assert sorted(results) == [False, True]  # one update answered Conflict, or one read the winner's lease
    # Both update when both read the lapsed lease first; a loaded loop may let one read the winner's lease
    # instead, and that one never writes.
    assert len(api.calls("update", LEASE)) in (1, 2)
    assert spec(api)["leaseTransitions"] == 1
    assert spec(api)["holderIdentity"] == ("a" if results[0] else "b")


async def test_a_leader_that_cannot_renew_steps_down_at_its_renew_deadline(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(1)
        api.fail_next(500, verb="get", path=LEASE, times=6)  # tries at 2, 4, ... 12 fail
        await asyncio.sleep(15)
    # Leading until 10 s after the last renew (sent at 0), not a moment longer; back at 14.
    assert a.changes == [(0.0, True), (10.0, False), (14.0, True), (16.0, False)]


async def test_a_hung_api_server_counts_against_the_renew_deadline(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(1)
        api.slow_next(60, verb="get", path=LEASE)  # the try at 2 hangs; given up at the deadline, 10
        await asyncio.sleep(15)
    assert a.changes == [(0.0, True), (10.0, False), (12.0, True), (16.0, False)]


async def test_the_deadline_counts_from_when_the_last_renew_was_sent(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(1)
        api.slow_next(3, verb="update", path=LEASE)  # the renew sent at 2 is stored and answered at 5
        await asyncio.sleep(2)
        api.fail_next(500, verb="get", path=LEASE, times=FOREVER)  # the tries at 7, 9, 11 fail
        await asyncio.sleep(9.5)
    # The server stored that renew no earlier than it was sent: 2 + 10, not 5 + 10.
    assert a.changes == [(0.0, True), (12.0, False)]


async def test_one_conflicting_renew_does_not_end_leadership(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(1)
        api.fail_next(409, verb="update", path=LEASE)
        await asyncio.sleep(5.5)
    assert a.changes == [(0.0, True), (6.5, False)]  # still leading until the elector stopped
    assert [(round(c.at, 6)) for c in api.calls("update", LEASE)] == [2.0, 4.0, 6.0]
    assert at(api, "renewTime") == 6.0


async def test_renews_failing_until_the_deadline_end_leadership(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(1)
        api.fail_next(409, verb="update", path=LEASE, times=FOREVER)
        await asyncio.sleep(12)
    assert a.changes == [(0.0, True), (10.0, False)]


async def test_a_candidate_with_a_fast_clock_does_not_take_a_renewed_lease(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    b = Candidate(kube, "b", now=ahead(20))
    async with running(a):
        await asyncio.sleep(0.5)
        async with running(b):
            await asyncio.sleep(60)
    assert b.changes == []
    assert spec(api)["holderIdentity"] == "a"


async def test_a_leader_that_finds_another_holder_steps_down_at_once(api: MemApi, kube: KubeClient) -> None:
    a = Candidate(kube, "a")
    async with running(a):
        await asyncio.sleep(1)
        api.patch(LEASE, {"spec": {"holderIdentity": "intruder", "renewTime": "2030-01-01T00:00:01.000000Z"}})
        await asyncio.sleep(2)
    assert a.changes == [(0.0, True), (2.0, False)]
    assert spec(api)["holderIdentity"] == "intruder"


@pytest.mark.parametrize("cut_off", ["fail", "hang"])
@pytest.mark.parametrize("skewed", ["leader", "follower"])
async def test_a_leader_cut_off_from_the_api_stops_before_another_takes_over(
    api: MemApi, tmp_path: Path, cut_off: str, skewed: str
) -> None:
    """Two replicas, one with a wall clock 20 s ahead; the leader loses the API server."""
    referee = Referee()
    async with clients(api, tmp_path, "a", "b") as (kube_a, kube_b):
        a = Candidate(kube_a, "a", now=ahead(20) if skewed == "leader" else wall_clock, referee=referee)
        b = Candidate(kube_b, "b", now=ahead(20) if skewed == "follower" else wall_clock, referee=referee)
        async with running(a):
            await asyncio.sleep(0.5)
            async with running(b):
                await asyncio.sleep(4.5)  # a renewed at 2 and 4; b saw the change at 4.5
                assert a.elector.leading and not b.elector.leading
                if cut_off == "fail":
                    api.fail_next(503, user="a", times=FOREVER)
                else:
                    api.slow_next(3600, user="a", times=FOREVER)
                await until(lambda: b.elector.leading, "b to take over", timeout=60)
                api.faults.clear()  # a reaches the API again: it finds b's lease and stays a follower
                await asyncio.sleep(30)
                assert spec(api)["holderIdentity"] == "b"
                assert b.elector.leading and not a.elector.leading
    assert referee.overlaps == []
    # a stops at 4 + 10 (its last renew + the renew deadline); b takes over on its first try
    # more than 15 s after 4.5: lease duration - renew deadline and more in between.
    assert a.changes[:2] == [(0.0, True), (14.0, False)]
    assert b.started() == [20.5]
    assert b.started()[0] - a.stopped()[0] >= 15 - 10


async def test_a_released_lease_is_taken_over_without_waiting_for_it_to_lapse(api: MemApi, kube: KubeClient) -> None:
    referee = Referee()
    a, b = Candidate(kube, "a", referee=referee), Candidate(kube, "b", now=ahead(20), referee=referee)
    async with running(a) as (task_a,):
        await asyncio.sleep(0.5)
        async with running(b):
            # Released between two of b's tries (at 2.5 and 4.5): at 4.5 itself, which try came first would be
            # up to the event loop.
            await asyncio.sleep(3.5)
            task_a.cancel()  # as the controller stops: the elector first, then the release
            await a.elector.release()
            assert spec(api)["holderIdentity"] == ""
            await until(lambda: b.elector.leading, "b to lead")
    assert a.changes == [(0.0, True), (4.0, False)]
    assert b.started() == [4.5]  # b's next try after the release, long before the lease would lapse
    assert referee.overlaps == []
    assert spec(api)["leaseTransitions"] == 1


async def test_release_stops_acting_before_the_lease_is_handed_over(api: MemApi, kube: KubeClient) -> None:
    leading_when_released: list[bool] = []
    a = Candidate(kube, "a")
    assert await a.elector.try_acquire_or_renew()
    a.elector.leading = True
    api.meanwhile(lambda: leading_when_released.append(a.elector.leading), verb="update", path=LEASE)
    await a.elector.release()
    assert leading_when_released == [False]
    assert spec(api)["holderIdentity"] == ""


async def test_release_by_a_follower_leaves_the_lease_alone(api: MemApi, kube: KubeClient) -> None:
    a, b = Candidate(kube, "a"), Candidate(kube, "b")
    assert await a.elector.try_acquire_or_renew()
    before = api.get(LEASE)
    await b.elector.release()
    assert api.get(LEASE) == before


async def test_release_without_a_lease_is_quiet(api: MemApi, kube: KubeClient) -> None:
    await Candidate(kube, "a").elector.release()
    assert not api.calls("update")


async def test_a_lease_duration_is_published_rounded_up(api: MemApi, kube: KubeClient) -> None:
    elector = LeaderElector(kube, "devheal", "controller", "a", lease_duration=2.5, renew_deadline=2, retry_period=0.5)
    assert await elector.try_acquire_or_renew()
    assert spec(api)["leaseDurationSeconds"] == 3  # never less than the holder's renew deadline


@pytest.mark.parametrize(
    ("lease_duration", "renew_deadline", "retry_period"),
    [(10, 10, 2), (10, 15, 2), (15, 10, 10), (15, 10, 0)],
)
async def test_timings_that_could_let_two_replicas_act_are_refused(
    kube: KubeClient, lease_duration: float, renew_deadline: float, retry_period: float
) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaderElector(
            kube,
            "devheal",
            "controller",
            "a",
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
        )
