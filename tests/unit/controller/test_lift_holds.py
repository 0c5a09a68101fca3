"""What the controller says of healthy nodes it keeps marked: once per hold, again when its end moves."""

from __future__ import annotations

from typing import cast

from prometheus_client import REGISTRY

from devheal.controller.events import EventRecorder
from devheal.controller.lift_holds import LiftHoldReports
from devheal.engine.decide import LEMON_WINDOW, HoldDown, LiftHold
from devheal.model.cluster import Node


def node(name: str) -> Node:
    return Node(
        name=name,
        uid=f"uid-{name}",
        labels={},
        ready=True,
        unschedulable=False,
        taints=(),
        gpu_capacity=8,
        gpu_allocatable=8,
    )


NODES = {n: node(n) for n in ("n1", "n2")}


def held(why: str) -> float | None:
    return REGISTRY.get_sample_value("devheal_nodes_held", {"why": why})


def test_a_hold_is_said_once_again_when_its_end_moves_and_the_held_nodes_are_counted() -> None:
    reports = LiftHoldReports(cast(EventRecorder, None))  # no write is made here: ``check`` only plans them
    plain, lemon = LiftHold("n1", 100.0, HoldDown(120)), LiftHold("n2", 50.0, HoldDown(LEMON_WINDOW, 1, 1))
    assert [key for key, _ in reports.check([plain, lemon], NODES)] == ["lift-held/n1", "lift-held/n2"]
    assert (held("hold-down"), held("lemon")) == (1, 1)
    assert reports.check([plain, lemon], NODES) == []
    doubled = LiftHold("n1", 100.0, HoldDown(240, 1))
    assert [key for key, _ in reports.check([doubled], NODES)] == ["lift-held/n1"]
    assert (held("hold-down"), held("lemon")) == (1, 0)
    # A node no longer held, then held again: said again.
    assert reports.check([], NODES) == [] and held("hold-down") == 0
    assert [key for key, _ in reports.check([doubled], NODES)] == ["lift-held/n1"]
    # A node gone from the cache is counted, not written about.
    assert reports.check([LiftHold("gone", 0.0, HoldDown(120))], NODES) == [] and held("hold-down") == 1
