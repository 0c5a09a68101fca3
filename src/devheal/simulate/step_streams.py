"""Synthetic step-time streams of a training gang, as its launchers would publish them (pure, seeded).

Each rank's step takes ``base`` seconds times a noise factor drawn uniformly from
``[1 - noise, 1 + noise]``, times its slowdown while the slowdown lasts. After each step
every rank publishes what its launcher would (``StepReport``: the count, the median of its
last ``window`` steps, when it reported last). The straggler tests and ``bench.stragglers``
feed these views to the engine; the durations stand for each rank's own compute time (what
``report_step`` should measure: in synchronous training the wall time of a whole step is the
same on every rank, the slow one's included).
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from devheal.model.cluster import ClusterView, Node, Pod, Workload, WorkloadClass
from devheal.model.restarts import InPlaceRestart
from devheal.model.steps import StepReport

EPOCH = 1_900_000_000.0
"""Wall-clock seconds at step 0 (any time a launcher could write)."""


@dataclass
class GangStream:
    ranks: int = 8
    slowdown: Mapping[int, float] = field(default_factory=dict)
    """Rank index -> factor its steps take longer by, from step ``slow_from`` on."""
    slow_from: int = 0
    slow_until: int | None = None
    """The step the slowdown ends at (a fail-slow episode); None: it lasts."""
    noise: float = 0.1
    base: float = 1.0
    window: int = 10
    """Steps the published median covers (the launcher's short window)."""
    seed: int = 0
    checkpoint_every: int | None = None
    """Steps between the checkpoints the ranks report (``report_checkpoint``); None: they report none."""
    namespace: str = "train"
    name: str = "llm"

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._recent = [deque[float](maxlen=self.window) for _ in range(self.ranks)]
        self.step = 0
        self.now = EPOCH
        self.checkpoint_at: float | None = None
        self.workload = Workload(self.namespace, "JobSet", self.name, WorkloadClass.GANG)

    def pod_name(self, rank: int) -> str:
        return f"{self.name}-{rank}"

    def uid(self, rank: int) -> str:
        return f"uid-{self.name}-{rank}"

    def node_name(self, rank: int) -> str:
        return f"gpu-{rank:03d}"

    def advance(self) -> list[float]:
        """One step of every rank; returns their durations. The gang moves at its slowest rank's pace."""
        durations = []
        for rank in range(self.ranks):
            factor = 1.0 + self._rng.uniform(-self.noise, self.noise)
            if self.step >= self.slow_from and (self.slow_until is None or self.step < self.slow_until):
                factor *= self.slowdown.get(rank, 1.0)
            durations.append(self.base * factor)
        for rank, d in enumerate(durations):
            self._recent[rank].append(d)
        self.step += 1
        self.now += max(durations)
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.checkpoint_at = self.now
        return durations

    def report(self, rank: int) -> StepReport:
        recent = self._recent[rank]
        return StepReport(
            count=self.step,
            window=len(recent),
            p50=statistics.median(recent) if recent else None,
            last=self.now if self.step else None,
            run=EPOCH,
            checkpoint=self.checkpoint_at,
        )

    def view(self) -> ClusterView:
        """The cluster as the controller's cache would show it after the latest step."""
        nodes = {}
        pods = {}
        for rank in range(self.ranks):
            node = self.node_name(rank)
            nodes[node] = Node(node, f"uid-{node}", {}, True, False, (), 8, 8)
            pod = Pod(
                namespace=self.namespace,
                name=self.pod_name(rank),
                uid=self.uid(rank),
                node=node,
                phase="Running",
                labels={"devheal.io/gang": self.name},
                restart_policy="Never",
                workload=self.workload,
                gpu_request=8,
                in_place=InPlaceRestart.LAUNCHER,
                steps=self.report(rank),
            )
            pods[pod.key] = pod
        by_node = {p.node: frozenset({p.key}) for p in pods.values()}
        return ClusterView(nodes=nodes, pods=pods, pods_by_node=by_node)

    def views(self, steps: int) -> Iterator[ClusterView]:
        """``steps`` steps, the view after each."""
        for _ in range(steps):
            self.advance()
            yield self.view()
