"""Why a healthy node stays marked, said on the node: an Event ``DevhealLiftHeld`` once per hold.

A node devheal marked keeps its taint or cordon for its hold-down after it becomes healthy
again (``devheal.engine.decide.hold_down_of``): the policy's ``holdDown``, doubled for each
lift within the last day, or 30 days for a lemon (``node.lemonAfter``). Nothing is in
progress meanwhile, so no Remediation says so; a person who finds a healthy node tainted
reads the reason and the end in ``kubectl describe node``: a Normal Event on the Node, written
once when the hold begins and again when its end moves (a record of a lift read anew, a
policy changed). ``devheal_nodes_held{why}`` counts the nodes held now.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping

from devheal.controller import metrics
from devheal.controller.events import EventRecorder
from devheal.engine.decide import LiftHold
from devheal.model.cluster import Node

HELD_EVENT = "DevhealLiftHeld"
"""The Event reason on a Node devheal keeps marked for its hold-down."""


class LiftHoldReports:
    """Remembers the holds already said; ``check`` returns the Event writes for new ones and sets the gauge."""

    def __init__(self, events: EventRecorder) -> None:
        self.events = events
        self.said: dict[str, float] = {}
        """Node -> the end of its hold last said."""

    def check(
        self, holds: Iterable[LiftHold], nodes: Mapping[str, Node]
    ) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """(work-queue key, Event write) for each hold not said yet, or whose end moved."""
        out: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        now_held: dict[str, float] = {}
        lemons = 0
        for hold in holds:
            now_held[hold.node] = hold.until
            lemons += 1 if hold.hold_down.lemon_after else 0
            node = nodes.get(hold.node)
            if node is None or self.said.get(hold.node) == hold.until:
                continue
            out.append((f"lift-held/{hold.node}", functools.partial(self._event, node, hold)))
        self.said = now_held
        metrics.NODES_HELD.labels(why="lemon").set(lemons)
        metrics.NODES_HELD.labels(why="hold-down").set(len(now_held) - lemons)
        return out

    async def _event(self, node: Node, hold: LiftHold) -> None:
        involved = {"kind": "Node", "name": node.name, "uid": node.uid, "apiVersion": "v1"}
        await self.events.record(involved, HELD_EVENT, hold.message())
