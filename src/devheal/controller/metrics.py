"""Prometheus metrics of the controller (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FINDINGS = Gauge("devheal_findings", "Current findings by kind", ["kind"])
ACTIONS = Counter("devheal_actions_total", "Remediation actions by type and result", ["action", "result"])
LATENCY = Histogram(
    "devheal_signal_to_action_seconds",
    "From the first observation of a finding to the remediation write",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900),
)
CACHE_OBJECTS = Gauge("devheal_cache_objects", "Objects in the controller's cache", ["kind"])
BREAKER_OPEN = Gauge("devheal_circuit_breaker_open", "1 while the fault-storm circuit breaker is open")
RECONCILES = Counter("devheal_reconciles_total", "Decision rounds run")
ROUND_NODES = Gauge(
    "devheal_round_nodes", "Nodes the last decision round of each kind looked at (full: every node)", ["round"]
)
LEADER = Gauge("devheal_leader", "1 while this replica holds the leader lease")
NODES_HELD = Gauge(
    "devheal_nodes_held",
    "Nodes devheal keeps marked though they are healthy again, waiting out their hold-down (why: hold-down, lemon)",
    ["why"],
)
EVENTS_DROPPED = Counter(
    "devheal_events_dropped_total", "Event writes dropped: over the involved object's rate limit", ["reason"]
)
AGENT_REPORTS_REJECTED = Counter(
    "devheal_agent_reports_rejected_total",
    "Claims in node agents' NodeDevices that the cluster contradicts (a pod named for a device it does not hold), "
    "counted once per distinct claim",
    ["node", "reason"],
)
UNREADABLE_OBJECTS = Counter(
    "devheal_unreadable_objects_total",
    "Watched objects (and policies) that could not be read and were left out of every decision, once per distinct "
    "error",
    ["kind"],
)
ROUND_FAILURES = Counter(
    "devheal_round_failures_total", "Decision rounds that raised an unexpected error (the loop backs off and goes on)"
)
BADPUT = Counter(
    "devheal_badput_gpu_hours_total",
    "GPU-hours workloads lost from a fault's first sighting to running again, by the simulator's cause class and "
    "the workload's namespace, counted as each Remediation on a pod or a gang ends (its status.badput)",
    ["cause", "namespace"],
)
ROUND_SECONDS = Histogram(
    "devheal_round_seconds",
    "How long each decision round took (those that did not raise)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LONGEST_ROUND = Gauge("devheal_round_seconds_max", "The longest decision round since the controller started")
WORK_QUEUE_DEPTH = Gauge(
    "devheal_work_queue_depth",
    "Work waiting in the controller's work queue for a worker (remediations to carry out or on, blocked decisions "
    "to record, gates to release): a storm's backlog",
)
WORK_QUEUE_WAIT = Histogram(
    "devheal_work_queue_wait_seconds",
    "How long each piece of work waited in the work queue before a worker took it",
    buckets=(0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600),
)


_longest = [0.0]
"""The longest round so far (a gauge is not read back through prometheus_client's API)."""


def observe_round(seconds: float) -> None:
    """Count one decision round's duration."""
    ROUND_SECONDS.observe(seconds)
    if seconds > _longest[0]:
        _longest[0] = seconds
        LONGEST_ROUND.set(seconds)
