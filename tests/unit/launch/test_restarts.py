"""The launcher's restart state machine, driven by hand with a fake clock."""

from __future__ import annotations

import pytest

from devheal.launch.restarts import (
    LAUNCHER_GENERATION_ANNOTATION,
    RESTART_GENERATION_ANNOTATION,
    SIGTERM_EXIT_CODE,
    Acknowledge,
    Exit,
    Phase,
    PublishFailure,
    RestartCycle,
    StartChild,
    StopChild,
    acknowledgements,
    parse_generation,
    pod_view,
)

GANG = "devheal.io/gang"


def running_cycle(generation: int = 0, timeout: float = 120.0) -> RestartCycle:
    cycle = RestartCycle(timeout)
    assert cycle.generation_seen(generation, 0.0) == [Acknowledge(generation)]
    return cycle


def test_first_generation_is_adopted_and_acknowledged_without_a_restart() -> None:
    cycle = RestartCycle(120)
    assert cycle.generation_seen(7, 0.0) == [Acknowledge(7)]
    assert cycle.phase is Phase.RUNNING and cycle.running == 7 and cycle.restarts == 0
    assert cycle.generation_seen(7, 1.0) == []
    assert cycle.generation_seen(3, 1.0) == [], "a lower generation is ignored"


def test_a_bump_stops_acknowledges_waits_and_starts_once() -> None:
    cycle = running_cycle()
    assert cycle.generation_seen(1, 10.0) == [StopChild(1)]
    assert cycle.phase is Phase.STOPPING
    assert cycle.child_exited(143, 11.0) == [Acknowledge(1)]
    assert cycle.phase is Phase.BARRIER
    assert cycle.members_seen({"a": 1, "b": 0}, 11.5) == []
    assert cycle.lagging() == ("b",)
    assert cycle.members_seen({"a": 1, "b": 1}, 12.0) == [StartChild(1)]
    assert cycle.phase is Phase.RUNNING and cycle.running == 1 and cycle.restarts == 1
    assert cycle.members_seen({"a": 1, "b": 1}, 12.0) == [], "no second start"


def test_bumps_while_stopping_give_one_restart_to_the_newest_generation() -> None:
    cycle = running_cycle()
    assert cycle.generation_seen(2, 0.0) == [StopChild(2)]
    assert cycle.generation_seen(3, 0.1) == []
    assert cycle.generation_seen(3, 0.2) == []
    assert cycle.child_exited(143, 0.5) == [Acknowledge(3)]
    assert cycle.members_seen({"a": 2, "b": 3}, 0.6) == []
    assert cycle.members_seen({"a": 3, "b": 3}, 0.7) == [StartChild(3)]
    assert cycle.restarts == 1


def test_a_bump_at_the_barrier_acknowledges_the_newer_generation_and_waits_for_it() -> None:
    cycle = running_cycle(timeout=10)
    cycle.generation_seen(1, 0.0)
    cycle.child_exited(143, 1.0)
    assert cycle.members_seen({"a": 1, "b": 0}, 2.0) == []
    assert cycle.generation_seen(2, 5.0) == [Acknowledge(2)]
    assert cycle.deadline == 15.0, "a new generation gets a full barrier timeout"
    assert cycle.members_seen({"a": 1, "b": 1}, 6.0) == [], "acknowledging the old generation is not enough"
    assert cycle.members_seen({"a": 2, "b": 2}, 7.0) == [StartChild(2)]


def test_barrier_waits_for_the_first_view_of_the_gang() -> None:
    cycle = running_cycle()
    cycle.generation_seen(1, 0.0)
    assert cycle.child_exited(143, 1.0) == [Acknowledge(1)], "members unknown: no start yet"
    assert cycle.phase is Phase.BARRIER


def test_members_seen_before_the_barrier_do_not_count() -> None:
    cycle = running_cycle()
    assert cycle.members_seen({"a": 5}, 0.0) == []
    cycle.generation_seen(1, 0.0)
    assert cycle.child_exited(143, 1.0) == [Acknowledge(1)]


def test_barrier_timeout_starts_anyway_naming_the_laggards() -> None:
    cycle = running_cycle(timeout=30)
    cycle.generation_seen(1, 100.0)
    cycle.child_exited(143, 101.0)
    cycle.members_seen({"a": 1, "b": 0, "c": 0}, 102.0)
    assert cycle.tick(130.9) == []
    assert cycle.tick(131.0) == [StartChild(1, barrier_timed_out=True, lagging=("b", "c"))]
    assert cycle.phase is Phase.RUNNING
    assert cycle.tick(500.0) == []


def test_barrier_timeout_without_any_view_of_the_gang() -> None:
    cycle = running_cycle(timeout=5)
    cycle.generation_seen(1, 0.0)
    cycle.child_exited(143, 0.0)
    (start,) = cycle.tick(5.0)
    assert isinstance(start, StartChild) and start.barrier_timed_out


def test_zero_barrier_timeout_starts_at_once() -> None:
    cycle = running_cycle(timeout=0)
    cycle.generation_seen(1, 0.0)
    assert cycle.child_exited(143, 3.0) == [
        Acknowledge(1),
        StartChild(1, barrier_timed_out=True, lagging=("(gang not seen)",)),
    ]


def test_child_exiting_by_itself_ends_the_launcher_with_its_code() -> None:
    cycle = running_cycle()
    assert cycle.child_exited(79, 5.0) == [Exit(79, by_itself=True)]
    assert cycle.phase is Phase.DONE
    assert cycle.generation_seen(4, 6.0) == []


def test_child_exiting_before_the_pod_was_seen_still_ends_the_launcher() -> None:
    cycle = RestartCycle(120)
    assert cycle.child_exited(0, 1.0) == [Exit(0, by_itself=True)]


def test_terminate_while_running_stops_the_child_and_exits_with_its_code() -> None:
    cycle = running_cycle(3)
    assert cycle.terminate() == [StopChild(3)]
    assert cycle.generation_seen(4, 1.0) == [], "no restart once terminating"
    assert cycle.child_exited(143, 2.0) == [Exit(143, by_itself=False)]


def test_terminate_while_stopping_waits_for_the_child() -> None:
    cycle = running_cycle()
    cycle.generation_seen(1, 0.0)
    assert cycle.terminate() == []
    assert cycle.child_exited(0, 1.0) == [Exit(0, by_itself=False)]


def test_terminate_at_the_barrier_exits_at_once() -> None:
    cycle = running_cycle()
    cycle.generation_seen(1, 0.0)
    cycle.child_exited(143, 0.0)
    assert cycle.terminate() == [Exit(SIGTERM_EXIT_CODE, by_itself=False)]


def test_negative_barrier_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="barrier_timeout"):
        RestartCycle(-1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0), ("0", 0), ("12", 12), (" 3 ", 3), ("-1", None), ("x", None), ("1.5", None), (4, None)],
)
def test_parse_generation(value: object, expected: int | None) -> None:
    assert parse_generation(value) == expected


def test_pod_view_and_acknowledgements_skip_ended_and_terminating_pods() -> None:
    def pod(name: str, ack: str | None, phase: str = "Running", deleting: bool = False) -> dict[str, object]:
        meta: dict[str, object] = {
            "name": name,
            "labels": {GANG: "g1"},
            "annotations": {
                RESTART_GENERATION_ANNOTATION: "2",
                **({LAUNCHER_GENERATION_ANNOTATION: ack} if ack else {}),
            },
        }
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "status": {"phase": phase}}

    views = [
        pod_view(pod("a", "2"), GANG),
        pod_view(pod("b", None, phase="Pending"), GANG),
        pod_view(pod("c", "1", phase="Succeeded"), GANG),
        pod_view(pod("d", "1", phase="Failed"), GANG),
        pod_view(pod("e", "1", deleting=True), GANG),
        pod_view(pod("f", "bogus"), GANG),
    ]
    assert views[0].gang == "g1" and views[0].restart_generation == 2 and views[0].launcher_generation == 2
    assert acknowledgements(views) == {"a": 2, "b": 0, "f": 0}
    assert pod_view({"metadata": {"name": "x"}}, GANG).gang is None


# ---- a failed run held for a restart (--hold-failed) ----------------------------------------------


def test_without_a_hold_a_failed_child_ends_the_launcher_at_once() -> None:
    cycle = running_cycle(2)
    assert cycle.child_exited(1, 5.0) == [Exit(1, by_itself=True)]
    assert cycle.phase is Phase.DONE


def test_a_held_failed_run_is_published_and_restarted_in_place_by_a_higher_generation() -> None:
    cycle = RestartCycle(120, hold_failed=60)
    assert cycle.generation_seen(2, 0.0) == [Acknowledge(2)]
    assert cycle.child_exited(137, 5.0) == [PublishFailure(137, 2)]
    assert cycle.phase is Phase.HOLDING and cycle.deadline == 65.0
    assert cycle.tick(64.9) == []
    assert cycle.generation_seen(2, 10.0) == [], "its own generation again: still holding"
    assert cycle.generation_seen(3, 10.0) == [Acknowledge(3)], "no child to stop: straight to the barrier"
    assert cycle.phase is Phase.BARRIER and cycle.deadline == 130.0
    assert cycle.members_seen({"a": 3, "b": 3}, 11.0) == [StartChild(3)]
    assert cycle.phase is Phase.RUNNING and cycle.running == 3 and cycle.restarts == 1
    assert cycle.failed is None
    assert cycle.tick(70.0) == [], "the hold is over"


def test_a_held_failed_run_exits_with_its_code_when_no_restart_comes_within_the_hold() -> None:
    cycle = RestartCycle(120, hold_failed=60)
    cycle.generation_seen(0, 0.0)
    assert cycle.child_exited(79, 5.0) == [PublishFailure(79, 0)]
    assert cycle.tick(65.0) == [Exit(79, by_itself=True)]
    assert cycle.phase is Phase.DONE
    assert cycle.generation_seen(1, 66.0) == [], "too late"


def test_sigterm_while_holding_exits_at_once_with_the_failed_runs_code() -> None:
    cycle = RestartCycle(120, hold_failed=60)
    cycle.generation_seen(4, 0.0)
    cycle.child_exited(79, 1.0)
    assert cycle.terminate() == [Exit(79, by_itself=True)]
    assert cycle.phase is Phase.DONE


def test_exit_code_zero_is_never_held() -> None:
    cycle = RestartCycle(120, hold_failed=60)
    cycle.generation_seen(0, 0.0)
    assert cycle.child_exited(0, 1.0) == [Exit(0, by_itself=True)]


def test_a_failure_before_the_pod_was_seen_is_published_with_the_first_generation_seen() -> None:
    cycle = RestartCycle(120, hold_failed=60)
    assert cycle.child_exited(1, 0.5) == []
    assert cycle.phase is Phase.HOLDING
    assert cycle.generation_seen(5, 1.0) == [Acknowledge(5), PublishFailure(1, 5)]
    assert cycle.phase is Phase.HOLDING
    assert cycle.generation_seen(6, 2.0) == [Acknowledge(6)]
    assert cycle.phase is Phase.BARRIER


def test_a_restart_asked_while_holding_waits_at_the_barrier_and_can_time_out() -> None:
    cycle = RestartCycle(10, hold_failed=60)
    cycle.generation_seen(0, 0.0)
    cycle.child_exited(1, 1.0)
    assert cycle.generation_seen(1, 2.0) == [Acknowledge(1)]
    assert cycle.tick(12.0) == [StartChild(1, barrier_timed_out=True, lagging=("(gang not seen)",))]


def test_a_negative_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="hold_failed"):
        RestartCycle(10, hold_failed=-1)
