"""What the controller's watch handlers tell its rounds (``ChangedNodes``): the nodes whose Node, NodeDevices or pods
changed, or None (look at every node) at the first round, after a relist, a failed round or a new leader, and
every ``full_round_every`` seconds."""

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


def test_a_relist_a_new_leader_and_the_period_make_a_full_round() -> None:
    changed = settled()
    assert changed.take(1.0, EVERY, relists=2) is None  # a reflector listed again
    changed.round_done()
    changed.forget()  # leadership came back
    assert changed.take(2.0, EVERY, relists=2) is None
    changed.round_done()
    assert changed.take(3.0, EVERY, relists=2) == frozenset()
    changed.round_done()
    assert changed.take(2.0 + EVERY, EVERY, relists=2) is None  # the safety net
    changed.round_done()
    assert changed.take(3.0 + EVERY, 0.0, relists=2) is None  # 0: every round is full
