"""What devheal writes in each RemediationPolicy's status: written only on change, a condition's
lastTransitionTime kept while its status stays, the breaker's since when it opened."""

from __future__ import annotations

from typing import Any

from devheal.controller.policy_status import policy_statuses
from devheal.engine.breaker import Breaker
from devheal.model.times import format_time

NOW = 1_800_000_000.0


def obj(generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "generation": generation}, "status": status or {}}


def conditions(body: dict[str, Any]) -> dict[str, tuple[str, str, str, str]]:
    return {
        c["type"]: (c["status"], c["reason"], c["message"], c["lastTransitionTime"])
        for c in body["status"]["conditions"]
    }


def test_a_new_policy_is_accepted_and_the_closed_breaker_written_once() -> None:
    [(name, body)] = policy_statuses({"p": obj()}, {}, Breaker(), NOW)
    assert name == "p" and body["status"]["observedGeneration"] == 1
    assert conditions(body) == {
        "Valid": ("True", "Accepted", "policy is in force", format_time(NOW)),
        "CircuitBreakerOpen": ("False", "Closed", "disruptive actions allowed", format_time(NOW)),
    }
    assert list(policy_statuses({"p": obj(status=body["status"])}, {}, Breaker(), NOW + 5)) == []


def test_an_invalid_spec_and_an_open_breaker_say_why_keeping_unchanged_transition_times() -> None:
    [(_, first)] = policy_statuses({"p": obj()}, {}, Breaker(), NOW)
    storm = Breaker(open_since=NOW + 3, reason="3 faulty nodes")
    [(_, body)] = policy_statuses({"p": obj(2, first["status"])}, {"p": "spec.x: expected a number"}, storm, NOW + 9)
    assert body["status"]["observedGeneration"] == 2
    assert conditions(body) == {
        "Valid": ("False", "InvalidSpec", "spec.x: expected a number", format_time(NOW + 9)),
        "CircuitBreakerOpen": ("True", "FaultStorm", "3 faulty nodes", format_time(NOW + 3)),
    }
    [(_, again)] = policy_statuses({"p": obj(3, body["status"])}, {"p": "spec.x: expected a number"}, storm, NOW + 20)
    assert conditions(again) == conditions(body), "only observedGeneration moved"
