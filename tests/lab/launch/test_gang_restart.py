"""Issue #5, the launcher: a gang of 4 pods restarts in place, once per generation, behind a barrier."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from devheal.lab.workloads import wait_until

from .conftest import GangHarness, now

RANKS = [f"rank-{i}" for i in range(4)]


async def start_gang(gang: GangHarness) -> None:
    await gang.create_pods(RANKS)
    for pod in RANKS:
        gang.launch(pod)
    await gang.wait_starts(dict.fromkeys(RANKS, 1))
    await gang.wait_acknowledged(RANKS, 0)


async def test_a_generation_bump_restarts_every_child_exactly_once(gang: GangHarness) -> None:
    await start_gang(gang)
    for pod in RANKS:
        await gang.annotate(pod, 1)
    await gang.wait_acknowledged(RANKS, 1)
    await gang.wait_starts(dict.fromkeys(RANKS, 2))
    await asyncio.sleep(2)  # nothing more happens
    await gang.wait_starts(dict.fromkeys(RANKS, 2), timeout=0)
    assert await gang.acknowledged() == dict.fromkeys(RANKS, 1)
    for pod in RANKS:
        first, second = gang.launched[pod].starts()
        assert first.pid != second.pid


async def test_two_quick_bumps_give_one_restart_to_the_newest(gang: GangHarness) -> None:
    await start_gang(gang)
    for generation in (2, 3):
        for pod in RANKS:
            await gang.annotate(pod, generation)
    await gang.wait_acknowledged(RANKS, 3)
    await gang.wait_starts(dict.fromkeys(RANKS, 2))
    await asyncio.sleep(2)
    await gang.wait_starts(dict.fromkeys(RANKS, 2), timeout=0)
    assert await gang.acknowledged() == dict.fromkeys(RANKS, 3)


async def test_the_barrier_holds_restarts_until_the_last_rank_stopped(gang: GangHarness) -> None:
    await start_gang(gang)
    early, late = RANKS[:3], RANKS[3]
    for pod in early:
        await gang.annotate(pod, 1)
    await gang.wait_acknowledged(early, 1, timeout=10)
    await asyncio.sleep(3)
    # The early ranks stopped and acknowledged; they wait for the late one and have not started again.
    await gang.wait_starts(dict.fromkeys(RANKS, 1), timeout=0)
    late_bumped = now()
    await gang.annotate(late, 1)
    await gang.wait_acknowledged(RANKS, 1)
    await gang.wait_starts(dict.fromkeys(RANKS, 2))
    late_stop = [
        float(line.split()[1])
        for line in gang.launched[late].starts_file.read_text().splitlines()
        if line.startswith("stop ")
    ]
    assert len(late_stop) == 1
    for pod in early:
        restarted = gang.launched[pod].starts()[1].at
        assert restarted > late_bumped, f"{pod} restarted before the late rank was told to restart"
        assert restarted >= late_stop[0], f"{pod} restarted before the late rank's child had stopped"


async def test_a_device_error_exit_ends_the_launcher_with_a_termination_message(gang: GangHarness) -> None:
    await gang.create_pods(["solo"], gang=None)
    log = gang.tmp / "termination-log"
    launched = gang.launch("solo", "--device-error-exit-codes", "74,79", "--termination-log", str(log), mode="exit79")

    async def returncode() -> int | None:
        return launched.proc.poll()

    code = await wait_until(returncode, lambda rc: rc is not None, timeout=30, what="the launcher exits")
    assert code == 79, launched.output()
    message = log.read_text().strip()
    assert message.startswith("device error: ") and message.endswith("exited with code 79 (declared a device error)")
    assert "trainer.py" in message


async def test_steps_are_aggregated_by_the_launcher(gang: GangHarness) -> None:
    await gang.create_pods(["stepper"])
    launched = gang.launch("stepper")
    await gang.wait_starts({"stepper": 1})
    address = launched.starts()[0].addr
    assert address.startswith("127.0.0.1:")

    async def figures() -> dict[str, object]:
        def fetch() -> dict[str, object]:
            with urllib.request.urlopen(f"http://{address}/steps", timeout=2) as resp:
                data: dict[str, object] = json.load(resp)
                return data

        return await asyncio.to_thread(fetch)

    snap = await wait_until(figures, lambda s: int(s["count"]) >= 10, timeout=20, what="10 steps reported")  # type: ignore[call-overload]
    assert isinstance(snap["last_step"], int) and snap["last_step"] >= 10
    assert isinstance(snap["mean_seconds"], float) and 0.04 <= snap["mean_seconds"] < 0.5
    assert isinstance(snap["p90_seconds"], float) and snap["p90_seconds"] >= snap["p50_seconds"]  # type: ignore[operator]
    assert isinstance(snap["steps_per_second"], float) and 1 < snap["steps_per_second"] < 25
    assert snap["generation"] == 0 and snap["restarts"] == 0
    # SIGTERM (pod deletion) reaches the child, which checkpoints and exits 0: so does the launcher.
    assert launched.stop() == 0, launched.output()
    assert launched.starts_file.read_text().splitlines()[-1].startswith("stop ")
