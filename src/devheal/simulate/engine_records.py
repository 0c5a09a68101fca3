"""The Remediation records devheal keeps in the simulated fleet, indexed as a round looks them up.

The live controller's cache holds every record; a simulated round is handed only those its decisions over
the view can depend on (``RecordStore.relevant``): the active ones, those targeting the view's nodes, pods
and workloads (decided-before names), and recent ones (gang restarts per hour, the disruption interval).
"""

from __future__ import annotations

from collections import deque

from devheal.model.cluster import ClusterView
from devheal.model.plan import InFlight, TargetKind


class RecordStore:
    """Every record by name, with the indexes a round's look-up walks."""

    def __init__(self, keep_recent_s: float) -> None:
        self.records: dict[str, InFlight] = {}
        self.by_node: dict[str, set[str]] = {}
        """Node name -> names of records targeting the node (pod and gang records are found by their target)."""
        self.by_target: dict[str, set[str]] = {}
        self.active: set[str] = set()
        self.recent: deque[tuple[float, str]] = deque()
        """(when, name) of the decisions taken within ``keep_recent_s``, oldest first."""
        self.keep_recent_s = keep_recent_s

    def store(self, record: InFlight) -> None:
        """Keep ``record`` (new, or a new phase of one kept)."""
        self.records[record.name] = record
        if record.target_kind is TargetKind.NODE:
            self.by_node.setdefault(record.node, set()).add(record.name)
        self.by_target.setdefault(record.target, set()).add(record.name)
        if record.active:
            self.active.add(record.name)
        else:
            self.active.discard(record.name)

    def decided(self, record: InFlight, now: float) -> None:
        """Keep the record of a decision just carried out: it counts as recent."""
        self.store(record)
        self.recent.append((now, record.name))

    def relevant(self, view: ClusterView, now: float) -> list[InFlight]:
        """Every record ``decide`` can depend on for ``view``. Older records of other targets cannot change this
        view's plan (tests check this against deciding with every record over every node)."""
        while self.recent and now - self.recent[0][0] >= self.keep_recent_s:
            self.recent.popleft()
        names = set(self.active)
        for name in view.nodes:
            names |= self.by_node.get(name, set())
        for pod in view.pods.values():
            names |= self.by_target.get(pod.key, set())
            names |= self.by_target.get(pod.workload.key, set())
        names |= {name for _, name in self.recent}
        return [self.records[n] for n in sorted(names)]

    def busy_nodes(self) -> set[str]:
        """Nodes an active record targets."""
        return {self.records[name].node for name in self.active}
