"""Whether a stopped gang's step reports name the rank that stopped it, calibrated from real PyTorch gangs.

devheal finds the rank that stalled its gang first, and a slow rank, from the step times each
rank's launcher publishes (``devheal.engine.stragglers``). Whether that rank stands out depends
on what the fault does to its process and on how the gang trains; real 4-rank PyTorch gangs
(torch 2.15, gloo) measured it per fault and shape (``bench/results/real_training.json``,
``python -m bench.real_training --ranks 4 --hold-failed 60 --compare 1 --timeout 150``), each rank
reporting its own forward compute (per-layer hooks, collective waits excluded) and marking the
collectives it waits in, entry and exit (``devheal.launch.collective``; the stall rule then names a
rank only when it is outside every collective while the others wait inside one,
``engine.collective_marks``). The stalls were measured again with the exit marks
(``python -m bench.real_training --ranks 4 --faults network,hang-compute,hang --hold-failed 60
--timeout 150``, ``bench/results/real_training_exitmarks.json`` and ``real_training_exitmarks_2.json``,
two runs):

| fault (bench)                  | DDP              | FSDP  |
|--------------------------------|------------------|-------|
| hang, SIGSTOP mid-step         | right in 1 of 2  | none  |
| hang in compute                | right            | right |
| slow 1.3x, slow 2x             | right            | right |
| network cut                    | none             | none  |
| device XID                     | right            | right |

A stopped process (SIGSTOP) posts nothing more, so its marks are those of its last post: under FSDP
(a collective in every layer, the backward pass marked whole) that said "inside" in both runs and
nobody was named; under DDP it said "outside" in one run (named) and "inside" in the other (``NAMED``
holds the share: 0.5). Before the exit marks, the stopped FSDP rank was
named in one run and not in the next (its entry count against its peers'), and the DDP network cut's
stall once named a healthy rank (gloo's ring had finished the last step for some ranks only); with
the marks every rank waits inside a collective there and nobody is named, so the simulator's model
of no wrong naming now holds by the rule (docs/gangs.md#real-pytorch-gangs-measured).

The simulator's failure classes map onto those faults (``CLASS_FAULTS``). Under FSDP (and tensor
or pipeline parallelism) every layer waits in a collective, so a rank blocked in its compute holds
every rank at the same step; it is named because it is outside every collective while its peers
wait inside one (``engine.collective_marks``; by the entry counts alone,
``engine.stragglers.behind_in_collectives``, where a loop marks no exits), and a slow rank because its
own per-layer compute is timed. The simulator needs no model of the counts or marks: the table is what
the engine's rules achieved on real gangs. Before the training loop counted collectives and timed its
layers (it reported the whole FSDP step), the FSDP column read none for the hangs and the slow ranks,
and DDP's SIGSTOP none.

A stall nobody is named for restarts the gang in place, and a fault that stays on a node can name its rank
then: a rank cut off from its peers (``MISSES_RENDEZVOUS``) starts again but never reaches its gang's rendezvous
(``report_joined``), and the engine names it once the others have waited there ``stall.joinAfter``
(``engine.stragglers.rendezvous_stall``; real DDP and FSDP gangs, network cut on one rank: the stall found in
11 s with no rank named, then that rank named at the rendezvous and replaced, every rank stepping again 61 s
after the fault with ``joinAfter: 30s``, ``bench/results/real_training_network.json``). Sooner than that, the
rank's own launcher names it: its probes of the rendezvous store fail (``Simulation.store_unreachable``,
``engine.store_probes.cut_off``; real gangs: named in 9-10 s with ``unreachableAfter: 5s``, every rank stepping again
28 s after the cut, ``bench/results/real_training_probe.json``). ``CulpritModel`` is the
calibrated table, or one probability for every stall and slow rank (a what-if, and the
sensitivity axis). Pure: every draw is a hash of what it is about, so all strategies replaying
a trace see the same culprits.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Parallelism(StrEnum):
    """How a training gang splits its work (``GangSpec.parallelism``)."""

    DDP = "ddp"
    """Data parallel: each rank computes a whole step, then all-reduces its gradients once."""
    FSDP = "fsdp"
    """Sharded (FSDP, ZeRO; tensor and pipeline parallelism alike): collectives inside every layer."""


class BenchFault(StrEnum):
    """The faults the real-training bench injected into one rank."""

    HANG_MID_STEP = "hang"
    HANG_IN_COMPUTE = "hang-compute"
    SLOW = "slow"
    NETWORK = "network"
    DEVICE = "device"


NAMED: Mapping[tuple[BenchFault, Parallelism], float] = {
    # A stopped process's last post says "outside" about as often as "inside" under DDP (named in 1 of 2 runs).
    (BenchFault.HANG_MID_STEP, Parallelism.DDP): 0.5,
    (BenchFault.HANG_MID_STEP, Parallelism.FSDP): 0.0,
    (BenchFault.HANG_IN_COMPUTE, Parallelism.DDP): 1.0,
    (BenchFault.HANG_IN_COMPUTE, Parallelism.FSDP): 1.0,
    (BenchFault.SLOW, Parallelism.DDP): 1.0,
    (BenchFault.SLOW, Parallelism.FSDP): 1.0,
    (BenchFault.NETWORK, Parallelism.DDP): 0.0,
    (BenchFault.NETWORK, Parallelism.FSDP): 0.0,
    (BenchFault.DEVICE, Parallelism.DDP): 1.0,
    (BenchFault.DEVICE, Parallelism.FSDP): 1.0,
}
"""The share of the bench's runs whose step reports named the faulty rank (``right``), per fault and parallelism;
a stall or slow rank is named when its fixed draw falls below it (1.0: always, 0.0: never)."""

CLASS_FAULTS: Mapping[str, BenchFault] = {
    # The GPU errors: the rank's process fails on it (the agent sees the XID first anyway).
    "faulty-gpu": BenchFault.DEVICE,
    "gpu-hbm3": BenchFault.DEVICE,
    "gpu-sram": BenchFault.DEVICE,
    "gpu-system-processor": BenchFault.DEVICE,
    "gpu-thermal": BenchFault.DEVICE,
    # The node's fabric is gone: every rank waits in a collective that never completes (the stall names nobody;
    # after the in-place restart the rank never reaches the rendezvous, which names it: MISSES_RENDEZVOUS).
    "network": BenchFault.NETWORK,
    "nic": BenchFault.NETWORK,
    # The rank blocks on its own I/O, outside the collectives (data loading, checkpoint writes).
    "ssd": BenchFault.HANG_IN_COMPUTE,
    "io-expansion-board": BenchFault.HANG_IN_COMPUTE,
    # The node stops: its rank's process stops wherever it was, as SIGSTOP stops it (under FSDP, most likely inside
    # a collective: nobody named at the stall).
    "host-maintenance": BenchFault.HANG_MID_STEP,
    "power-supply": BenchFault.HANG_MID_STEP,
    "server-chassis": BenchFault.HANG_MID_STEP,
    "cpu": BenchFault.HANG_MID_STEP,
    "system-memory": BenchFault.HANG_MID_STEP,
}
"""The bench fault each stalling failure class behaves as (crashes, hangs and corruption stall nothing)."""

MISSES_RENDEZVOUS = frozenset({"network", "nic"})
"""Classes whose fault, while it stays on the node, keeps the rank from its peers after a restart too: its process
starts again and its launcher still reaches the API server (a pod's control traffic is not its data network), but
it never reaches the rendezvous store its peers connect to. The others (SSD, IO board: the rank reaches the
rendezvous and blocks on its own I/O later) step no more than it does after the restart, so nothing names them;
a node-down fault takes the pod itself away."""


def _draw(*key: object) -> float:
    """A uniform number in [0, 1) fixed by ``key``."""
    return zlib.crc32(repr(key).encode()) / 2**32


@dataclass(frozen=True, slots=True)
class CulpritModel:
    """When a stall's culprit, and a slow rank, stand out in the step reports."""

    name: str
    probability: float | None = None
    """None: the calibrated table (``NAMED``); else every stall's culprit and every slow rank is named with
    this probability."""

    def validate(self) -> None:
        p = self.probability
        if p is not None and not 0.0 <= p <= 1.0:
            raise ValueError(f"culprit model {self.name}: probability: expected 0..1, got {p!r}")

    def names_stall(self, cls: str, parallelism: Parallelism, fault: int, run: int) -> bool:
        """Whether the rank on the node of fault ``fault`` (class ``cls``) stalled the gang's run ``run`` first
        in its step reports."""
        if self.probability is not None:
            return _draw("stall", fault, run) < self.probability
        bench = CLASS_FAULTS.get(cls)
        return bench is not None and _draw("stall", fault, run) < NAMED[bench, parallelism]

    def names_slow(self, parallelism: Parallelism, node: int) -> bool:
        """Whether a slow rank on ``node`` stands out from its gang's step times."""
        if self.probability is not None:
            return _draw("slow", node) < self.probability
        return _draw("slow", node) < NAMED[BenchFault.SLOW, parallelism]


CALIBRATED = CulpritModel("calibrated")
CULPRIT_MODELS: Mapping[str, CulpritModel] = {
    "calibrated": CALIBRATED,
    "always-named": CulpritModel("always-named", 1.0),
    "never-named": CulpritModel("never-named", 0.0),
}
"""``calibrated``: the bench's table; ``always-named``: the failing rank always stands out (what the simulator
assumed before it was calibrated, kept as a what-if); ``never-named``: it never does."""


def named_with(probability: float) -> CulpritModel:
    """Every stall's culprit and every slow rank named with ``probability`` (the sensitivity axis)."""
    model = CulpritModel(f"named {100 * probability:g}%", probability)
    model.validate()
    return model
