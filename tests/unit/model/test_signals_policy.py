"""spec.signals: condition types and taint keys mapped to a class, merged over the documented defaults."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.policy import PolicyError, parse_policy
from devheal.model.signals_policy import DEFAULT_CONDITIONS, SignalClass, SignalRules


def parse(signals: Any) -> SignalRules:
    spec = {"selector": {"nodeSelector": {}}, "signals": signals}
    return parse_policy({"metadata": {"name": "p"}, "spec": spec}).signals


def test_the_defaults_map_the_big_tools_conditions() -> None:
    rules = SignalRules()
    assert rules.condition("GpuPcieWatch") is SignalClass.DEVICES_FAILED  # NVSentinel (DCGM health watch)
    assert rules.condition("SysLogsXIDError") is SignalClass.DEVICES_FAILED  # NVSentinel (syslog)
    assert rules.condition("GpuThermalWatch") is SignalClass.DEGRADED
    assert rules.condition("GPUMissing") is SignalClass.DEVICES_FAILED  # node-problem-detector's GPU check
    assert rules.condition("KernelDeadlock") is SignalClass.NOTIFY  # node-problem-detector's default
    assert rules.condition("MemoryPressure") is SignalClass.IGNORE  # the kubelet's own: not mapped
    assert rules.taints == ()
    assert parse(None) == rules


def test_entries_are_merged_over_the_defaults_and_ignore_switches_one_off() -> None:
    rules = parse(
        {
            "conditions": {"GpuThermalWatch": "Ignore", "CustomGpuCheck": "DevicesFailed"},
            "taints": {"nvidia.com/gpu-xid-error": "DevicesFailed", "example.com/flaky": "Notify"},
        }
    )
    assert rules.condition("GpuThermalWatch") is SignalClass.IGNORE
    assert rules.condition("CustomGpuCheck") is SignalClass.DEVICES_FAILED
    assert rules.condition("GpuPcieWatch") is SignalClass.DEVICES_FAILED  # a default kept
    assert len(rules.conditions) == len(DEFAULT_CONDITIONS) + 1
    assert rules.taint("nvidia.com/gpu-xid-error") is SignalClass.DEVICES_FAILED
    assert rules.taint("example.com/flaky") is SignalClass.NOTIFY


def test_devheal_s_own_taints_are_never_a_signal() -> None:
    rules = parse({"taints": {"devheal.io/device-failure": "DevicesFailed"}})
    assert rules.taint("devheal.io/device-failure") is SignalClass.IGNORE


@pytest.mark.parametrize(
    ("signals", "field"),
    [
        ("on", "spec.signals: expected an object"),
        ({"condition": {}}, "spec.signals: unknown field(s) condition"),
        ({"conditions": ["GpuPcieWatch"]}, "spec.signals.conditions: expected a map"),
        ({"conditions": {"GpuPcieWatch": "Failed"}}, "spec.signals.conditions.GpuPcieWatch: expected one of"),
        ({"taints": {"not a key": "Notify"}}, "spec.signals.taints: 'not a key' is not a valid name"),
        ({"taints": {f"k{i}": "Notify" for i in range(65)}}, "spec.signals.taints: at most 64 entries"),
    ],
)
def test_errors_name_the_policy_and_the_field(signals: Any, field: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse(signals)
    assert str(info.value).startswith(f"RemediationPolicy p: {field}"), str(info.value)
