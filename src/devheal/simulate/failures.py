"""Failure traces: what breaks, where and when, generated from published rates or given.

The defaults are shaped on the Llama 3 405B pre-training snapshot (Dubey et al. 2024,
"The Llama 3 Herd of Models", section 3.3.4, Table 5): 419 unexpected interruptions in 54
days on 16,384 H100 GPUs, i.e. 419 / (16,384 x 54 x 24) = 1.97e-5 interruptions per
GPU-hour, broken down by root cause. The class weights are the table's interruption
counts (they sum to 419; the table's percentage column does not sum to 100).

A trace is generated without iterating over GPUs or hours: per class, fleet-level
exponential inter-arrival times, then a node drawn with a weight (lemon nodes weigh
more). Every random draw a replay needs (which GPU, whether a reboot fixes it, how long
people take) is made here, so every strategy replays exactly the same faults. Pure: the
random generator is seeded and passed in.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

HOUR = 3600.0
DAY = 24 * HOUR


class Signal(StrEnum):
    """How a failure shows itself, which decides who can see it and act."""

    DEVICE = "device"
    """The GPU reports it (XID through NVML): devheal's agent, the device plugin (allocatable drops), KEP-4680."""
    NODE_DOWN = "node-down"
    """The node stops: NotReady, and Kubernetes evicts its pods after the not-ready toleration."""
    HIDDEN = "hidden"
    """The job fails, but nothing in Kubernetes points at the node (NIC, fabric, SSD): people find it."""
    CRASH = "crash"
    """The job exits and nothing on the node stays broken (software bug, dependency): the job restarts."""
    HANG = "hang"
    """The job hangs until the NCCL watchdog fires; nothing on the node stays broken."""
    SILENT = "silent"
    """Silent data corruption: wrong results, found later by the training job; people find the GPU."""


PERSISTENT = frozenset({Signal.DEVICE, Signal.NODE_DOWN, Signal.HIDDEN, Signal.SILENT})
"""Signals whose fault stays on the node until it is rebooted, repaired or replaced."""


@dataclass(frozen=True, slots=True)
class FailureClass:
    name: str
    label: str
    count: int
    """Interruptions of this class in the Llama 3 405B snapshot (Table 5): the default weight."""
    signal: Signal
    reboot_fixes: float = 0.0
    """Probability that a node reboot clears the fault (the rest need a hardware repair). An assumption:
    no public breakdown exists."""
    xid: int | None = None
    """A representative NVIDIA XID, shown in the agent's report (device faults only)."""


FAILURE_CLASSES: tuple[FailureClass, ...] = (
    FailureClass("faulty-gpu", "Faulty GPU", 148, Signal.DEVICE, 0.5, 79),
    FailureClass("gpu-hbm3", "GPU HBM3 memory", 72, Signal.DEVICE, 0.5, 48),
    FailureClass("software-bug", "Software bug", 54, Signal.CRASH),
    FailureClass("network", "Network switch/cable", 35, Signal.HIDDEN),
    FailureClass("host-maintenance", "Host maintenance (unplanned)", 32, Signal.NODE_DOWN, 1.0),
    FailureClass("gpu-sram", "GPU SRAM memory", 19, Signal.DEVICE, 0.5, 95),
    FailureClass("gpu-system-processor", "GPU system processor", 17, Signal.DEVICE, 0.8, 119),
    FailureClass("nic", "NIC", 7, Signal.HIDDEN, 0.3),
    FailureClass("nccl-watchdog", "NCCL watchdog timeout", 7, Signal.HANG),
    FailureClass("sdc", "Silent data corruption", 6, Signal.SILENT),
    FailureClass("gpu-thermal", "GPU thermal interface + sensor", 6, Signal.DEVICE),
    FailureClass("ssd", "SSD", 3, Signal.HIDDEN),
    FailureClass("power-supply", "Power supply", 3, Signal.NODE_DOWN),
    FailureClass("server-chassis", "Server chassis", 2, Signal.NODE_DOWN),
    FailureClass("io-expansion-board", "IO expansion board", 2, Signal.HIDDEN),
    FailureClass("dependency", "Dependency", 2, Signal.CRASH),
    FailureClass("cpu", "CPU", 2, Signal.NODE_DOWN),
    FailureClass("system-memory", "System memory", 2, Signal.NODE_DOWN),
)
CLASSES: Mapping[str, FailureClass] = {c.name: c for c in FAILURE_CLASSES}

LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_RATE = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
"""Unexpected interruptions per GPU-hour in the Llama 3 405B snapshot: about 1.97e-5."""


class TraceError(ValueError):
    """A trace specification or trace is invalid; the message says which field."""


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """How to generate a trace. Every default is documented with its source in docs/simulator.md."""

    rate_per_gpu_hour: float = LLAMA3_RATE
    class_weights: Mapping[str, float] = field(
        default_factory=lambda: {c.name: float(c.count) for c in FAILURE_CLASSES}
    )
    lemon_fraction: float = 0.01
    """Share of nodes that fail far more often than the rest (Kokolis et al. 2024 describe such 'lemon' nodes)."""
    lemon_hazard: float = 10.0
    """How many times more often a lemon node fails (an assumption; the fleet-wide rate is kept)."""
    gray_fraction: float = 0.005
    """Share of nodes that run slow without failing (MegaScale, Jiang et al. 2024: about 0.5%)."""
    gray_slowdown: tuple[float, float] = (1.1, 1.5)
    """A slow node's step time, as a multiple of a healthy one's (uniform in this range)."""
    fail_slow_per_node_day: float = 1 / 4000
    """Fail-slow episodes per node and day: a node that runs slow for a while, then recovers by itself (a
    throttling GPU, a flapping link, a noisy neighbour). An assumption: about one episode every two days on the
    llama3-405b fleet (docs/simulator.md)."""
    fail_slow_median_s: float = 1800.0
    """The median length of a fail-slow episode; lengths are log-normal (minutes to hours)."""
    fail_slow_sigma: float = 1.2
    """The log-normal's sigma: 5% of episodes are shorter than about 4 minutes, 5% longer than about 3.6 hours."""
    fail_slow_max_s: float = 12 * HOUR
    """No episode lasts longer (a node slow for longer is a gray node, ``gray_fraction``)."""
    burst_probability: float = 0.03
    """Chance that a failure brings 1-3 more of its class on nodes of the same rack within the window."""
    burst_extra: tuple[int, int] = (1, 3)
    burst_window_s: float = 600.0
    rack_size: int = 4
    """Nodes per rack (bursts stay in one rack)."""
    response_jitter: tuple[float, float] = (0.5, 1.5)
    """Human response and repair times are their configured means times a factor uniform in this range."""

    def validate(self) -> None:
        if not self.rate_per_gpu_hour >= 0:
            raise TraceError(f"rate_per_gpu_hour: expected a rate >= 0, got {self.rate_per_gpu_hour!r}")
        unknown = sorted(set(self.class_weights) - set(CLASSES))
        if unknown:
            raise TraceError(
                f"class_weights: unknown failure class(es) {', '.join(unknown)}; known: {', '.join(CLASSES)}"
            )
        if any(w < 0 for w in self.class_weights.values()) or sum(self.class_weights.values()) <= 0:
            raise TraceError("class_weights: weights must be >= 0 and not all 0")
        if not self.fail_slow_per_node_day >= 0:
            raise TraceError(f"fail_slow_per_node_day: expected a rate >= 0, got {self.fail_slow_per_node_day!r}")
        if not 0 < self.fail_slow_median_s <= self.fail_slow_max_s or self.fail_slow_sigma < 0:
            raise TraceError(
                "fail_slow_median_s, fail_slow_max_s, fail_slow_sigma: expected 0 < median <= max and sigma >= 0, got "
                f"{self.fail_slow_median_s!r}, {self.fail_slow_max_s!r}, {self.fail_slow_sigma!r}"
            )
        for name in ("lemon_fraction", "gray_fraction", "burst_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise TraceError(f"{name}: expected a fraction between 0 and 1, got {value!r}")
        if self.lemon_hazard < 1.0:
            raise TraceError(f"lemon_hazard: expected a multiple >= 1, got {self.lemon_hazard!r}")
        low, high = self.gray_slowdown
        if not 1.0 <= low <= high:
            raise TraceError(f"gray_slowdown: expected 1 <= low <= high, got {self.gray_slowdown!r}")
        if not 0 <= self.burst_extra[0] <= self.burst_extra[1]:
            raise TraceError(f"burst_extra: expected 0 <= low <= high, got {self.burst_extra!r}")
        if self.rack_size < 1:
            raise TraceError(f"rack_size: expected at least 1, got {self.rack_size!r}")
        if not 0 < self.response_jitter[0] <= self.response_jitter[1]:
            raise TraceError(f"response_jitter: expected 0 < low <= high, got {self.response_jitter!r}")

    def class_rates(self) -> dict[str, float]:
        """Failures per GPU-hour, by class (the total rate split by the class weights)."""
        total = sum(self.class_weights.values())
        return {name: self.rate_per_gpu_hour * w / total for name, w in self.class_weights.items() if w > 0}


@dataclass(frozen=True, slots=True)
class Fault:
    time: float
    """Seconds since the start of the simulation."""
    node: int
    cls: str
    gpu: int = 0
    reboot_fixes: bool = False
    human_factor: float = 1.0
    """Multiplies the configured human response time for this fault."""
    repair_factor: float = 1.0
    """Multiplies the configured repair time for this fault."""
    lemon: bool = False
    """The fault comes from a lemon node's excess hazard (``TraceSpec.lemon_hazard``): it belongs to the machine, so
    it does not land once the machine in the slot was replaced (a fresh one fails at the ordinary rate)."""

    @property
    def failure_class(self) -> FailureClass:
        return CLASSES[self.cls]


@dataclass(frozen=True, slots=True)
class SlowEpisode:
    """A fail-slow episode: the node runs ``factor`` times slower from ``start`` to ``end`` (seconds), then recovers."""

    node: int
    start: float
    end: float
    factor: float


@dataclass(frozen=True)
class Trace:
    nodes: int
    """Node slots in the fleet (active and spare)."""
    gpus_per_node: int
    horizon_s: float
    faults: tuple[Fault, ...]
    lemons: frozenset[int] = frozenset()
    slow: Mapping[int, float] = field(default_factory=dict)
    """Gray failures: node -> slowdown factor (> 1), from the start until the node is repaired."""
    slow_episodes: tuple[SlowEpisode, ...] = ()
    """Fail-slow episodes that appear during the run, by start time."""
    source: str = "generated"

    def counts_by_class(self) -> Counter[str]:
        return Counter(f.cls for f in self.faults)

    def validate(self) -> None:
        """Check every fault fits the fleet and the horizon, and that faults are in time order."""
        last = 0.0
        for i, f in enumerate(self.faults):
            where = f"{self.source}: fault {i}"
            if f.cls not in CLASSES:
                raise TraceError(f"{where}: unknown failure class {f.cls!r}")
            if not 0 <= f.node < self.nodes:
                raise TraceError(f"{where}: node {f.node} outside the fleet (0..{self.nodes - 1})")
            if not 0 <= f.gpu < self.gpus_per_node:
                raise TraceError(f"{where}: gpu {f.gpu} outside 0..{self.gpus_per_node - 1}")
            if f.time < last:
                raise TraceError(f"{where}: time {f.time} before the previous fault ({last})")
            last = f.time


def generate_trace(nodes: int, gpus_per_node: int, horizon_s: float, spec: TraceSpec, seed: int) -> Trace:
    """A reproducible trace: the same arguments always give the same faults."""
    spec.validate()
    if nodes < 1 or gpus_per_node < 1 or horizon_s <= 0:
        raise TraceError(
            f"need nodes >= 1, gpus_per_node >= 1 and a horizon > 0 (got {nodes}, {gpus_per_node}, {horizon_s})"
        )
    rng = random.Random(seed)
    lemons = frozenset(rng.sample(range(nodes), round(spec.lemon_fraction * nodes)))
    slow_nodes = sorted(rng.sample(range(nodes), round(spec.gray_fraction * nodes)))
    low, high = spec.gray_slowdown
    slow = {n: rng.uniform(low, high) for n in slow_nodes}

    cumulative: list[float] = []
    total = 0.0
    for n in range(nodes):
        total += spec.lemon_hazard if n in lemons else 1.0
        cumulative.append(total)

    def pick_node() -> int:
        return min(bisect.bisect_right(cumulative, rng.random() * total), nodes - 1)

    mean_extra = (spec.burst_extra[0] + spec.burst_extra[1]) / 2
    # Bursts add failures; thin the primary arrivals so the expected total keeps the configured rate.
    thinning = 1.0 + spec.burst_probability * mean_extra
    j_low, j_high = spec.response_jitter
    gpus = nodes * gpus_per_node
    faults: list[Fault] = []

    def make(time: float, node: int, cls: FailureClass) -> Fault:
        return Fault(
            time=time,
            node=node,
            cls=cls.name,
            gpu=rng.randrange(gpus_per_node),
            reboot_fixes=rng.random() < cls.reboot_fixes,
            human_factor=rng.uniform(j_low, j_high),
            repair_factor=rng.uniform(j_low, j_high),
        )

    for name, rate in spec.class_rates().items():
        cls = CLASSES[name]
        per_second = rate * gpus / HOUR / thinning
        if per_second <= 0:
            continue
        t = rng.expovariate(per_second)
        while t < horizon_s:
            node = pick_node()
            faults.append(make(t, node, cls))
            if spec.burst_probability > 0 and rng.random() < spec.burst_probability:
                rack_start = node - node % spec.rack_size
                rack = [n for n in range(rack_start, min(rack_start + spec.rack_size, nodes)) if n != node] or [node]
                for _ in range(rng.randint(*spec.burst_extra)):
                    when = t + rng.uniform(0.0, spec.burst_window_s)
                    if when < horizon_s:
                        faults.append(make(when, rng.choice(rack), cls))
            t += rng.expovariate(per_second)
    faults.sort(key=lambda f: (f.time, f.node, f.cls))
    # Drawn from their own streams, so adding them left every fault above as it was.
    faults = _mark_lemon_excess(faults, lemons, spec, random.Random(f"lemons-{seed}"))
    episodes = _fail_slow_episodes(nodes, horizon_s, spec, random.Random(f"fail-slow-{seed}"))
    return Trace(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        horizon_s=horizon_s,
        faults=tuple(faults),
        lemons=lemons,
        slow=slow,
        slow_episodes=episodes,
        source=f"generated (seed {seed})",
    )


def _mark_lemon_excess(faults: list[Fault], lemons: frozenset[int], spec: TraceSpec, rng: random.Random) -> list[Fault]:
    """Of a lemon node's faults, the share its excess hazard brings ((hazard - 1) / hazard) is the machine's own."""
    if not lemons or spec.lemon_hazard <= 1.0:
        return faults
    excess = (spec.lemon_hazard - 1.0) / spec.lemon_hazard
    return [replace(f, lemon=True) if f.node in lemons and rng.random() < excess else f for f in faults]


def _fail_slow_episodes(nodes: int, horizon_s: float, spec: TraceSpec, rng: random.Random) -> tuple[SlowEpisode, ...]:
    """Fleet-level exponential arrivals, a node drawn uniformly, a log-normal length, a slowdown in
    ``gray_slowdown``."""
    per_second = spec.fail_slow_per_node_day * nodes / DAY
    if per_second <= 0:
        return ()
    low, high = spec.gray_slowdown
    episodes = []
    t = rng.expovariate(per_second)
    while t < horizon_s:
        length = min(rng.lognormvariate(math.log(spec.fail_slow_median_s), spec.fail_slow_sigma), spec.fail_slow_max_s)
        episodes.append(SlowEpisode(rng.randrange(nodes), t, min(t + length, horizon_s), rng.uniform(low, high)))
        t += rng.expovariate(per_second)
    return tuple(episodes)
