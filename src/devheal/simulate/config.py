"""Everything a simulation run is parameterised by: fleet, workloads, costs, presets.

All timings live in one ``CostModel`` with documented defaults (docs/simulator.md gives
the source or says "assumption" for each). Presets build a whole ``SimConfig`` from a
few numbers a user can override on the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace

from devheal.simulate.culprits import CALIBRATED, CULPRIT_MODELS, CulpritModel, Parallelism
from devheal.simulate.failures import DAY, LLAMA3_DAYS, LLAMA3_GPUS, TraceSpec


class ConfigError(ValueError):
    """A simulation setting is invalid; the message names it."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Detection delays and the time each remedy takes, in seconds."""

    # How long until a signal is seen.
    agent_detect_s: float = 5.0
    """XID -> NVML event -> devheal agent's NodeDevices report -> controller."""
    pod_status_detect_s: float = 10.0
    """Device plugin health -> kubelet -> pod status allocatedResourcesStatus (KEP-4680)."""
    device_plugin_detect_s: float = 10.0
    """Device plugin marks the GPU unhealthy -> node allocatable drops."""
    crash_detect_s: float = 30.0
    """A crashed rank exits and the job's controller notices."""
    job_backoff_s: float = 10.0
    """A Job's pod failed: its controller waits this long before it creates the pods again (the Job controller's
    first pod-failure backoff, 10 s, doubling up to 6 min)."""
    nccl_timeout_s: float = 600.0
    """A hung collective is killed by the NCCL watchdog (PyTorch's default process-group timeout, 10 min)."""
    sdc_detect_s: float = 3600.0
    """Silent data corruption is noticed by the training job (loss spikes, NaN checks)."""
    node_not_ready_s: float = 50.0
    """kube-controller-manager --node-monitor-grace-period (50 s by default in current Kubernetes)."""
    eviction_toleration_s: float = 300.0
    """kube-apiserver --default-not-ready-toleration-seconds: pods leave a NotReady node after this."""
    step_s: float = 6.0
    """A training step of the gang (the launcher's step reports; stall and straggler detection scale with it)."""
    steps_publish_s: float = 10.0
    """How often a rank's launcher rewrites its step report (``devheal.io/steps``; ``devheal launch``'s default)."""
    store_probe_s: float = 5.0
    """A rank's launcher probes its gang's rendezvous store this often, each probe waiting as long for an answer
    (``devheal launch --probe-interval``): its first failed probe begins at most this long after a cut, and fails
    this long after it began."""
    # People.
    human_response_s: float = 3600.0
    """Mean time for an on-call engineer to act on a failure nothing automated handles."""
    straggler_detect_s: float = DAY
    """Mean time for people to find and swap out a slow (gray) node in a training gang."""
    # Node work.
    node_reboot_s: float = 900.0
    """Reboot, driver load and health checks."""
    node_replace_s: float = 1800.0
    """A node health controller recreates the node: a fresh machine joins (cloud provisioning + bootstrap)."""
    hardware_repair_s: float = 2 * DAY
    """A node needing a part swap or RMA is out of service this long."""
    nhc_timer_s: float = 300.0
    """Node health controller: allocatable below capacity this long -> recreate the node."""
    template_remediation: str = "reboot"
    """What devheal's external remediation template (``node.template``) does to a node: ``reboot`` or ``replace``."""
    escalation_effects: tuple[str, ...] = ("reset", "reboot", "replace")
    """What each rung of a ``node.escalation`` ladder does, in order (the last repeats for longer ladders):
    ``reset`` (the GPUs), ``reboot``, ``replace`` or ``repair``; the docs' example ladder."""
    gpu_reset_s: float = 300.0
    """A GPU reset and the health check after it (the node's GPUs are idle)."""
    # Workload restarts.
    pod_recreate_s: float = 120.0
    """Every pod of the workload is deleted, recreated, scheduled and started (images cached)."""
    inplace_restart_s: float = 20.0
    """Processes restart inside the existing pods (devheal RestartGang: only the broken pod is replaced)."""

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not (isinstance(value, int | float) and value >= 0 and math.isfinite(value)):
                raise ConfigError(f"costs.{f.name}: expected seconds >= 0, got {value!r}")
        if self.template_remediation not in ("reboot", "replace"):
            raise ConfigError(
                f"costs.template_remediation: expected reboot or replace, got {self.template_remediation!r}"
            )
        effects = ("reset", "reboot", "replace", "repair")
        if not self.escalation_effects or any(e not in effects for e in self.escalation_effects):
            raise ConfigError(
                f"costs.escalation_effects: expected one or more of {', '.join(effects)}, "
                f"got {self.escalation_effects!r}"
            )


@dataclass(frozen=True, slots=True)
class GangSpec:
    """A training job over whole nodes: any member's failure stops all; progress rolls back to the last checkpoint."""

    name: str
    nodes: int
    checkpoint_interval_s: float = 900.0
    checkpoint_stall_s: float = 20.0
    """Training time each checkpoint costs (asynchronous checkpointing still pauses briefly)."""
    restart_s: float = 180.0
    """Rendezvous, NCCL initialisation and checkpoint load after the pods run again."""
    corruption_exit_code: int | None = None
    """The workload validates its results: when it notices corruption, the rank whose GPU produced it exits
    with this code (``--result-validation``). None: the job stops and waits for a person to find the GPU."""
    parallelism: Parallelism = Parallelism.FSDP
    """How the gang splits its work: whether a stalled or slow rank stands out in its step reports
    (``culprits``)."""


@dataclass(frozen=True, slots=True)
class InferenceSpec:
    """Stateless replicas, one node each: a failure loses the replica until it is replaced."""

    replicas: int
    start_s: float = 300.0
    """Container start and model load."""
    peak_load: float = 0.9
    """Requests at the daily peak, as a share of what every replica together serves."""
    trough_load: float = 0.5
    """... and at the daily low (demand follows a sine over the day)."""


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """Nodes running back-to-back single-node jobs without checkpoints: a failure loses the running job."""

    nodes: int
    job_hours: float = 4.0
    start_s: float = 60.0


@dataclass(frozen=True, slots=True)
class FleetSpec:
    gpus_per_node: int
    gangs: tuple[GangSpec, ...]
    inference: InferenceSpec | None = None
    batch: BatchSpec | None = None
    spare_nodes: int = 0
    """Healthy nodes with nothing on them, ready to replace a failed one."""

    @property
    def workload_nodes(self) -> int:
        return (
            sum(g.nodes for g in self.gangs)
            + (self.inference.replicas if self.inference else 0)
            + (self.batch.nodes if self.batch else 0)
        )

    @property
    def nodes(self) -> int:
        return self.workload_nodes + self.spare_nodes

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def validate(self) -> None:
        if self.gpus_per_node < 1:
            raise ConfigError(f"fleet.gpus_per_node: expected at least 1, got {self.gpus_per_node}")
        if self.spare_nodes < 0:
            raise ConfigError(f"fleet.spare_nodes: expected >= 0, got {self.spare_nodes}")
        names = [g.name for g in self.gangs]
        if len(set(names)) != len(names):
            raise ConfigError(f"fleet.gangs: gang names must be unique, got {names}")
        for g in self.gangs:
            if g.nodes < 1:
                raise ConfigError(f"fleet.gangs[{g.name}].nodes: expected at least 1, got {g.nodes}")
            if g.checkpoint_interval_s <= 0 or g.checkpoint_stall_s < 0 or g.restart_s < 0:
                raise ConfigError(f"fleet.gangs[{g.name}]: checkpoint interval must be > 0, stall and restart >= 0")
            if not isinstance(g.parallelism, Parallelism):
                raise ConfigError(
                    f"fleet.gangs[{g.name}].parallelism: expected one of {', '.join(Parallelism)}, "
                    f"got {g.parallelism!r}"
                )
            if g.checkpoint_stall_s >= g.checkpoint_interval_s:
                raise ConfigError(f"fleet.gangs[{g.name}].checkpoint_stall_s: must be below the checkpoint interval")
        if self.inference is not None and (self.inference.replicas < 0 or self.inference.start_s < 0):
            raise ConfigError("fleet.inference: replicas and start_s must be >= 0")
        if self.inference is not None and not 0 < self.inference.trough_load <= self.inference.peak_load <= 1:
            raise ConfigError("fleet.inference: expected 0 < trough_load <= peak_load <= 1")
        if self.batch is not None and (self.batch.nodes < 0 or self.batch.job_hours <= 0 or self.batch.start_s < 0):
            raise ConfigError("fleet.batch: nodes >= 0, job_hours > 0 and start_s >= 0 required")
        if self.workload_nodes < 1:
            raise ConfigError("fleet: no workload runs on any node")


@dataclass(frozen=True)
class SimConfig:
    preset: str
    fleet: FleetSpec
    days: float
    costs: CostModel = field(default_factory=CostModel)
    trace: TraceSpec = field(default_factory=TraceSpec)
    culprits: CulpritModel = CALIBRATED
    """When the step reports name a stalled gang's culprit and a slow rank (``--culprit-model``)."""

    @property
    def horizon_s(self) -> float:
        return self.days * DAY

    def validate(self) -> None:
        if not (self.days > 0 and math.isfinite(self.days)):
            raise ConfigError(f"days: expected a duration > 0, got {self.days!r}")
        self.fleet.validate()
        self.costs.validate()
        self.trace.validate()
        try:
            self.culprits.validate()
        except ValueError as exc:
            raise ConfigError(f"culprits: {exc}") from exc


# ---- checkpointing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Checkpointing:
    """How a training gang saves and restores its state (docs/simulator.md gives the sources)."""

    interval_s: float
    stall_s: float
    restart_s: float
    """Rendezvous, NCCL initialisation and checkpoint load."""


CHECKPOINTING: Mapping[str, Checkpointing] = {
    "periodic": Checkpointing(interval_s=900.0, stall_s=20.0, restart_s=180.0),
    "in-memory": Checkpointing(interval_s=120.0, stall_s=1.0, restart_s=60.0),
}
"""``periodic``: the presets' default, asynchronous checkpoints to remote storage every 15 minutes.
``in-memory``: the best practice (Gemini, ByteRobust): checkpoints to peers' host memory every 2 minutes,
restored from memory on restart."""


RESULT_VALIDATION_EXIT_CODE = 75
"""The code ``--result-validation``'s workloads exit the suspect rank with (any code the policy declares)."""


def with_result_validation(config: SimConfig, code: int = RESULT_VALIDATION_EXIT_CODE) -> SimConfig:
    """Every training gang of ``config`` validates its results and exits the suspect rank with ``code``."""
    gangs = tuple(replace(g, corruption_exit_code=code) for g in config.fleet.gangs)
    return replace(config, fleet=replace(config.fleet, gangs=gangs))


def with_checkpointing(config: SimConfig, name: str) -> SimConfig:
    """Every training gang of ``config`` checkpoints as ``CHECKPOINTING[name]`` says."""
    if name not in CHECKPOINTING:
        raise ConfigError(f"checkpointing: unknown {name!r}; expected one of {', '.join(CHECKPOINTING)}")
    c = CHECKPOINTING[name]
    gangs = tuple(
        replace(g, checkpoint_interval_s=c.interval_s, checkpoint_stall_s=c.stall_s, restart_s=c.restart_s)
        for g in config.fleet.gangs
    )
    return replace(config, fleet=replace(config.fleet, gangs=gangs))


def with_parallelism(config: SimConfig, name: str) -> SimConfig:
    """Every training gang of ``config`` trains with ``name`` (``ddp`` or ``fsdp``)."""
    if name not in set(Parallelism):
        raise ConfigError(f"parallelism: unknown {name!r}; expected one of {', '.join(Parallelism)}")
    gangs = tuple(replace(g, parallelism=Parallelism(name)) for g in config.fleet.gangs)
    return replace(config, fleet=replace(config.fleet, gangs=gangs))


def with_culprit_model(config: SimConfig, name: str) -> SimConfig:
    """``config`` with the culprit model ``CULPRIT_MODELS[name]``."""
    if name not in CULPRIT_MODELS:
        raise ConfigError(f"culprit model: unknown {name!r}; expected one of {', '.join(CULPRIT_MODELS)}")
    return replace(config, culprits=CULPRIT_MODELS[name])


# ---- presets ---------------------------------------------------------------------------------


def llama3_405b(nodes: int | None = None, gpus_per_node: int | None = None, days: float | None = None) -> SimConfig:
    """One training gang over the whole fleet, as in the Llama 3 405B snapshot: 2,048 nodes x 8 H100s, 54 days.

    Llama 3 used 16K of a 24K-GPU cluster, so spare nodes existed; how many were kept ready is not
    published. The preset keeps 1 spare per 32 gang nodes (64 for 2,048). Llama 3 405B trained with FSDP,
    tensor, pipeline and context parallelism: collectives inside every layer, so the gang is ``fsdp``."""
    g = gpus_per_node or 8
    n = nodes or LLAMA3_GPUS // 8
    fleet = FleetSpec(
        gpus_per_node=g,
        gangs=(GangSpec("llama3-405b", n, parallelism=Parallelism.FSDP),),
        spare_nodes=max(1, math.ceil(n / 32)),
    )
    return SimConfig("llama3-405b", fleet, float(days if days is not None else LLAMA3_DAYS))


def mixed(nodes: int | None = None, gpus_per_node: int | None = None, days: float | None = None) -> SimConfig:
    """A shared fleet: a training gang on 60% of the nodes, inference on 25%, batch jobs on 10%, 5% spare."""
    n = nodes or 512
    g = gpus_per_node or 8
    gang = max(1, round(n * 0.60))
    replicas = round(n * 0.25)
    batch = round(n * 0.10)
    fleet = FleetSpec(
        gpus_per_node=g,
        gangs=(GangSpec("pretrain", gang),),
        inference=InferenceSpec(replicas) if replicas else None,
        batch=BatchSpec(batch) if batch else None,
        spare_nodes=max(1, n - gang - replicas - batch),
    )
    return SimConfig("mixed", fleet, float(days if days is not None else 30))


PRESETS: dict[str, Callable[[int | None, int | None, float | None], SimConfig]] = {
    "llama3-405b": llama3_405b,
    "mixed": mixed,
}


def build_preset(
    name: str, nodes: int | None = None, gpus_per_node: int | None = None, days: float | None = None
) -> SimConfig:
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    if nodes is not None and nodes < 1:
        raise ConfigError(f"nodes: expected at least 1, got {nodes}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ConfigError(f"gpus_per_node: expected at least 1, got {gpus_per_node}")
    config = PRESETS[name](nodes, gpus_per_node, days)
    config.validate()
    return config
