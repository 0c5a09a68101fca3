"""Degraded devices through the decision round on a fake clock: a degradation counts after enterAfter and is
let go after leaveAfter clean (no flapping records), the taint's effect follows severity, inference pods are
descheduled after the grace, gang ranks replaced by the policy's choice; a device to send for repair drains its
node; an unknown XID the device plugin fails in pod status is reported, never acted on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from devheal.engine.decide import Overdue
from devheal.engine.degradation import DegradationTracker, degraded, degraded_ranks, entered
from devheal.engine.findings import detect
from devheal.engine.rounds import DecisionRound
from devheal.model.cluster import (
    ClusterView,
    DeviceHealth,
    Node,
    NodeDevicesReport,
    Pod,
    ReportedDevice,
    ReportedReason,
    Taint,
    WorkloadClass,
)
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_TAINT_KEY, SUSPECT_MARK, DegradationRules
from devheal.model.node_devices import Remedy
from devheal.model.plan import Action, Blocked, FindingKind, InFlight, Phase, Rail
from devheal.model.policy import ActionKind, Policy, PolicyError
from devheal.model.steps import StepReport

from .builders import device, gpu_id, node, pod, policy, view, workload

STEP = 30.0
T0 = 100_000.0
SERVE = workload("serve", WorkloadClass.INFERENCE)
TRAIN = workload("train", WorkloadClass.GANG)


def reason(
    since: float,
    *,
    source: str = "throttle",
    label: str = "hw-slowdown",
    health: DeviceHealth = DeviceHealth.DEGRADED,
    remedy: Remedy = Remedy.NONE,
    code: int | None = None,
) -> ReportedReason:
    return ReportedReason(source, label, health, remedy, code, since)


def dev(
    index: int, *reasons: ReportedReason, node_name: str = "n1", health: DeviceHealth | None = None
) -> ReportedDevice:
    """A reported device with ``reasons`` (least severe first); its health the worst of theirs."""
    worst = health or (reasons[-1].health or DeviceHealth.HEALTHY if reasons else DeviceHealth.HEALTHY)
    last = reasons[-1] if reasons else None
    return ReportedDevice(
        gpu_id(node_name, index),
        index,
        worst,
        reason=last.label if last else "",
        code=last.code if last else None,
        since=last.since if last else None,
        reasons=reasons,
    )


@dataclass
class World:
    """A one-node cluster the round acts on: its effects (taints, evictions) change what the next round sees."""

    the_policy: Policy
    node: Node = field(default_factory=lambda: node("n1", gpus=2))
    pods: dict[str, Pod] = field(default_factory=dict)
    devices: tuple[ReportedDevice, ...] = ()
    records: dict[str, InFlight] = field(default_factory=dict)
    taken: list[Action] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    now: float = T0

    def view(self) -> ClusterView:
        return view([self.node], self.pods.values(), [NodeDevicesReport("n1", self.devices, updated=self.now)])

    # ---- the round's host -------------------------------------------------------------------------
    def in_flight(self, v: ClusterView) -> list[InFlight]:
        return list(self.records.values())

    def busy(self) -> set[str]:
        return set()

    def start(self, action: Action, resumed: bool) -> None:
        self.taken.append(action)
        self.records[action.name] = replace(
            InFlight.of(action, Phase.SUCCEEDED, self.now), phase=Phase.SUCCEEDED, finished=self.now, resume=None
        )
        n = self.node
        degraded_taints = tuple(t for t in n.taints if t.key != DEGRADED_TAINT_KEY)
        if action.kind in (ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED):
            effect = "PreferNoSchedule" if action.kind is ActionKind.TAINT_DEGRADED else "NoSchedule"
            taints = (*degraded_taints, Taint(DEGRADED_TAINT_KEY, "true", effect))
            self.node = replace(n, taints=taints, owned=n.owned | {DEGRADED_MARK})
        elif action.kind is ActionKind.LIFT_DEGRADED:
            self.node = replace(n, taints=degraded_taints, owned=n.owned - {DEGRADED_MARK}, lifts=n.lifts + 1)
        elif action.kind is ActionKind.CORDON:
            self.node = replace(n, unschedulable=True, owned=n.owned | {"cordon"})
        elif action.kind is ActionKind.TAINT:
            self.node = replace(n, owned=n.owned | {"taint"})
        elif action.kind is ActionKind.DESCHEDULE:
            self.pods.pop(action.target, None)
        elif action.kind is ActionKind.DRAIN:
            self.pods.clear()

    def finish(self, record: InFlight) -> None:
        pass

    def record_blocked(self, item: Blocked) -> None:
        self.blocked.append(item)

    def hold(self, record: InFlight, why: str, rail: object = None) -> None:
        pass

    def report_overdue(self, item: Overdue) -> None:
        pass

    def wider_views(self) -> Iterator[ClusterView]:
        return iter(())

    def kinds(self) -> list[ActionKind]:
        return [a.kind for a in self.taken]


def run(world: World, rounds: DecisionRound, until: float) -> None:
    """Rounds every STEP seconds up to ``until``."""
    while world.now < until:
        world.now += STEP
        rounds.run(world, world.view(), [world.the_policy], world.now)


PLAIN = policy(degradation={"inference": "Notify"})


def test_a_degradation_counts_only_once_it_has_held_for_enter_after() -> None:
    world, rounds = World(PLAIN), DecisionRound()
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 600 - STEP)
    assert world.taken == [], "held 9.5 minutes of 10: nothing yet"
    run(world, rounds, T0 + 600)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED]
    assert world.node.taints == (Taint(DEGRADED_TAINT_KEY, "true", "PreferNoSchedule"),)


def test_a_flapping_device_keeps_one_taint_and_one_record_until_clean_for_leave_after() -> None:
    """Degraded 10 minutes, then two hours of 5 minutes degraded / 5 minutes healthy: one taint, no lift;
    then healthy: lifted once leaveAfter (30 minutes) has passed without a degraded device."""
    world, rounds = World(PLAIN), DecisionRound()
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 600)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED]
    t = T0 + 600
    for _ in range(12):
        world.devices = (dev(0), dev(1))
        run(world, rounds, t + 300)
        world.devices = (dev(0, reason(t + 300)), dev(1))  # the agent's firstSeen starts again after a gap
        run(world, rounds, t + 600)
        t += 600
    assert world.kinds() == [ActionKind.TAINT_DEGRADED], "no lift while the device keeps coming back"
    world.devices = (dev(0), dev(1))
    run(world, rounds, t + 1800 - STEP)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED]
    run(world, rounds, t + 1800 + STEP)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED, ActionKind.LIFT_DEGRADED]
    assert world.node.taints == () and DEGRADED_MARK not in world.node.owned
    assert len(world.records) == 2


def test_the_next_degradation_after_a_lift_is_a_new_episode_with_its_own_record() -> None:
    world, rounds = World(PLAIN), DecisionRound()
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 600)
    world.devices = (dev(0), dev(1))
    run(world, rounds, T0 + 600 + 1800 + STEP)
    again = world.now
    world.devices = (dev(0, reason(again)), dev(1))
    run(world, rounds, again + 600)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED, ActionKind.LIFT_DEGRADED, ActionKind.TAINT_DEGRADED]
    assert len({a.name for a in world.taken}) == 3


def test_severity_sets_the_taint_effect_and_only_hardens_it() -> None:
    world, rounds = World(PLAIN), DecisionRound()
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 600)
    narrow = reason(T0 + 600, source="pcie", label="pcie-width-downtrained", remedy=Remedy.REBOOT_NODE)
    world.devices = (dev(0, reason(T0), narrow), dev(1))
    run(world, rounds, T0 + 1200)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED]
    assert world.node.taints == (Taint(DEGRADED_TAINT_KEY, "true", "NoSchedule"),)
    world.devices = (dev(0, reason(T0)), dev(1))  # the link retrained, the throttle stays: NoSchedule stays
    run(world, rounds, T0 + 2400)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED, ActionKind.FENCE_DEGRADED]


def test_a_pending_row_remap_only_steers_new_pods_away() -> None:
    """NVIDIA: with the row-remapping pending flag set, new workloads can still be launched; the remap takes
    effect at the next GPU reset. So its remedy (ResetGPU) is not one of the default noScheduleRemedies."""
    world, rounds = World(PLAIN), DecisionRound()
    world.devices = (dev(0, reason(T0, source="remap", label="row-remap-pending", remedy=Remedy.RESET_GPU)), dev(1))
    run(world, rounds, T0 + 900)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED]


def test_reasons_outside_the_policys_sources_and_unknown_xids_never_count() -> None:
    rules = DegradationRules()
    app = reason(T0, source="xid", label="XID 13", remedy=Remedy.RESTART_WORKLOAD, code=13)
    unknown = reason(T0, source="xid", label="UnknownXid", code=4242)
    assert degraded(dev(0, app), rules) is None
    assert degraded(dev(0, unknown), rules) is None
    assert degraded(dev(0, reason(T0, health=DeviceHealth.UNHEALTHY), health=DeviceHealth.UNHEALTHY), rules) is None
    assert entered(dev(0, reason(T0)), rules, T0 + 599) is None
    found = entered(dev(0, reason(T0)), rules, T0 + 600)
    assert found is not None and not found.severe and found.since == T0


def test_an_inference_pod_on_a_degraded_gpu_is_descheduled_after_the_grace() -> None:
    world, rounds = World(policy(degradation={"inferenceGrace": "5m"})), DecisionRound()
    serve = pod("serve-1", "n1", owner=SERVE, devices=[device(gpu_id("n1", 0))])
    world.pods = {serve.key: serve}
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 600)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED], "the node first; the pod within its grace"
    run(world, rounds, T0 + 900 - STEP)
    assert serve.key in world.pods
    run(world, rounds, T0 + 900)
    assert world.kinds() == [ActionKind.TAINT_DEGRADED, ActionKind.DESCHEDULE]
    assert world.taken[-1].target == serve.key and world.taken[-1].finding.kind is FindingKind.DEVICE_DEGRADED


def test_inference_notify_records_and_moves_nothing() -> None:
    world, rounds = World(PLAIN), DecisionRound()
    serve = pod("serve-1", "n1", owner=SERVE, devices=[device(gpu_id("n1", 0))])
    world.pods = {serve.key: serve}
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 3600)
    assert sorted(world.kinds()) == sorted([ActionKind.TAINT_DEGRADED, ActionKind.NOTIFY])
    assert serve.key in world.pods


@pytest.mark.parametrize(
    ("choice", "kind"),
    [("ReplaceNow", ActionKind.RESTART_GANG), ("ReplaceAtRestart", ActionKind.NOTIFY), ("Notify", ActionKind.NOTIFY)],
)
def test_a_gang_rank_on_a_degraded_gpu_is_replaced_as_the_policy_says(choice: str, kind: ActionKind) -> None:
    world, rounds = World(policy(degradation={"gang": choice})), DecisionRound()
    rank = pod("train-0", "n1", owner=TRAIN, devices=[device(gpu_id("n1", 0))])
    other = pod("train-1", "n1", owner=TRAIN, devices=[device(gpu_id("n1", 1))])
    world.pods = {rank.key: rank, other.key: other}
    world.devices = (dev(0, reason(T0)), dev(1))
    run(world, rounds, T0 + 600)
    pod_actions = [a for a in world.taken if a.kind is not ActionKind.TAINT_DEGRADED]
    assert [a.kind for a in pod_actions] == [kind]
    assert pod_actions[0].finding.pod == rank.key
    replaced = degraded_ranks(world.view(), [rank, other], [world.the_policy], world.now)
    assert replaced == (set() if choice == "Notify" else {rank.uid}), "what the gang's next restart replaces"


def repeated() -> ReportedDevice:
    xid = reason(T0, source="xid", label="XID 79", health=DeviceHealth.UNHEALTHY, remedy=Remedy.REBOOT_NODE, code=79)
    lemon = reason(T0, source="xid", label="RepeatedXid", health=DeviceHealth.UNHEALTHY, remedy=Remedy.REPLACE_HARDWARE)
    return dev(0, xid, lemon)


def test_a_gpu_failing_again_within_the_window_drains_its_node_for_repair() -> None:
    world, rounds = World(policy()), DecisionRound()
    serve = pod("serve-1", "n1", owner=SERVE, devices=[device(gpu_id("n1", 1))])
    world.pods = {serve.key: serve}
    world.devices = (repeated(), dev(1))
    run(world, rounds, T0 + 5 * STEP)
    assert ActionKind.DRAIN in world.kinds() and ActionKind.CORDON in world.kinds()
    assert ActionKind.REMEDIATE_NODE not in world.kinds(), "not reset (or rebooted) again"
    drain = next(a for a in world.taken if a.kind is ActionKind.DRAIN)
    assert drain.finding.kind is FindingKind.DEVICE_NEEDS_REPAIR and gpu_id("n1", 0) in drain.finding.device_ids
    assert world.pods == {}


def test_repair_notify_only_records() -> None:
    world, rounds = World(policy(repair={"action": "Notify"})), DecisionRound()
    world.devices = (repeated(), dev(1))
    run(world, rounds, T0 + 5 * STEP)
    assert ActionKind.DRAIN not in world.kinds() and ActionKind.NOTIFY in world.kinds()


def unknown_xid_world(*, gap: bool) -> World:
    """The device plugin failed GPU 0 in the pod's status (and, with ``gap``, took it from allocatable); the
    node agent reports it Degraded by an XID it has no row for."""
    world = World(policy())
    world.node = node("n1", gpus=2, allocatable=1 if gap else 2, gap_since=T0 if gap else None)
    serve = pod("serve-1", "n1", owner=SERVE, devices=[device(gpu_id("n1", 0), DeviceHealth.UNHEALTHY)])
    world.pods = {serve.key: serve}
    world.devices = (dev(0, reason(T0, source="xid", label="UnknownXid", code=4242)), dev(1))
    return world


@pytest.mark.parametrize("gap", [False, True])
def test_an_unknown_xid_the_device_plugin_fails_is_reported_never_acted_on(gap: bool) -> None:
    world, rounds = unknown_xid_world(gap=gap), DecisionRound()
    run(world, rounds, T0 + 3600)
    assert world.kinds() == [ActionKind.NOTIFY]
    assert world.taken[0].finding.kind is FindingKind.UNKNOWN_XID and "serve-1" in world.taken[0].target
    kinds = {f.kind for f in detect(world.view(), [world.the_policy], world.now)}
    assert FindingKind.DEVICE_FAILED not in kinds and FindingKind.NODE_DEVICES_FAILED not in kinds


def test_the_same_device_failed_by_the_agent_too_is_a_device_failure() -> None:
    world = unknown_xid_world(gap=False)
    world.devices = (dev(0, reason(T0, source="xid", label="XID 79", health=DeviceHealth.UNHEALTHY)), dev(1))
    kinds = {f.kind for f in detect(world.view(), [world.the_policy], world.now)}
    assert {FindingKind.DEVICE_FAILED, FindingKind.NODE_DEVICES_FAILED} <= kinds


def test_a_silent_agent_never_says_a_degraded_node_recovered() -> None:
    tracker = DegradationTracker()
    marked = node("n1", owned=[DEGRADED_MARK])
    v = view([marked], reports=[NodeDevicesReport("n1", (dev(0),), updated=T0)])
    assert [f.kind for f in tracker.observe(v, [PLAIN], T0)] == [FindingKind.DEGRADATION_RECOVERED]
    assert tracker.observe(v, [PLAIN], T0 + 3600) == [], "stale: neither degraded nor recovered"
    assert tracker.clean_since == {}


def test_clean_reports_never_lift_a_suspect_node() -> None:
    """Marked for what the agent cannot see (a slow rank, a GPU only an exit code accuses): a person lifts it."""
    tracker = DegradationTracker()
    suspect = node("n1", owned=[DEGRADED_MARK, SUSPECT_MARK])
    v = view([suspect], reports=[NodeDevicesReport("n1", (dev(0),), updated=T0)])
    assert tracker.observe(v, [PLAIN], T0) == []
    assert tracker.observe(v, [PLAIN], T0 + 1) == []


def test_a_suspect_nodes_clean_time_counts_from_when_a_person_cleared_the_mark() -> None:
    tracker = DegradationTracker()
    report = NodeDevicesReport("n1", (dev(0),), updated=T0)
    degraded = view([node("n1", owned=[DEGRADED_MARK])], reports=[report])
    assert [f.since for f in tracker.observe(degraded, [PLAIN], T0)] == [T0]
    suspect = view([node("n1", owned=[DEGRADED_MARK, SUSPECT_MARK])], reports=[report])
    assert tracker.observe(suspect, [PLAIN], T0 + 10) == []
    cleared = view([node("n1", owned=[DEGRADED_MARK])], reports=[replace(report, updated=T0 + 5000)])
    assert [f.since for f in tracker.observe(cleared, [PLAIN], T0 + 5000)] == [T0 + 5000]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"enterAfter": "30m", "leaveAfter": "10m"}, "degradation.leaveAfter: must be at least enterAfter"),
        ({"gang": "Restart"}, "degradation.gang: expected one of Notify, ReplaceAtRestart, ReplaceNow"),
        ({"sources": ["ecc", "disk"]}, "degradation.sources: expected a list of"),
        ({"grace": "1m"}, "degradation: unknown field(s) grace"),
        ({"enterAfter": "ten minutes"}, "degradation.enterAfter"),
    ],
)
def test_a_bad_degradation_section_names_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        policy(degradation=spec)


def test_degradation_defaults() -> None:
    rules = policy().degradation
    assert (rules.enter_after, rules.leave_after, rules.inference_grace) == (600.0, 1800.0, 600.0)
    assert rules.no_schedule_remedies == {"RebootNode", "ReplaceHardware"}
    assert policy().repair.action.value == "Drain"
    with pytest.raises(PolicyError, match=r"repair.action: expected one of Drain, Notify"):
        policy(repair={"action": "Reset"})


def test_a_gang_rank_on_a_degraded_gpu_is_replaced_after_the_gangs_next_checkpoint() -> None:
    """``ReplaceAtCheckpoint``: nothing while the gang has saved no checkpoint since the GPU was found degraded;
    the restart once one of its ranks reports one, or once ``stragglers.checkpointWithin`` passed without."""

    def gang(checkpoint: float | None) -> dict[str, Pod]:
        steps = StepReport(count=10, window=5, p50=1.0, last=T0, run=T0 - 100, checkpoint=checkpoint)
        rank = replace(pod("train-0", "n1", owner=TRAIN, devices=[device(gpu_id("n1", 0))]), steps=steps)
        other = replace(pod("train-1", "n1", owner=TRAIN, devices=[device(gpu_id("n1", 1))]), steps=steps)
        return {rank.key: rank, other.key: other}

    # The ranks' reports stand still here: their stall is only recorded.
    stragglers = {"checkpointWithin": "20m", "stall": {"action": "Notify"}}
    rules = {"degradation": {"gang": "ReplaceAtCheckpoint"}, "stragglers": stragglers}
    for checkpointed, why in ((False, "no checkpoint reported within 1200s"), (True, "the gang saved a checkpoint")):
        world, rounds = World(policy(**rules)), DecisionRound()
        world.pods = gang(None)
        world.devices = (dev(0, reason(T0)), dev(1))
        run(world, rounds, T0 + 650)
        assert not [a for a in world.taken if a.kind is ActionKind.RESTART_GANG]
        # Recorded Blocked meanwhile (once: the same reason every round), so the wait shows.
        (waiting,) = [b for b in world.blocked if b.rail is Rail.NEXT_CHECKPOINT]
        assert waiting.action.kind is ActionKind.RESTART_GANG and "next checkpoint" in waiting.why
        # A checkpoint now; or only one from before the GPU was found degraded (at T0): the limit counts from then.
        world.pods = gang(world.now if checkpointed else T0 - 50)
        restarted_by = world.now + STEP if checkpointed else T0 + 1200 + STEP
        run(world, rounds, restarted_by - 2 * STEP)
        assert not [a for a in world.taken if a.kind is ActionKind.RESTART_GANG], checkpointed
        run(world, rounds, restarted_by)
        (restart,) = [a for a in world.taken if a.kind is ActionKind.RESTART_GANG]
        assert restart.finding.pod == "default/train-0" and why in restart.reason, restart.reason
        assert restart.name == waiting.action.name, "the Blocked record is the one taken up"
