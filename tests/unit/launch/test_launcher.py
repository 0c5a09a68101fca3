"""The launcher's loop with real child processes and a fake API server (``FakeGang``)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devheal.launch.launcher import Launcher, LaunchOptions, device_error_message
from devheal.launch.restarts import PodView
from devheal.model.run_failure import RunFailure, parse_run_failure
from devheal.model.steps import StepReport, parse_step_report
from tests.shell.waiting import until
from tests.unit.launch.children import handling_sigterm

SELF = "rank-0"

TRAINER = """
import os, signal, sys, time
from devheal.launch import report_step
path, mode = sys.argv[1], sys.argv[2]
with open(path, "a") as f:
    f.write(f"start {time.time()} {os.environ['DEVHEAL_LAUNCHER_RESTARTS']} {os.environ['DEVHEAL_LAUNCHER_ADDR']}\\n")
def stop(*_):
    time.sleep(0.2)  # a checkpoint, say
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
if mode.startswith("exit"):
    time.sleep(0.2)
    sys.exit(int(mode[4:]))
if mode.startswith("fail") and os.environ["DEVHEAL_LAUNCHER_RESTARTS"] == "0":  # the first run fails
    time.sleep(0.2)
    sys.exit(int(mode[4:]))
step = 0
while True:
    t = time.monotonic()
    time.sleep(0.02)
    step += 1
    report_step(time.monotonic() - t, step)
"""


class FakeGang:
    """The API server as the launcher sees it: its pod's generation and the gang's acknowledgements."""

    def __init__(self, peers: dict[str, int] | None = None) -> None:
        self.generation = 0
        self.acks: dict[str, int] = {SELF: 0, **(peers or {})}
        self.acknowledged: list[int] = []
        self._own: list[Callable[[PodView], None]] = []
        self._members: list[Callable[[dict[str, int]], None]] = []
        self.member_watches = 0
        self.ack_steps: list[str | None] = []
        self.published: list[str] = []
        self.failure: str | None = None
        """The held failed run on the pod (``devheal.io/launcher-failed``)."""
        self.failures: list[str] = []

    def view(self) -> PodView:
        return PodView(SELF, "g1", self.generation, self.acks[SELF], True)

    async def watch_own_pod(self, on_view: Callable[[PodView], None]) -> None:
        self._own.append(on_view)
        on_view(self.view())
        await asyncio.Event().wait()

    async def watch_members(self, gang: str | None, on_members: Callable[[dict[str, int]], None]) -> None:
        assert gang == "g1"
        self.member_watches += 1
        self._members.append(on_members)
        try:
            on_members(dict(self.acks))
            await asyncio.Event().wait()
        finally:
            self._members.remove(on_members)

    async def acknowledge(self, generation: int, steps: str | None = None, clear_failure: bool = False) -> None:
        self.acknowledged.append(generation)
        self.ack_steps.append(steps)
        if clear_failure:
            self.failure = None
        self.ack(SELF, generation)

    async def publish_steps(self, report: str) -> None:
        self.published.append(report)

    async def publish_failure(self, failure: str) -> None:
        self.failure = failure
        self.failures.append(failure)

    def bump(self, generation: int) -> None:
        self.generation = generation
        for cb in self._own:
            cb(self.view())

    def ack(self, name: str, generation: int) -> None:
        self.acks[name] = generation
        for cb in list(self._members):
            cb(dict(self.acks))


def options(tmp_path: Path, mode: str = "loop", **kw: object) -> LaunchOptions:
    return LaunchOptions(
        command=(sys.executable, "-c", TRAINER, str(tmp_path / "starts"), mode),
        grace=2.0,
        barrier_timeout=kw.pop("barrier_timeout", 30.0),  # type: ignore[arg-type]
        termination_log=tmp_path / "termination-log",
        **kw,  # type: ignore[arg-type]
    )


def starts(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "starts"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def stop(launcher: Launcher, run: asyncio.Task[int]) -> int:
    launcher.terminate()
    return await asyncio.wait_for(run, 10)


async def test_a_bump_restarts_the_child_once_after_the_gang_acknowledged(tmp_path: Path) -> None:
    gang = FakeGang(peers={"rank-1": 0})
    launcher = Launcher(options(tmp_path), gang)
    run = asyncio.ensure_future(launcher.run())
    await until(lambda: len(starts(tmp_path)) == 1 and gang.acknowledged == [0], "first start, generation 0 acked")
    gang.bump(1)
    await until(lambda: gang.acknowledged == [0, 1], "generation 1 acknowledged")
    await asyncio.sleep(0.5)
    assert len(starts(tmp_path)) == 1, "the peer has not acknowledged: no restart yet"
    gang.ack("rank-1", 1)
    await until(lambda: len(starts(tmp_path)) == 2, "restart")
    assert starts(tmp_path)[1][2] == "1", "DEVHEAL_LAUNCHER_RESTARTS counts in-place restarts"
    assert gang.member_watches == 1 and not gang._members, "the gang is watched only at the barrier"
    await asyncio.sleep(0.3)
    assert len(starts(tmp_path)) == 2
    assert await stop(launcher, run) == 0


async def test_bumps_during_the_stop_give_one_restart(tmp_path: Path) -> None:
    gang = FakeGang()
    launcher = Launcher(options(tmp_path), gang)
    run = asyncio.ensure_future(launcher.run())
    await until(lambda: len(starts(tmp_path)) == 1 and gang.acknowledged == [0], "first start")
    gang.bump(2)
    gang.bump(3)
    await until(lambda: len(starts(tmp_path)) == 2, "restart")
    await asyncio.sleep(0.5)
    assert len(starts(tmp_path)) == 2
    assert gang.acknowledged == [0, 3]
    assert await stop(launcher, run) == 0


async def test_barrier_timeout_restarts_anyway(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gang = FakeGang(peers={"rank-1": 0, "rank-2": 0})
    launcher = Launcher(options(tmp_path, barrier_timeout=1.0), gang)
    run = asyncio.ensure_future(launcher.run())
    await until(lambda: len(starts(tmp_path)) == 1, "first start")
    gang.bump(1)
    gang.ack("rank-2", 1)
    await until(lambda: len(starts(tmp_path)) == 2, "restart after the barrier timeout")
    assert "still not acknowledged by: rank-1; starting anyway" in caplog.text
    assert await stop(launcher, run) == 0


async def test_child_exit_ends_the_launcher_with_its_code_and_a_device_error_message(tmp_path: Path) -> None:
    launcher = Launcher(options(tmp_path, "exit79", device_error_exit_codes=frozenset({74, 79})), FakeGang())
    assert await asyncio.wait_for(launcher.run(), 10) == 79
    message = (tmp_path / "termination-log").read_text().strip()
    assert message.startswith("device error: ") and message.endswith("exited with code 79 (declared a device error)")
    assert message == device_error_message(launcher.options.command, 79)[: len(message)]


async def test_other_exit_codes_leave_no_termination_message(tmp_path: Path) -> None:
    launcher = Launcher(options(tmp_path, "exit3", device_error_exit_codes=frozenset({79})), FakeGang())
    assert await asyncio.wait_for(launcher.run(), 10) == 3
    assert not (tmp_path / "termination-log").exists()


async def test_an_unwritable_termination_log_is_skipped(tmp_path: Path) -> None:
    opts = options(tmp_path, "exit79", device_error_exit_codes=frozenset({79}))
    opts = LaunchOptions(**{**opts.__dict__, "termination_log": tmp_path / "no" / "such" / "dir"})
    assert await asyncio.wait_for(Launcher(opts, FakeGang()).run(), 10) == 79


async def test_terminate_forwards_to_the_child_and_exits_with_its_code(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = handling_sigterm("lambda *a: sys.exit(42)", ready)
    # A long grace: on a loaded machine the child may need seconds to exit, and SIGKILL would make it 137.
    launcher = Launcher(LaunchOptions(command=(sys.executable, "-c", code), grace=30.0), FakeGang())
    run = asyncio.ensure_future(launcher.run())
    await until(ready.exists, "the child's SIGTERM handler")
    assert await stop(launcher, run) == 42


async def test_terminate_kills_a_child_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = handling_sigterm("signal.SIG_IGN", ready)
    launcher = Launcher(LaunchOptions(command=(sys.executable, "-c", code), grace=0.5), FakeGang())
    run = asyncio.ensure_future(launcher.run())
    await until(ready.exists, "the child to ignore SIGTERM")
    assert await stop(launcher, run) == 137


async def test_a_missing_command_exits_127(tmp_path: Path) -> None:
    launcher = Launcher(LaunchOptions(command=("/no/such/trainer",)), FakeGang())
    assert await asyncio.wait_for(launcher.run(), 10) == 127


async def test_steps_are_served_with_launcher_facts(tmp_path: Path) -> None:
    import json
    import urllib.request

    gang = FakeGang()
    launcher = Launcher(options(tmp_path), gang)
    run = asyncio.ensure_future(launcher.run())
    await until(lambda: launcher.stats.count >= 5, "steps reported")
    address = starts(tmp_path)[0][3]
    assert address == launcher.steps_address

    def fetch() -> dict[str, object]:
        with urllib.request.urlopen(f"http://{address}/steps", timeout=2) as resp:
            data: dict[str, object] = json.load(resp)
            return data

    snap = await asyncio.to_thread(fetch)
    assert isinstance(snap["count"], int) and snap["count"] >= 5
    assert isinstance(snap["mean_seconds"], float) and 0.015 < snap["mean_seconds"] < 0.5
    assert snap["generation"] == 0 and snap["restarts"] == 0 and snap["phase"] == "Running"
    assert await stop(launcher, run) == 0


async def test_step_times_are_published_on_the_pod_and_a_restart_empties_the_window(tmp_path: Path) -> None:
    gang = FakeGang()
    launcher = Launcher(options(tmp_path, steps_publish_interval=0.2), gang)
    run = asyncio.ensure_future(launcher.run())

    def first_with_steps() -> StepReport | None:
        # The first publication may come before the command's first step (a slow start).
        reports = (parse_step_report(published)[0] for published in gang.published)
        return next((r for r in reports if r is not None and r.count >= 1), None)

    await until(lambda: first_with_steps() is not None, "a publication with steps")
    report = first_with_steps()
    assert report is not None
    assert report.count >= 1 and 1 <= report.window <= 10 and report.p50 is not None and 0.015 < report.p50 < 0.5
    assert report.last is not None and abs(report.last - time.time()) < 5
    assert gang.ack_steps == [None], "the first acknowledgement comes while the command runs: nothing to reset"
    gang.bump(1)
    await until(lambda: len(starts(tmp_path)) == 2, "restart")
    reset, _ = parse_step_report(gang.ack_steps[-1])
    assert reset is not None and reset.window == 0 and reset.p50 is None, "the restart's acknowledgement empties it"
    assert reset.run is not None and reset.last is not None and reset.run > reset.last
    assert await stop(launcher, run) == 0


async def test_unchanged_step_times_are_not_published_again(tmp_path: Path) -> None:
    gang = FakeGang()
    launcher = Launcher(options(tmp_path, "exit0", steps_publish_interval=0.1), gang)
    launcher.stats.record(0.5, 1, launcher.clock())
    publisher = asyncio.ensure_future(launcher._publish_steps(0.1))
    await until(lambda: len(gang.published) == 1, "one publication")
    await asyncio.sleep(0.5)
    assert len(gang.published) == 1, "nothing new: no patch"
    launcher.stats.record(0.5, 2, launcher.clock())
    await until(lambda: len(gang.published) == 2, "a new step: published again")
    # No new step, but the rank entered a collective and waits in it: where it is, is news.
    launcher.stats.collective_marks(5, 4, 0.0, launcher.clock())
    await until(lambda: len(gang.published) == 3, "inside a collective: published again")
    inside, why = parse_step_report(gang.published[-1])
    assert inside is not None and inside.inside is not None and (inside.collectives, inside.exits) == (5, 4), why
    launcher.stats.collective_marks(5, 5, None, launcher.clock())
    await until(lambda: len(gang.published) == 4, "out of it: published again")
    publisher.cancel()


# ---- a failed run held for a restart (--hold-failed) ----------------------------------------------


def held(gang: FakeGang) -> RunFailure | None:
    return parse_run_failure(gang.failure)[0] if gang.failure is not None else None


async def test_a_held_failed_run_is_published_and_restarted_in_place(tmp_path: Path) -> None:
    gang = FakeGang(peers={"rank-1": 0})
    gang.generation = 2
    before = time.time()
    launcher = Launcher(options(tmp_path, "fail79", hold_failed=60.0), gang)
    run = asyncio.ensure_future(launcher.run())
    await until(lambda: held(gang) is not None, "the failed run published")
    failure = held(gang)
    assert failure is not None and failure.code == 79 and failure.generation == 2
    assert before <= failure.at <= time.time()
    assert not run.done(), "holding, not exiting"
    gang.bump(3)
    await until(lambda: gang.acknowledged == [2, 3], "the restart acknowledged")
    assert gang.failure is None, "the acknowledgement removed the failed run"
    gang.ack("rank-1", 3)
    await until(lambda: len(starts(tmp_path)) == 2, "started again in place")
    assert starts(tmp_path)[1][2] == "1", "an in-place restart"
    assert await stop(launcher, run) == 0


async def test_a_held_failed_run_exits_with_its_code_and_message_when_no_restart_comes(tmp_path: Path) -> None:
    gang = FakeGang()
    opts = options(tmp_path, "exit79", hold_failed=1.0, device_error_exit_codes=frozenset({79}))
    launcher = Launcher(opts, gang)
    assert await asyncio.wait_for(launcher.run(), 10) == 79
    assert held(gang) is not None, "published while it held"
    message = (tmp_path / "termination-log").read_text().strip()
    assert message.startswith("device error: ") and message.endswith("exited with code 79 (declared a device error)")


async def test_sigterm_while_holding_exits_at_once_with_the_failed_runs_code(tmp_path: Path) -> None:
    gang = FakeGang()
    launcher = Launcher(options(tmp_path, "exit3", hold_failed=600.0), gang)
    run = asyncio.ensure_future(launcher.run())
    await until(lambda: held(gang) is not None, "holding")
    assert await stop(launcher, run) == 3


async def test_without_a_hold_a_failed_run_is_not_published(tmp_path: Path) -> None:
    gang = FakeGang()
    assert await asyncio.wait_for(Launcher(options(tmp_path, "exit3"), gang).run(), 10) == 3
    assert gang.failures == []
