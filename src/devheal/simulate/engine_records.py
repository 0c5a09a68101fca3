"""The Remediation records devheal keeps in the simulated fleet, indexed as a round looks them up.

The live controller's cache holds every record; a simulated round is handed only those its decisions over
the view can depend on (``RecordStore.relevant``): the active ones, those targeting the view's nodes, pods
and workloads (decided-before names), and recent ones (gang restarts per hour, the disruption interval).
Any record is found by name. An ended record of a pod or a workload that no decision reads any more beyond
its name (``RecordReads.still_read``: once it stops, it never reads it again) is only found by name: a gang's
hundreds of past restarts are not walked through at every round.
"""

from __future__ import annotations

from collections import deque

from devheal.engine.decide import RecordReads
from devheal.model.cluster import ClusterView
from devheal.model.plan import InFlight, InFlightRecords, TargetKind


class RecordStore:
    """Every record by name, with the indexes a round's look-up walks."""

    def __init__(self, keep_recent_s: float, reads: RecordReads) -> None:
        self.records: dict[str, InFlight] = {}
        self.by_node: dict[str, set[str]] = {}
        """Node name -> names of records targeting the node (pod and gang records are found by their target)."""
        self.by_target: dict[str, set[str]] = {}
        """Target -> names of its records, but the ended pod and workload records no decision reads any more."""
        self.active: set[str] = set()
        self.recent: deque[tuple[float, str]] = deque()
        """(when, name) of the decisions taken within ``keep_recent_s``, oldest first."""
        self.keep_recent_s = keep_recent_s
        self.reads = reads
        self.ending: set[str] = set()
        """Ended pod and workload records a decision may still read (checked again at each look-up)."""
        self.unread: set[str] = set()
        """... and those it no longer reads: found by name only."""
        self.version = 0
        """Counts the records kept: a look-up for the same view at the same time and version finds the same."""
        self.last: tuple[ClusterView, float, int, InFlightRecords] | None = None
        """The last look-up: for which view, at what time and version, what it found."""

    def store(self, record: InFlight) -> None:
        """Keep ``record`` (new, or a new phase of one kept)."""
        name = record.name
        self.version += 1
        self.records[name] = record
        if record.target_kind is TargetKind.NODE:
            self.by_node.setdefault(record.node, set()).add(name)
        self.by_target.setdefault(record.target, set()).add(name)
        self.unread.discard(name)
        if record.active:
            self.active.add(name)
            self.ending.discard(name)
        else:
            self.active.discard(name)
            if record.target_kind is not TargetKind.NODE:  # a node's records are read by more than decide
                self.ending.add(name)

    def decided(self, record: InFlight, now: float) -> None:
        """Keep the record of a decision just carried out: it counts as recent."""
        self.store(record)
        self.recent.append((now, record.name))

    def relevant(self, view: ClusterView, now: float) -> InFlightRecords:
        """Every record ``decide`` can depend on for ``view``, any record by name. Older records of other targets
        cannot change this view's plan (tests check this against deciding with every record over every node)."""
        last = self.last  # a round asks three times, mostly with nothing kept in between
        if last is not None and last[0] is view and last[1] == now and last[2] == self.version:
            return last[3]
        while self.recent and now - self.recent[0][0] >= self.keep_recent_s:
            self.recent.popleft()
        for name in [n for n in self.ending if not self.reads.still_read(self.records[n], now)]:
            self.ending.discard(name)
            self.unread.add(name)
            self.by_target[self.records[name].target].discard(name)
        names = set(self.active)
        none: frozenset[str] = frozenset()
        for name in view.nodes:
            names |= self.by_node.get(name, none)
        for key, pod in view.pods.items():
            names |= self.by_target.get(key, none)
            names |= self.by_target.get(pod.workload.key, none)
        names |= {name for _, name in self.recent if name not in self.unread}
        found = InFlightRecords([self.records[n] for n in sorted(names)], self.records, filtered=False)
        self.last = (view, now, self.version, found)
        return found

    def busy_nodes(self) -> set[str]:
        """Nodes an active record targets."""
        return {self.records[name].node for name in self.active}
