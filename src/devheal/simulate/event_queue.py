"""The event queue of the discrete-event loop: a heap ordered by time, then by insertion.

Kept apart from the model so its two promises are easy to test: time never goes back
(an event scheduled in the past is an error, not a silent reorder), and no event is lost
(every pushed event is either popped or handed back as left over past the horizon).
"""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import NamedTuple


class EventKind(IntEnum):
    FAULT = 1
    """A fault from the trace hits a node (``ref``: index in the trace)."""
    SIGNAL = 2
    """A strategy's own signal fires (``ref``: strategy-defined)."""
    TRANSIENT_RELEASE = 3
    """A crashed or hung job is torn down by its own controller (``ref``: fault index)."""
    EVICT = 4
    """Kubernetes evicts the pods of a NotReady node (``ref``: fault index)."""
    HUMAN = 5
    """An on-call engineer acts on a fault (``ref``: fault index)."""
    SDC_DETECTED = 6
    """The training job notices silent data corruption (``ref``: fault index)."""
    REPAIR_DONE = 7
    """A node's reboot, repair or replacement finishes (``ref``: repair token)."""
    RESTART_DONE = 8
    """A workload's restart finishes (``target``: unit id, ``ref``: restart token)."""
    STRAGGLER_CHECK = 9
    """People look at a training gang's slow members (``target``: unit id)."""
    STRAGGLER_SWAP = 10
    """Slow members are swapped out at a checkpoint (``target``: unit id)."""
    JOB_FAILED = 11
    """A gang's rank failed on its GPU and the gang's Job controller recreates its pods (``ref``: fault index)."""
    RESTALL = 12
    """A gang that restarted on a node with a hidden fault stalls again (``ref``: fault index)."""
    RENDEZVOUS = 13
    """A gang's restarted processes reach their rendezvous (``target``: unit id, ``ref``: restart token): a member
    cut off from its peers keeps every rank there."""
    SLOW_START = 14
    """A fail-slow episode begins on a node (``target``: node, ``ref``: index in the trace's episodes)."""
    SLOW_END = 15
    """A fail-slow episode ends: the node runs at its own pace again (``target``: node, ``ref``: episode)."""


class Event(NamedTuple):
    time: float
    seq: int
    kind: EventKind
    target: int
    """A node index, or a unit id for workload events."""
    ref: int


class TimeWentBack(RuntimeError):
    """An event was scheduled before the current time: a bug in the model."""


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0
        self.now = 0.0
        self.pushed = 0
        self.popped = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, kind: EventKind, target: int = -1, ref: int = 0) -> None:
        if time < self.now:
            raise TimeWentBack(f"{kind.name} scheduled at {time:.3f}s, before now ({self.now:.3f}s)")
        heapq.heappush(self._heap, Event(time, self._seq, kind, target, ref))
        self._seq += 1
        self.pushed += 1

    def pop(self, until: float) -> Event | None:
        """The next event at or before ``until``, advancing ``now``; None when there is none."""
        if not self._heap or self._heap[0].time > until:
            return None
        event = heapq.heappop(self._heap)
        self.popped += 1
        self.now = event.time
        return event

    def left_over(self) -> list[Event]:
        """Events still queued (after the horizon), in order; the queue keeps them."""
        return sorted(self._heap)
