"""The records the controller hands a round to walk through (``CurrentRecords``): those a decision still reads
beyond their name under the current policies, as the watch delivers them; a change of policies looks again."""

from __future__ import annotations

from tests.unit.engine.builders import policy

from devheal.controller.loop import CurrentRecords
from devheal.engine.decide import LEMON_WINDOW, RecordReads
from devheal.model.plan import InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind

DAY = 24 * 3600.0
NOW = 1000 * DAY


def ended(name: str, action: ActionKind, days_ago: float) -> InFlight:
    at = NOW - days_ago * DAY
    return InFlight(name, action, TargetKind.NODE, "n1", "n1", Phase.SUCCEEDED, at - 60, finished=at)


def active(name: str, days_ago: float) -> InFlight:
    return InFlight(name, ActionKind.TAINT, TargetKind.NODE, "n1", "n1", Phase.IN_PROGRESS, NOW - days_ago * DAY)


LEMONS = RecordReads.of([policy(node={"lemonAfter": 1})])
PLAIN = RecordReads.of([policy()])

STORE = {
    r.name: r
    for r in (
        ended("taint-2h", ActionKind.TAINT, 2 / 24),
        ended("taint-10d", ActionKind.TAINT, 10),
        ended("lift-10d", ActionKind.LIFT, 10),
        ended("lift-50d", ActionKind.LIFT, 50),
        ended("lift-70d", ActionKind.LIFT, 70),
        active("taint-active-70d", 70),
    )
}


def kept(reads: RecordReads, store: dict[str, InFlight] = STORE, now: float = NOW) -> list[str]:
    current = CurrentRecords(lambda: now)
    current.refresh(store, reads, now)
    return sorted(current.items)


def test_under_lemon_policies_only_the_lifts_are_kept_for_the_lemon_window_not_every_ended_record() -> None:
    assert LEMONS.lifts == 2 * LEMON_WINDOW
    assert kept(LEMONS) == ["lift-10d", "lift-50d", "taint-2h", "taint-active-70d"]


def test_without_lemons_a_lift_is_read_for_a_day() -> None:
    assert kept(PLAIN) == ["taint-2h", "taint-active-70d"]


def test_what_the_watch_delivers_is_kept_only_while_a_decision_reads_it() -> None:
    current = CurrentRecords(lambda: NOW)
    current.refresh({}, PLAIN, NOW)
    current.changed("lift-10d", None, STORE["lift-10d"])
    current.changed("taint-2h", None, STORE["taint-2h"])
    assert sorted(current.items) == ["taint-2h"]
    current.changed("taint-2h", STORE["taint-2h"], None)  # deleted
    assert current.items == {}


def test_records_age_out_and_wider_policies_look_through_every_record_again() -> None:
    current = CurrentRecords(lambda: NOW)
    current.refresh(STORE, LEMONS, NOW)
    later = NOW + 25 * DAY  # lift-50d is now 75 days old, taint-2h more than a day
    current.refresh(STORE, LEMONS, later)
    assert sorted(current.items) == ["lift-10d", "taint-active-70d"]
    current.refresh(STORE, PLAIN, later)
    assert sorted(current.items) == ["taint-active-70d"]
    current.refresh(STORE, LEMONS, NOW)  # the lemon policy back: lift-50d is read again
    assert sorted(current.items) == ["lift-10d", "lift-50d", "taint-2h", "taint-active-70d"]


def test_before_the_first_refresh_everything_delivered_is_kept_for_it_to_judge() -> None:
    current = CurrentRecords(lambda: NOW)
    current.changed("lift-70d", None, STORE["lift-70d"])
    assert list(current.items) == ["lift-70d"]
