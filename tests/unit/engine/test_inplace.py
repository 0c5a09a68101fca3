"""How a pod restarts in place: RestartAllContainers rules (KEP-5532), the launcher, or nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from devheal.engine.inplace import in_place_restart, restart_all_triggers, rule_matches
from devheal.model.restarts import RESTART_ALL_CONTAINERS as RESTART_ALL
from devheal.model.restarts import InPlaceRestart

from ..fuzzing import FUZZ, json_values

ACK = "devheal.io/launcher-generation"


def rule(action: str, operator: str, values: list[int]) -> dict[str, Any]:
    return {"action": action, "exitCodes": {"operator": operator, "values": values}}


def spec_with_sidecar(*rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "initContainers": [
            {"name": "barrier", "image": "devheal"},
            {"name": "watch", "image": "devheal", "restartPolicy": "Always", "restartPolicyRules": list(rules)},
        ],
        "containers": [{"name": "train", "image": "trainer"}],
    }


def test_in_and_not_in_match_exit_codes() -> None:
    assert rule_matches(rule("RestartAllContainers", "In", [88, 89]), 88)
    assert not rule_matches(rule("RestartAllContainers", "In", [88]), 1)
    assert rule_matches(rule("RestartAllContainers", "NotIn", [0]), 137)
    assert not rule_matches(rule("RestartAllContainers", "NotIn", [0]), 0)


def test_malformed_rules_never_match() -> None:
    assert not rule_matches({"action": "RestartAllContainers"}, 88)
    assert not rule_matches(rule("RestartAllContainers", "Between", [88]), 88)
    assert not rule_matches({"action": "RestartAllContainers", "exitCodes": "88"}, 88)


def test_triggers_name_the_containers_with_the_action() -> None:
    spec = spec_with_sidecar(rule("RestartAllContainers", "In", [88]))
    assert restart_all_triggers(spec) == ("watch",)
    assert restart_all_triggers(spec, 88) == ("watch",)
    assert restart_all_triggers(spec, 1) == ()


def test_the_first_matching_rule_wins_as_in_the_kubelet() -> None:
    spec = spec_with_sidecar(rule("Restart", "In", [88]), rule("RestartAllContainers", "In", [88, 89]))
    assert restart_all_triggers(spec, 88) == ()
    assert restart_all_triggers(spec, 89) == ("watch",)


def test_regular_containers_can_trigger_too() -> None:
    spec = {
        "containers": [
            {
                "name": "train",
                "restartPolicy": "Never",
                "restartPolicyRules": [rule("RestartAllContainers", "In", [42])],
            }
        ]
    }
    assert restart_all_triggers(spec, 42) == ("train",)


def test_mechanism_of_a_pod() -> None:
    sidecar = spec_with_sidecar(rule("RestartAllContainers", "In", [88]))
    plain = {"containers": [{"name": "train"}]}
    assert in_place_restart(sidecar, {ACK: "3"}) is InPlaceRestart.RESTART_ALL_CONTAINERS
    assert in_place_restart(sidecar, {}) is InPlaceRestart.RESTART_ALL_CONTAINERS
    assert in_place_restart(plain, {ACK: "0"}) is InPlaceRestart.LAUNCHER
    assert in_place_restart(plain, {}) is InPlaceRestart.NONE
    assert in_place_restart({}, {}) is InPlaceRestart.NONE


@FUZZ
@given(json_values())
def test_a_malformed_spec_never_crashes_the_readers(value: Any) -> None:
    """The pod spec and the launcher's rules come from outside: any JSON shape is read, never raised on."""

    def one_rule(rule: Any) -> dict[str, Any]:
        return {"containers": [{"name": "c", "restartPolicyRules": [rule]}]}

    for spec in (
        {"containers": value},
        {"containers": [{"name": "c", "restartPolicyRules": value}]},
        one_rule({"action": RESTART_ALL, "exitCodes": value}),
        one_rule({"action": RESTART_ALL, "exitCodes": {"operator": "In", "values": value}}),
    ):
        assert isinstance(restart_all_triggers(spec, 1), tuple)
        assert isinstance(in_place_restart(spec, {}), InPlaceRestart)


def test_exit_code_values_of_the_wrong_type_match_nothing() -> None:
    assert not rule_matches({"exitCodes": {"operator": "In", "values": 7}}, 7)
    assert not rule_matches({"exitCodes": {"operator": "In", "values": [True]}}, 1), "a boolean is not an exit code"
    assert restart_all_triggers({"containers": 5}) == ()
