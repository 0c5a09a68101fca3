"""NVML's recovery action in the engine: where the ladder starts, drain first, and the quarantine lifted on None."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from devheal.engine.decide import decide
from devheal.engine.findings import FindingTracker, detect
from devheal.engine.recovery import LadderStart, Requested, cleared, ladder_start
from devheal.model.cluster import ClusterView, DeviceHealth, ReportedDevice, ReportedReason
from devheal.model.node_devices import Remedy
from devheal.model.plan import Finding, FindingKind, InFlight, Phase
from devheal.model.policy import ActionKind, Policy, PolicyError
from devheal.model.recovery_action import RecoveryAction, RecoveryActionReading

from .builders import NOW, gpu_id, node, pod, policy, report, reported, view


def template(kind: str) -> dict[str, str]:
    return {"apiVersion": "example.com/v1", "kind": kind, "namespace": "ops", "name": kind.lower()}


RESET = {"template": template("GPUResetRemediationTemplate"), "timeout": "10m", "remedy": "ResetGPU"}
REBOOT = {"template": template("SelfNodeRemediationTemplate"), "timeout": "30m"}  # medik8s: RebootNode
REPLACE = {"template": template("MachineDeletionRemediationTemplate")}  # medik8s: ReplaceHardware
LADDER = [RESET, REBOOT, REPLACE]


def laddered(ladder: list[dict[str, Any]] = LADDER, **node_rules: Any) -> Policy:
    return policy(node={"escalation": ladder, "remediateAfter": "5m", **node_rules})


def asking(action: RecoveryAction | int, device: str = "GPU-a") -> Requested:
    number = action if isinstance(action, int) else RecoveryActionReading.of(action).value
    return Requested(device, RecoveryActionReading(number))


def failed_device(device_id: str, action: RecoveryAction | None, **changes: Any) -> ReportedDevice:
    reading = None if action is None else RecoveryActionReading.of(action)
    return replace(reported(device_id, since=NOW - 600), recovery_action=reading, **changes)


# ---- the rung the ladder starts at (pure) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "step"),
    [
        (RecoveryAction.GPU_RESET, 0),
        (RecoveryAction.DRAIN_AND_RESET, 0),
        (RecoveryAction.BUS_RESET, 0),
        (RecoveryAction.NODE_REBOOT, 1),
        (RecoveryAction.SYSTEM_REBOOT, 1),
    ],
)
def test_the_ladder_starts_at_the_rung_nvml_asks_for(action: RecoveryAction, step: int) -> None:
    start = ladder_start(laddered().node.ladder, [asking(action)])
    assert start.step == step
    assert action.value in start.reason and "GPU-a" in start.reason and f"step {step + 1}" in start.reason


def test_devices_asking_for_different_rungs_start_at_the_strongest() -> None:
    asked = [asking(RecoveryAction.GPU_RESET, "GPU-a"), asking(RecoveryAction.NODE_REBOOT, "GPU-b")]
    start = ladder_start(laddered().node.ladder, asked)
    assert start.step == 1 and "NodeReboot" in start.reason and "GPU-b" in start.reason


def test_without_a_matching_rung_the_ladder_starts_as_before_and_says_so() -> None:
    start = ladder_start(laddered([RESET, REPLACE]).node.ladder, [asking(RecoveryAction.NODE_REBOOT)])
    assert start.step == 0
    assert "no RebootNode step" in start.reason and "starts at step 1 (GPUResetRemediationTemplate)" in start.reason


def test_a_rung_of_unknown_kind_without_remedy_matches_nothing() -> None:
    custom = {"template": template("RebootRemediationTemplate")}
    start = ladder_start(laddered([RESET, custom]).node.ladder, [asking(RecoveryAction.NODE_REBOOT)])
    assert start.step == 0 and "no RebootNode step" in start.reason


@pytest.mark.parametrize(
    ("action", "shown"),
    [
        (RecoveryAction.DRAIN_P2P, "DrainP2P"),
        (RecoveryAction.RECOVER_IMEX_DOMAIN, "RecoverIMEXDomain"),
        (9, "Unknown (NVML value 9)"),
    ],
)
def test_actions_no_rung_does_start_the_ladder_as_before_and_say_so(action: RecoveryAction | int, shown: str) -> None:
    start = ladder_start(laddered().node.ladder, [asking(action)])
    assert start.step == 0 and shown in start.reason and "no step does that" in start.reason


def test_no_recovery_action_reported_is_the_ladder_as_before() -> None:
    assert ladder_start(laddered().node.ladder, []) == LadderStart()


def test_a_rung_names_what_it_does_and_bad_values_are_refused() -> None:
    ladder = laddered().node.ladder
    assert [rung.does for rung in ladder] == [Remedy.RESET_GPU, Remedy.REBOOT_NODE, Remedy.REPLACE_HARDWARE]
    for bad in ("None", "RestartWorkload", "Reboot"):
        with pytest.raises(PolicyError, match=r"node\.escalation\[0\]\.remedy: expected one of ResetGPU, RebootNode"):
            laddered([{**RESET, "remedy": bad}])


# ---- decisions -------------------------------------------------------------------------------------------------


def idle_failed_view(*devices: ReportedDevice, owned: tuple[str, ...] = ("taint",)) -> ClusterView:
    return view([node("n1", gpus=2, owned=owned)], reports=[report("n1", *devices)])


def findings_of(v: ClusterView, p: Policy, now: float) -> list[Finding]:
    tracker = FindingTracker()
    tracker.observe(detect(v, [p], now - 600), v, [p], now - 600)
    return tracker.observe(detect(v, [p], now), v, [p], now)


def test_an_idle_node_whose_gpu_asks_for_a_reboot_starts_at_the_reboot_rung() -> None:
    p = laddered()
    v = idle_failed_view(failed_device("GPU-a", RecoveryAction.NODE_REBOOT))
    [failed] = findings_of(v, p, NOW)
    assert "NVML recovery action: NodeReboot (NVML_GPU_RECOVERY_ACTION_NODE_REBOOT) on GPU-a" in failed.evidence
    [action] = decide(v, [failed], [p], [], NOW).actions
    assert (action.kind, action.step) == (ActionKind.REMEDIATE_NODE, 1)
    assert "NVML asks for NodeReboot" in action.reason and "step 2 (SelfNodeRemediationTemplate)" in action.reason
    # From there the ladder goes on as always: the reboot rung failing escalates to the next.
    [third] = decide(v, [failed], [p], [InFlight.of(action, Phase.FAILED, NOW)], NOW + 1).actions
    assert third.step == 2 and "failed" in third.reason
    # While the rung runs, nothing more.
    assert decide(v, [failed], [p], [InFlight.of(action, Phase.IN_PROGRESS, NOW)], NOW + 60).actions == ()


def test_without_a_reported_action_the_ladder_starts_at_its_first_rung() -> None:
    p = laddered()
    v = idle_failed_view(failed_device("GPU-a", None))
    [failed] = findings_of(v, p, NOW)
    assert "NVML" not in failed.evidence
    [action] = decide(v, [failed], [p], [], NOW).actions
    assert action.step == 0 and "NVML" not in action.reason


def test_a_ladder_without_the_rung_asked_for_starts_as_before_and_the_record_says_so() -> None:
    p = laddered([RESET, REPLACE])
    v = idle_failed_view(failed_device("GPU-a", RecoveryAction.SYSTEM_REBOOT))
    [action] = decide(v, findings_of(v, p, NOW), [p], [], NOW).actions
    assert action.step == 0 and "SystemReboot" in action.reason and "no RebootNode step" in action.reason


def busy_view(action: RecoveryAction | None) -> ClusterView:
    n = node("n1", gpus=8, owned=("taint",))
    holder = pod("train", "n1", devices=[], gpus=1)
    return view([n], [holder], [report("n1", failed_device(gpu_id("n1", 0), action))])


@pytest.mark.parametrize("action", [RecoveryAction.DRAIN_AND_RESET, RecoveryAction.DRAIN_P2P])
def test_a_busy_node_whose_gpu_asks_to_drain_is_drained_under_a_drain_policy(action: RecoveryAction) -> None:
    p = laddered(remediation="Drain")
    v = busy_view(action)
    [drain] = decide(v, findings_of(v, p, NOW), [p], [], NOW).actions
    assert drain.kind is ActionKind.DRAIN
    assert f"NVML asks for {action.value}" in drain.reason and "must stop first" in drain.reason


def test_one_failed_gpu_without_a_drain_action_does_not_drain_a_busy_node() -> None:
    p = laddered(remediation="Drain")
    for action in (None, RecoveryAction.GPU_RESET):
        v = busy_view(action)
        assert decide(v, findings_of(v, p, NOW), [p], [], NOW).actions == ()


def test_an_idle_only_policy_never_drains_for_nvml() -> None:
    p = laddered()
    v = busy_view(RecoveryAction.DRAIN_AND_RESET)
    assert decide(v, findings_of(v, p, NOW), [p], [], NOW).actions == ()


# ---- None after a fault: the quarantine may be lifted, after the hold-down ------------------------------------


def test_a_quarantined_node_whose_failed_gpu_reads_none_is_lifted_after_the_hold_down() -> None:
    p = laddered(holdDown="2m")
    sick = idle_failed_view(failed_device("GPU-a", RecoveryAction.GPU_RESET))
    fine = idle_failed_view(failed_device("GPU-a", RecoveryAction.NONE))
    tracker = FindingTracker()
    [failed] = tracker.observe(detect(sick, [p], NOW), sick, [p], NOW)
    assert failed.kind is FindingKind.NODE_DEVICES_FAILED
    [recovered] = tracker.observe(detect(fine, [p], NOW + 10), fine, [p], NOW + 10)
    assert recovered.kind is FindingKind.NODE_RECOVERED and recovered.since == NOW + 10
    assert "NVML's recovery action reads None (no action needed) for GPU-a" in recovered.evidence
    assert decide(fine, [recovered], [p], [], NOW + 10 + 119).actions == (), "the usual hold-down"
    [later] = tracker.observe(detect(fine, [p], NOW + 130), fine, [p], NOW + 130)
    [lift] = decide(fine, [later], [p], [], NOW + 130).actions
    assert lift.kind is ActionKind.LIFT
    assert "NVML's recovery action reads None" in lift.finding.evidence


def test_a_node_devheal_has_not_quarantined_yet_is_quarantined_first() -> None:
    p = laddered()
    v = idle_failed_view(failed_device("GPU-a", RecoveryAction.NONE), owned=())
    [failed] = detect(v, [p], NOW)
    assert failed.kind is FindingKind.NODE_DEVICES_FAILED
    assert [a.kind for a in decide(v, [failed], [p], [], NOW).actions] == [ActionKind.TAINT]


def test_a_gpu_to_send_for_repair_keeps_its_node_quarantined_whatever_nvml_says() -> None:
    lemon = ReportedReason("xid", "RepeatedXid", DeviceHealth.UNHEALTHY, Remedy.REPLACE_HARDWARE, 79)
    dev = failed_device("GPU-a", RecoveryAction.NONE, reasons=(lemon,))
    assert not cleared(dev)
    [failed] = detect(idle_failed_view(dev), [laddered()], NOW)
    assert failed.kind is FindingKind.NODE_DEVICES_FAILED


def test_only_an_unhealthy_device_reading_none_is_cleared() -> None:
    assert cleared(failed_device("GPU-a", RecoveryAction.NONE))
    assert not cleared(failed_device("GPU-a", RecoveryAction.GPU_RESET))
    assert not cleared(failed_device("GPU-a", None))
    assert not cleared(failed_device("GPU-a", RecoveryAction.NONE, health=DeviceHealth.HEALTHY))
