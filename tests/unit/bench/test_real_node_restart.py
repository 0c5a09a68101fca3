"""bench.real_node_restart --workload torch reads a restart's milestones from the ranks' events."""

from __future__ import annotations

from typing import Any

from bench.real_node_restart import recovery


def _run(rank: int, run: str, started: float, joined: float, resumed: float, stepped: float) -> list[dict[str, Any]]:
    return [
        {"t": started + 2.0, "event": "start", "rank": rank, "pid": 1, "run": run, "process_started": started},
        {"t": joined, "event": "joined", "rank": rank, "pid": 1, "run": run},
        {"t": resumed, "event": "resumed", "rank": rank, "pid": 1, "run": run, "step": 41},
        {"t": stepped, "event": "step", "rank": rank, "pid": 1, "run": run, "step": 41},
        {"t": stepped + 0.1, "event": "step", "rank": rank, "pid": 1, "run": run, "step": 42},
    ]


def test_each_milestone_is_when_the_last_rank_reached_it_after_the_restart() -> None:
    old = _run(0, "old0", 1.0, 5.0, 6.0, 7.0) + _run(1, "old1", 1.0, 5.0, 6.0, 7.0)
    new = _run(0, "new0", 101.0, 106.0, 107.0, 108.0) + _run(1, "new1", 102.0, 105.0, 107.5, 108.5)
    found = recovery(old + new, 2, since=100.0)
    assert found is not None
    assert found["milestones"] == {
        "process started": 2.0,
        "torch imported": 4.0,
        "joined": 6.0,
        "resumed": 7.5,
        "stepping": 8.5,
    }
    assert found["seconds"] == 8.5
    assert found["resumed_at"] == [41, 41]
    assert found["runs"] == ["new0", "new1"]


def test_a_rank_not_stepping_again_yet_means_no_recovery() -> None:
    events = _run(0, "old0", 1.0, 5.0, 6.0, 7.0) + _run(1, "old1", 1.0, 5.0, 6.0, 7.0)
    events += _run(0, "new0", 101.0, 106.0, 107.0, 108.0)
    events.append({"t": 104.0, "event": "start", "rank": 1, "pid": 1, "run": "new1", "process_started": 102.0})
    assert recovery(events, 2, since=100.0) is None


def test_a_run_that_died_before_stepping_is_passed_over_for_the_one_that_stepped() -> None:
    died = [{"t": 103.0, "event": "start", "rank": 1, "pid": 1, "run": "died", "process_started": 101.0}]
    events = _run(0, "new0", 101.0, 110.0, 111.0, 112.0) + died + _run(1, "new1", 104.0, 110.0, 111.0, 112.5)
    found = recovery(events, 2, since=100.0)
    assert found is not None
    assert found["runs"] == ["new0", "new1"]
    assert found["milestones"]["process started"] == 4.0
