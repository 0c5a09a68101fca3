"""NVML's recovery action: the names and numbers nvidia-ml-py gives, unknown numbers kept, the ladder rung asked for."""

from __future__ import annotations

import pynvml
import pytest

from devheal.model.node_devices import Remedy
from devheal.model.recovery_action import (
    FIELD_ID,
    LADDER_REMEDY,
    NVML_NAMES,
    NVML_VALUES,
    RecoveryAction,
    RecoveryActionReading,
    reported_recovery_action,
)
from tests.unit.crds.test_crd_manifests import schema


def test_the_numbers_and_names_are_nvidia_ml_pys() -> None:
    assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == FIELD_ID
    for number, action in NVML_VALUES.items():
        assert getattr(pynvml, NVML_NAMES[action]) == number, action
    named = {n for n in dir(pynvml) if n.startswith("NVML_GPU_RECOVERY_ACTION_")}
    assert named == set(NVML_NAMES.values()), "every action nvidia-ml-py names, no other"


def test_the_crd_accepts_every_action_and_only_those() -> None:
    device = schema("NodeDevices")["properties"]["status"]["properties"]["devices"]["items"]
    assert device["properties"]["recoveryAction"]["properties"]["action"]["enum"] == [a.value for a in RecoveryAction]


def test_a_number_this_version_does_not_know_is_unknown_and_kept() -> None:
    reading = RecoveryActionReading(9)
    assert reading.action is RecoveryAction.UNKNOWN
    assert reading.to_status() == {"action": "Unknown", "value": 9}
    assert reading.describe() == "Unknown (NVML value 9)"
    assert RecoveryActionReading(1).describe() == "GPUReset (NVML_GPU_RECOVERY_ACTION_GPU_RESET)"
    with pytest.raises(ValueError, match="no NVML number"):
        RecoveryActionReading.of(RecoveryAction.UNKNOWN)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"action": "GPUReset", "value": 1}, 1),
        ({"action": "Unknown", "value": 12}, 12),
        ({"action": "SomethingNewer", "value": 12}, 12),  # a newer agent's name: the number counts
        ({"action": "NodeReboot"}, 2),  # no number: a known name gives it
        (None, None),  # an older agent: no field
        ({"action": "SomethingNewer"}, None),
        ({"value": -1}, None),
        ({"value": True}, None),
        ("GPUReset", None),
    ],
)
def test_reading_a_reported_action(raw: object, expected: int | None) -> None:
    reading = reported_recovery_action(raw)
    assert (None if reading is None else reading.value) == expected


def test_each_action_asks_for_a_rung_or_none() -> None:
    assert LADDER_REMEDY[RecoveryAction.GPU_RESET] is Remedy.RESET_GPU
    assert LADDER_REMEDY[RecoveryAction.DRAIN_AND_RESET] is Remedy.RESET_GPU
    assert LADDER_REMEDY[RecoveryAction.BUS_RESET] is Remedy.RESET_GPU
    assert LADDER_REMEDY[RecoveryAction.NODE_REBOOT] is Remedy.REBOOT_NODE
    assert LADDER_REMEDY[RecoveryAction.SYSTEM_REBOOT] is Remedy.REBOOT_NODE
    no_rung = {RecoveryAction.NONE, RecoveryAction.DRAIN_P2P, RecoveryAction.RECOVER_IMEX_DOMAIN}
    no_rung.add(RecoveryAction.UNKNOWN)
    assert set(RecoveryAction) - set(LADDER_REMEDY) == no_rung
