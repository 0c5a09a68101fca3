"""Episodes, not flaps: a node whose GPU flaps for a day gets a few records, one set per episode.

A fake-time host drives ``DecisionRound`` as the controller and the simulator do: it keeps the
node (devheal's marks, its lift count) and the records, and carries each decision out at once.
The GPU's health flaps on a fixed pattern; rounds run at every change and on a tick.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from devheal.engine.decide import (
    LEMON_WINDOW,
    MAX_FLAP_HOLD_DOWN,
    HoldDown,
    Overdue,
    RecordReads,
    decide,
    lift_hold_down,
    lift_holds,
    relevance_horizon,
)
from devheal.engine.rounds import DecisionRound, Pacing
from devheal.model.cluster import OWNED_TAINT_KEY, ClusterView, Node, Taint
from devheal.model.plan import Action, Blocked, InFlight, Phase, TargetKind
from devheal.model.policy import ActionKind, Policy

from .builders import gpu_id, node, node_recovered, policy, report, reported, view

DAY = 24 * 3600.0


@dataclass
class FlappingNode:
    """One node whose GPU 0 is unhealthy for ``bad`` seconds out of every ``bad + good``."""

    bad: float
    good: float
    node: Node = field(default_factory=lambda: node("n1"))
    records: dict[str, InFlight] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)
    """Every record name created, in order (a name made again is not a new record)."""

    def unhealthy(self, now: float) -> bool:
        return now % (self.bad + self.good) < self.bad

    def view(self, now: float) -> ClusterView:
        if not self.unhealthy(now):
            return view([self.node])
        began = now - now % (self.bad + self.good)
        return view([self.node], reports=[report("n1", reported(gpu_id("n1", 0), since=began))])

    # ---- RoundHost ----

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return set()

    def start(self, action: Action, resumed: bool) -> None:
        """Carried out at once, as the node actions do: marks set, or lifted and the lift counted on the node."""
        owned = set(self.node.owned)
        if action.kind is ActionKind.TAINT:
            owned.add("taint")
        elif action.kind is ActionKind.CORDON:
            owned.add("cordon")
        elif action.kind is ActionKind.LIFT:
            self.node = replace(self.node, lifts=self.node.lifts + 1)
            owned.clear()
        self.node = replace(self.node, owned=frozenset(owned), unschedulable="cordon" in owned)
        self._record(InFlight.of(action, Phase.SUCCEEDED, self.now))

    def _record(self, record: InFlight) -> None:
        if record.name not in self.records:
            self.made.append(record.name)
        self.records[record.name] = record

    def finish(self, record: InFlight) -> None:
        raise AssertionError("no external remediation in this policy")

    def record_blocked(self, item: Blocked) -> None:
        self._record(InFlight.of(item.action, Phase.BLOCKED, self.now))

    def hold(self, record: InFlight, why: str, rail: object = None) -> None:
        raise AssertionError(f"nothing is paused here: {why}")

    def report_overdue(self, item: Overdue) -> None:
        raise AssertionError(f"node actions have no step timeout: {item.why}")

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())

    # ---- the day ----

    now: float = 0.0

    def moments(self, until: float, tick: float) -> Iterator[float]:
        """Every health change, and a tick in between (hold-downs expire on ticks)."""
        period = self.bad + self.good
        t = 0.0
        while t < until:
            cycle = t - t % period
            changes = (cycle + self.bad, cycle + period)
            yield t
            t = min(t + tick, *(c for c in changes if c > t))

    def run(self, p: Policy, until: float = DAY, tick: float = 30.0) -> None:
        rounds = DecisionRound(Pacing(gang_restart=0.0, retry=0.0))
        for now in self.moments(until, tick):
            self.now = now
            rounds.run(self, self.view(now), [p], now)


@pytest.mark.parametrize(
    ("bad", "good"),
    [
        (3.0, 4.0),  # every few seconds, shorter than the hold-down
        (5.0, 115.0),  # healthy almost the whole hold-down each time
        (10.0, 150.0),  # healthy past the hold-down: each flap alone would be an episode
        (30.0, 900.0),  # a fault every quarter of an hour
    ],
)
def test_a_gpu_flapping_for_a_day_makes_at_most_50_records(bad: float, good: float) -> None:
    host = FlappingNode(bad, good)
    host.run(policy(node={"cordon": True}))
    assert host.made, "the flapping GPU was never acted on"
    assert len(host.made) <= 50, f"{len(host.made)} records in a day: {host.made[:6]}..."
    # Each name is one decision: the node's episode number (its lifts) names it, never a count of records.
    kinds = [host.records[n].action for n in host.made]
    assert kinds.count(ActionKind.TAINT) == kinds.count(ActionKind.LIFT) + (1 if host.node.owned else 0)


def test_a_long_flap_is_one_episode() -> None:
    """Every few seconds for a day: the node is never healthy for the hold-down, so it is never lifted."""
    host = FlappingNode(3.0, 4.0)
    host.run(policy(node={"cordon": True}))
    assert sorted(host.records[n].action for n in host.made) == sorted([ActionKind.TAINT, ActionKind.CORDON])
    assert host.node.lifts == 0 and host.node.owned == {"taint", "cordon"}


def lifted(at: float) -> InFlight:
    return InFlight(f"lift-{at}", ActionKind.LIFT, TargetKind.NODE, "n1", "n1", Phase.SUCCEEDED, at, finished=at)


def test_each_lift_within_a_day_doubles_the_next_hold_down_up_to_four_hours() -> None:
    rules = policy(node={"holdDown": 120}).node
    now = 10 * DAY
    assert lift_hold_down(rules, "n1", [], now) == 120
    assert lift_hold_down(rules, "n1", [lifted(now - 600)], now) == 240
    assert lift_hold_down(rules, "n1", [lifted(now - 600), lifted(now - 3600)], now) == 480
    assert lift_hold_down(rules, "n1", [lifted(now - i * 60) for i in range(1, 40)], now) == MAX_FLAP_HOLD_DOWN


def test_only_recent_succeeded_lifts_of_the_node_lengthen_the_hold_down() -> None:
    rules = policy(node={"holdDown": 120}).node
    now = 10 * DAY
    old = lifted(now - DAY - 1)
    failed = replace(lifted(now - 60), phase=Phase.FAILED)
    elsewhere = replace(lifted(now - 60), node="n2", target="n2")
    assert lift_hold_down(rules, "n1", [old, failed, elsewhere], now) == 120


def test_a_policy_hold_down_longer_than_the_cap_is_kept() -> None:
    rules = policy(node={"holdDown": 6 * 3600}).node
    assert lift_hold_down(rules, "n1", [lifted(DAY - 60)], DAY) == 6 * 3600


def test_a_node_lifted_lemon_after_times_within_30_days_stays_out_30_days_after_its_next_fault() -> None:
    lemons = policy(node={"holdDown": 120, "lemonAfter": 1}).node
    now = 100 * DAY
    recovered = now - 600
    # Lifted 20 days before it recovered from its next fault: a lemon, kept out for 30 days of health.
    assert lift_hold_down(lemons, "n1", [lifted(recovered - 20 * DAY)], now, recovered) == LEMON_WINDOW
    # The count is taken when it became healthy: the wait does not shorten as that lift ages.
    later = recovered + 15 * DAY
    assert lift_hold_down(lemons, "n1", [lifted(recovered - 20 * DAY)], later, recovered) == LEMON_WINDOW
    # A lift more than 30 days before: an ordinary node; and without lemonAfter nothing changes.
    assert lift_hold_down(lemons, "n1", [lifted(recovered - 31 * DAY)], now, recovered) == 120
    plain = policy(node={"holdDown": 120}).node
    assert lift_hold_down(plain, "n1", [lifted(recovered - 20 * DAY)], now, recovered) == 120


def test_lifts_a_lemon_count_reads_are_kept_for_60_days_where_a_policy_counts_lemons() -> None:
    """A lift counts if it came within 30 days before the node became healthy, until it has been healthy 30 days."""
    old = lifted(DAY)
    with_lemons = RecordReads.of([policy(node={"lemonAfter": 2})])
    without = RecordReads.of([policy()])
    assert with_lemons.still_read(old, DAY + 59 * DAY) and not without.still_read(old, DAY + 20 * DAY)
    assert not with_lemons.still_read(old, DAY + 61 * DAY)
    assert relevance_horizon([policy(node={"lemonAfter": 2})]) == 2 * LEMON_WINDOW


DEVHEAL_TAINT = Taint(OWNED_TAINT_KEY, "true", "NoSchedule")


def recovered_view(owned: bool = True) -> ClusterView:
    """n1, healthy again, with devheal's taint on it (``owned``), or never marked by devheal."""
    if not owned:
        return view([node("n1")])
    return view([replace(node("n1", owned=["taint"]), taints=(DEVHEAL_TAINT,))])


def test_a_healthy_node_kept_for_its_hold_down_is_a_lift_hold_until_the_lift_comes_due() -> None:
    ps = [policy(node={"holdDown": "2m"})]
    since = 10 * DAY
    finding = node_recovered("n1", since=since)
    [hold] = lift_holds(recovered_view(), [finding], ps, [], since + 60)
    assert (hold.node, hold.since, hold.until, hold.hold_down) == ("n1", since, since + 120, HoldDown(120))
    assert hold.message() == (
        "healthy since 1970-01-11T00:00:00Z; devheal keeps its marks until 1970-01-11T00:02:00Z (hold-down 2m)"
    )
    # Due: decide lifts it, no hold is left; nor is one for a node devheal did not mark.
    assert lift_holds(recovered_view(), [finding], ps, [], since + 120) == []
    assert decide(recovered_view(), [finding], ps, [], since + 120).actions[0].kind is ActionKind.LIFT
    assert lift_holds(recovered_view(owned=False), [finding], ps, [], since + 60) == []


def test_a_flapping_node_and_a_lemon_say_why_they_are_held_longer() -> None:
    since = 100 * DAY
    finding = node_recovered("n1", since=since)
    [flapping] = lift_holds(
        recovered_view(), [finding], [policy(node={"holdDown": "2m"})], [lifted(since - 600)], since
    )
    assert (flapping.hold_down, flapping.until) == (HoldDown(240, lifts=1), since + 240)
    assert flapping.message().endswith("(hold-down 4m: doubled for each of its 1 lift(s) within the last day)")
    lemons = [policy(node={"holdDown": "2m", "lemonAfter": 1})]
    [lemon] = lift_holds(recovered_view(), [finding], lemons, [lifted(since - 20 * DAY)], since + 15 * DAY)
    assert lemon.hold_down == HoldDown(LEMON_WINDOW, lifts=1, lemon_after=1)
    assert lemon.until == since + LEMON_WINDOW
    assert "(hold-down 720h: a lemon, devheal lifted its marks 1 time(s) within 720h before it became healthy, " in (
        lemon.message()
    )
    assert lemon.message().endswith(
        "no workload lands on it meanwhile; to put it back sooner, remove devheal's marks and its annotation "
        "devheal.io/owns)"
    )


def test_a_node_a_person_took_devheals_marks_off_is_not_said_held() -> None:
    """Someone put the node back by hand (removed devheal's taint, or uncordoned it): nothing is held any more,
    though ``devheal.io/owns`` still lists the mark until the lift comes due or they remove it too."""
    ps = [policy(node={"holdDown": "2m"})]
    finding = node_recovered("n1", since=DAY)
    untainted = view([node("n1", owned=["taint"])])
    assert lift_holds(untainted, [finding], ps, [], DAY + 60) == []
    cordoned = view([node("n1", owned=["cordon"], unschedulable=True)])
    assert [h.node for h in lift_holds(cordoned, [finding], ps, [], DAY + 60)] == ["n1"]
    uncordoned = view([node("n1", owned=["cordon"])])
    assert lift_holds(uncordoned, [finding], ps, [], DAY + 60) == []
    someone_elses = view([replace(node("n1", owned=["taint"]), taints=(Taint(OWNED_TAINT_KEY, "x", "NoExecute"),))])
    assert lift_holds(someone_elses, [finding], ps, [], DAY + 60) == [], "a taint of the key but not devheal's"


def test_no_lift_hold_while_a_remediation_of_the_node_is_under_way() -> None:
    ps = [policy(node={"holdDown": "2m"})]
    finding = node_recovered("n1", since=DAY)
    busy = replace(lifted(DAY), name="taint-n1", action=ActionKind.TAINT, phase=Phase.IN_PROGRESS, finished=None)
    assert lift_holds(recovered_view(), [finding], ps, [busy], DAY + 60) == []
