"""What the controller's watch handlers tell its rounds (``ChangedNodes``): the nodes whose Node, NodeDevices or pods
changed, or None (look at every node) at the first round, after a relist, a failed round or a new leader; and a
slice of the fleet at each round, so that every node is judged again every ``full_round_every`` seconds."""

from __future__ import annotations

from dataclasses import replace

from tests.unit.engine.builders import node, pod

from devheal.controller.loop import ChangedNodes
from devheal.model.cluster import NodeDevicesReport

EVERY = 60.0


def settled(now: float = 0.0) -> ChangedNodes:
    """After a first, full round."""
    changed = ChangedNodes()
    assert changed.take(now, EVERY, relists=1) is None
    changed.round_done()
    return changed


def test_the_first_round_looks_at_every_node() -> None:
    assert ChangedNodes().take(0.0, EVERY, relists=0) is None


def test_a_pod_marks_its_old_and_its_new_node_a_node_and_a_report_their_own() -> None:
    changed = settled()
    moved = pod("p", "n1")
    changed.pod("default/p", moved, replace(moved, node="n2"))
    changed.pod("default/q", None, pod("q", ""))  # unscheduled: no node
    changed.node("n3", None, node("n3"))
    changed.report("n4", None, NodeDevicesReport("n4", ()))
    assert changed.take(1.0, EVERY, relists=1) == {"n1", "n2", "n3", "n4"}
    changed.round_done()
    assert changed.take(2.0, EVERY, relists=1) == frozenset()  # taken once


def test_a_round_that_failed_leaves_the_next_one_full() -> None:
    changed = settled()
    changed.node("n1", None, node("n1"))
    assert changed.take(1.0, EVERY, relists=1) == {"n1"}
    # no round_done: the round raised, and what it was told is gone with it
    assert changed.take(2.0, EVERY, relists=1) is None


def test_a_relist_and_a_new_leader_make_a_full_round() -> None:
    changed = settled()
    assert changed.take(1.0, EVERY, relists=2) is None  # a reflector listed again
    changed.round_done()
    changed.forget()  # leadership came back
    assert changed.take(2.0, EVERY, relists=2) is None
    changed.round_done()
    assert changed.take(2.0, EVERY, relists=2) == frozenset()
    changed.round_done()
    assert changed.take(3.0 + EVERY, 0.0, relists=2) is None  # 0: every round is full


FLEET = [f"n{i:03d}" for i in range(120)]


def test_every_node_is_judged_again_within_the_period_a_slice_per_round() -> None:
    """No round is full after the first: each is handed its share of the fleet for the time since the last."""
    changed = settled()
    seen: set[str] = set()
    now = 0.0
    while now < EVERY:
        now += 1.5
        got = changed.take(now, EVERY, relists=1, fleet=lambda: FLEET)
        changed.round_done()
        assert got is not None, "the safety net is a sweep, not a full round"
        assert len(got) == 3, "1.5 s of 60 s: a fortieth of 120 nodes"
        seen |= got
    assert seen == set(FLEET)
    assert changed.take(now + 0.01, EVERY, relists=1, fleet=lambda: FLEET) == {FLEET[-1]}, "a new pass: at least one"


def test_the_sweep_carries_the_changed_nodes_too_and_reads_the_fleet_once_a_pass() -> None:
    reads = []

    def fleet() -> list[str]:
        reads.append(1)
        return FLEET[:4]

    changed = settled()
    changed.node("new", None, node("new"))
    assert changed.take(EVERY / 2, EVERY, relists=1, fleet=fleet) == {"new", "n002", "n003"}
    changed.round_done()
    assert changed.take(EVERY, EVERY, relists=1, fleet=fleet) == {"n000", "n001"}
    changed.round_done()
    assert len(reads) == 1
    assert changed.take(EVERY * 2, EVERY, relists=1, fleet=fleet) == set(FLEET[:4])  # a late round: the whole share
    assert len(reads) == 2
