"""Soak: two hours of fake time of random GPU faults through the engine's decision round.

A fake-time host drives ``DecisionRound`` as the controller does: 16 GPU nodes, an inference
pod on each holding GPU 0; at random times (seeded) a node's GPU fails (its agent reports it,
the pod's status shows it) and later recovers. The host carries every decision out at once
(marks set or lifted, pods descheduled and recreated elsewhere) and applies retention every
5 minutes as the controller's leader does. What must hold all along: every failing GPU is
acted on, records stay within retention, and the round's own memory does not grow with time.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from devheal.engine.decide import Overdue, RecordReads
from devheal.engine.retention import expired
from devheal.engine.rounds import DecisionRound, Pacing
from devheal.model.cluster import ClusterView, DeviceHealth, Node, Pod, WorkloadClass
from devheal.model.plan import Action, Blocked, InFlight, Phase
from devheal.model.policy import ActionKind, Policy

from .builders import device, gpu_id, node, pod, policy, report, reported, view, workload

HOUR = 3600.0
NODES = 16
SERVE = workload("serve", WorkloadClass.INFERENCE)


@dataclass
class Fleet:
    rng: random.Random
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    failed_since: dict[str, float] = field(default_factory=dict)
    """Node -> when its GPU 0 failed (absent: healthy)."""
    records: dict[str, InFlight] = field(default_factory=dict)
    made: int = 0
    incarnations: int = 0
    now: float = 0.0

    def __post_init__(self) -> None:
        for i in range(NODES):
            name = f"n{i:02d}"
            self.nodes[name] = node(name, pool="")
            self._place(name)

    def _place(self, on: str) -> None:
        self.incarnations += 1
        p = pod(f"serve-{self.incarnations}", on, owner=SERVE, devices=[device(gpu_id(on, 0))])
        self.pods[p.key] = p

    # ---- faults ----

    def step_faults(self) -> None:
        """Each node, each minute: a healthy GPU fails with probability 1/60, a failed one recovers with 1/5."""
        for name in self.nodes:
            if name in self.failed_since:
                if self.rng.random() < 1 / 5:
                    del self.failed_since[name]
            elif self.rng.random() < 1 / 60:
                self.failed_since[name] = self.now

    def view(self) -> ClusterView:
        pods = []
        for p in self.pods.values():
            bad = p.node in self.failed_since
            health = DeviceHealth.UNHEALTHY if bad else DeviceHealth.HEALTHY
            pods.append(replace(p, devices=(device(gpu_id(p.node, 0), health),)))
        reports = [
            report(n, reported(gpu_id(n, 0), since=since, pod=next((p.key for p in pods if p.node == n), "")))
            for n, since in self.failed_since.items()
        ]
        return view(self.nodes.values(), pods, reports)

    # ---- RoundHost ----

    def in_flight(self, view: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return set()

    def start(self, action: Action, resumed: bool) -> None:
        if action.kind is ActionKind.DESCHEDULE:
            gone = self.pods.pop(action.target, None)
            if gone is not None:
                healthy = [n for n in self.nodes if n not in self.failed_since and "taint" not in self.nodes[n].owned]
                self._place(self.rng.choice(healthy or list(self.nodes)))
        else:
            n = self.nodes[action.target]
            owned = set(n.owned)
            lifts = n.lifts
            if action.kind is ActionKind.TAINT:
                owned.add("taint")
            elif action.kind is ActionKind.LIFT:
                owned.clear()
                lifts += 1
            self.nodes[action.target] = replace(n, owned=frozenset(owned), lifts=lifts)
        self._record(replace(InFlight.of(action, Phase.SUCCEEDED, self.now), finished=self.now))

    def _record(self, record: InFlight) -> None:
        if record.name not in self.records:
            self.made += 1
        self.records[record.name] = record

    def finish(self, record: InFlight) -> None:
        raise AssertionError("no external remediation in this policy")

    def record_blocked(self, item: Blocked) -> None:
        self._record(replace(InFlight.of(item.action, Phase.BLOCKED, self.now), finished=self.now))

    def hold(self, record: InFlight, why: str, rail: object = None) -> None:
        raise AssertionError(f"nothing is paused here: {why}")

    def report_overdue(self, item: Overdue) -> None:
        raise AssertionError(f"every action is done at once: {item.why}")

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())


def round_memory(rounds: DecisionRound) -> int:
    """How much the round remembers between rounds (entries of its maps and sets)."""
    return (
        len(rounds.tracker.first_seen)
        + len(rounds.blocked_seen)
        + len(rounds.next_try)
        + len(rounds.held_seen)
        + len(rounds.overdue_seen)
    )


def soak(p: Policy, hours: float) -> tuple[Fleet, list[int], int]:
    """Run ``hours`` of rounds every 10 s; (the fleet, the round's memory every 10 minutes, GPUs that failed)."""
    fleet = Fleet(random.Random(7))
    rounds = DecisionRound(Pacing(gang_restart=0.0, retry=0.0))
    memory = []
    failures = 0
    for tick in range(int(hours * HOUR / 10)):
        fleet.now = now = tick * 10.0
        if tick % 6 == 0:
            before = set(fleet.failed_since)
            fleet.step_faults()
            failures += len(set(fleet.failed_since) - before)
        rounds.run(fleet, fleet.view(), [p], now)
        if tick % 30 == 0:
            for record in expired(fleet.records.values(), [p], now, 100):
                del fleet.records[record.name]
        if tick % 60 == 0:
            memory.append(round_memory(rounds))
    return fleet, memory, failures


def test_two_hours_of_random_faults_keep_records_and_memory_bounded() -> None:
    p = policy(
        node={"taint": True, "holdDown": 300},
        budgets={"maxUnhealthyNodes": "50%", "workloadDisruptionInterval": "0s"},
        records={"ttlAfterFinished": "30m", "maxEndedPerTarget": 5},
    )
    fleet, memory, failures = soak(p, hours=2)
    assert failures >= 20, f"the soak needs faults to mean anything: {failures}"
    assert fleet.made >= failures, "every failure led to at least one decision"
    # Retention holds: only the last half hour's records (and what ended before the last look, 5 minutes ago),
    # at most 5 per target, beside those a decision still reads (lifts lengthen hold-downs for a day).
    targets: dict[str, int] = {}
    reads = RecordReads.of([p])
    unread = [r for r in fleet.records.values() if not reads.still_read(r, fleet.now - 300)]
    for record in unread:
        targets[record.target] = targets.get(record.target, 0) + 1
        assert record.active or fleet.now - (record.finished or record.started) <= 30 * 60 + 300
    assert max(targets.values()) <= 5
    assert len(unread) < fleet.made / 2, "retention deleted most of what was made"
    # The round's memory follows what is going on, not how long it has been going on.
    assert max(memory) <= 4 * NODES + 10, memory
    assert memory[-1] <= max(memory[: len(memory) // 2 + 1]) + NODES, memory
