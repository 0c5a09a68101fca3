"""The circuit breaker: GPU nodes with a device fault of any kind open it; it stays open after its window until
a cool-down with hysteresis passes or an operator resets it; a restarted controller rebuilds it from the
policies' status, so a restart never closes it."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.engine.breaker import Breaker, step_breaker
from devheal.engine.decide import decide
from devheal.engine.rounds import DecisionRound
from devheal.model.cluster import ClusterView, DeviceHealth, WorkloadClass
from devheal.model.plan import Finding, FindingKind
from devheal.model.policy import RESET_BREAKER_ANNOTATION, ActionKind, BreakerRecord, Policy, parse_policy
from devheal.model.times import format_time

from .builders import NOW, device, gpu_id, node, node_failed, node_recovered, pod, pod_failed, view, workload
from .test_rounds import Host

WINDOW, COOL_DOWN = 600.0, 1800.0
"""The defaults: faults counted over 10 minutes, closed after 30 calm minutes (at most 15 % faulting)."""
T0 = 1_000_000.0  # a time format_time writes to the second
BAD = DeviceHealth.UNHEALTHY


def policy_object(
    name: str = "p", *, reset: str | None = None, status: dict[str, Any] | None = None, **spec: Any
) -> Policy:
    meta: dict[str, Any] = {"name": name}
    if reset is not None:
        meta["annotations"] = {RESET_BREAKER_ANNOTATION: reset}
    spec.setdefault("selector", {"podSelector": {}})
    return parse_policy({"metadata": meta, "spec": spec, "status": status or {}})


def fleet(gpu: int = 10, cpu: int = 0) -> ClusterView:
    return view([node(f"n{i}") for i in range(gpu)] + [node(f"cpu{i}", gpus=0) for i in range(cpu)])


def storm(count: int, since: float) -> list[Finding]:
    return [node_failed(f"n{i}", since=since) for i in range(count)]


def step(prior: Breaker, findings: list[Finding], now: float, *policies: Policy) -> Breaker:
    return step_breaker(prior, fleet(), findings, list(policies) or [policy_object()], now)


# ---- what counts ------------------------------------------------------------------------------


def test_pod_findings_count_by_their_node() -> None:
    owner = workload("web", WorkloadClass.INFERENCE)
    pods = [pod(f"p{i}", f"n{i}", owner=owner, devices=[device(gpu_id(f"n{i}", 0), BAD)]) for i in range(5)]
    kinds = [
        FindingKind.DEVICE_FAILED,
        FindingKind.DEVICE_ERROR_EXIT,
        FindingKind.CRASH_LOOP_ON_DEVICE,
        FindingKind.DEVICE_FAILED,
        FindingKind.DEVICE_FAILED,
    ]
    findings = [pod_failed(p, kind=k) for p, k in zip(pods, kinds, strict=True)]
    v = view([node(f"n{i}") for i in range(10)], pods)
    plan = decide(v, findings[:3], [policy_object()], [], NOW)
    assert not plan.breaker_open  # 3 of 10 is not more than 30 %
    plan = decide(v, findings[:4], [policy_object()], [], NOW)
    assert plan.breaker_open
    assert plan.breaker_reason.startswith("4 of 10 GPU nodes faulted within 600s (> 30%)")
    assert {b.rail for b in plan.blocked} == {"circuit-breaker"}
    # Two findings on one node are one faulty node.
    assert not decide(v, [*findings[:3], node_failed("n0", since=NOW)], [policy_object()], [], NOW).breaker_open


def test_recovered_nodes_do_not_count() -> None:
    findings = [node_recovered(f"n{i}", since=NOW - 10) for i in range(6)]
    assert not step(Breaker(), findings, NOW).open


def test_cpu_only_nodes_do_not_dilute_it() -> None:
    findings = storm(4, NOW)
    state = step_breaker(Breaker(), fleet(10, cpu=90), findings, [policy_object()], NOW)
    assert state.open
    assert state.reason.startswith("4 of 10 GPU nodes faulted")


# ---- it stays open ------------------------------------------------------------------------------


def test_a_storm_that_persists_keeps_it_open_past_its_window_and_the_cool_down() -> None:
    findings = storm(4, T0)  # the nodes stay broken: their findings remain, ever older
    state = step(Breaker(), findings, T0)
    assert state.open and state.open_since == T0
    opened_with = state.reason
    # A round a minute for four hours: the faults began long before the window, but 4 of 10 nodes are still
    # faulty, so it stays open (it once closed 2,401 s after opening while 40 % were still failed).
    t = T0
    while t < T0 + 4 * 3600:
        t += 60
        state = step(state, findings, t)
        assert state.open, f"closed at +{t - T0:.0f}s with 4 of 10 nodes still faulty"
        assert state.reason == opened_with  # one reason while open: blocked decisions are not recorded again
        assert state.calm_since is None


def test_it_stays_open_after_the_storm_until_the_cool_down_has_passed() -> None:
    state = step(Breaker(), storm(4, T0), T0)
    assert state.open
    # The nodes recover at +120 s: their faults stay counted until they leave the window (+660 s, the first
    # round past it), calm from then on, it closes after the cool-down.
    closes = T0 + 660 + COOL_DOWN
    t = T0
    while t < closes:
        assert state.open, f"closed at +{t - T0:.0f}s"
        t += 60
        state = step(state, storm(4, T0) if t < T0 + 120 else [], t)
    assert not state.open
    assert state.closed_at == closes
    assert not state.closed_by_reset


def test_between_the_limit_and_the_closing_threshold_it_stays_open() -> None:
    state = step(Breaker(), storm(4, T0), T0)
    assert state.open
    # For two hours, two of ten nodes (20 %: below the 30 % that opens it, above the 15 % that closes it)
    # keep faulting anew: it stays open.
    for t in range(int(T0) + 60, int(T0) + 7200, 60):
        state = step(state, storm(2, since=t - 30), t)
        assert state.open and state.calm_since is None
    # Then only one node (10 %) keeps faulting: calm once the other's last fault has left the window.
    t0 = T0 + 7200
    state = step(state, storm(1, since=t0 + WINDOW - 30), t0 + WINDOW)
    assert state.recent == (("n0", t0 + WINDOW - 30),)
    assert state.open and state.calm_since == t0 + WINDOW
    # A second node faulting during the cool-down starts it again.
    state = step(state, storm(2, since=t0 + 1000), t0 + 1000)
    assert state.open and state.calm_since is None
    calm = t0 + 1000 + WINDOW + 1
    state = step(state, [], calm)
    assert state.calm_since == calm
    state = step(state, [], calm + COOL_DOWN - 1)
    assert state.open
    state = step(state, [], calm + COOL_DOWN)
    assert not state.open


def test_nodes_that_fault_and_recover_in_waves_still_count_within_the_window() -> None:
    # Waves of two nodes a minute apart, each healthy again by the next wave: two findings at a time.
    first = step(Breaker(), storm(2, T0), T0)
    assert not first.open
    second = step(first, [node_failed(f"n{k}", since=T0 + 60) for k in (2, 3)], T0 + 60)
    assert second.open
    assert second.reason.startswith("4 of 10 GPU nodes faulted within 600s")


def test_a_closing_threshold_and_cool_down_of_the_policy() -> None:
    p = policy_object(budgets={"circuitBreaker": {"closeAtFaultyNodesPercent": 20, "coolDown": "5m"}})
    state = step(Breaker(), storm(4, T0), T0, p)
    later = T0 + WINDOW + 60  # the first storm has left the window; two nodes (20 %) fault anew: calm here
    state = step(state, storm(2, later - 30), later, p)
    assert state.open and state.calm_since == later
    state = step(state, storm(2, later - 30), later + 299, p)
    assert state.open
    state = step(state, storm(2, later - 30), later + 300, p)
    assert not state.open


def test_a_breaker_of_100_percent_never_opens_and_closes_an_open_one() -> None:
    off = policy_object(budgets={"circuitBreaker": {"maxFaultyNodesPercent": 100}})
    assert not step(Breaker(), storm(10, T0), T0, off).open
    assert not step(step(Breaker(), storm(10, T0), T0), storm(10, T0), T0 + 1, off).open


# ---- an operator's reset ------------------------------------------------------------------------


def test_a_new_reset_value_closes_it_and_forgives_the_faults_seen_before() -> None:
    findings = storm(6, T0)
    state = step(Breaker(), findings, T0)
    assert state.open
    reset = policy_object(reset="2024-05-01 first")
    state = step(state, findings, T0 + 60, reset)
    assert not state.open and state.closed_by_reset and state.reset_at == T0 + 60
    # The same value again changes nothing; the faults from before the reset no longer count.
    for t in (T0 + 120, T0 + 180):
        state = step(state, findings, t, reset)
        assert not state.open
    # New faults after the reset open it again; a new value closes it again.
    state = step(state, [*findings, *storm(4, T0 + 200)], T0 + 200, reset)
    assert state.open
    state = step(state, storm(10, T0 + 200), T0 + 260, policy_object(reset="second"))
    assert not state.open and state.reset_at == T0 + 260


def test_a_reset_on_any_policy_counts() -> None:
    state = step(Breaker(), storm(6, T0), T0, policy_object("a"), policy_object("b"))
    state = step(state, storm(6, T0), T0 + 1, policy_object("a"), policy_object("b", reset="x"))
    assert not state.open
    assert state.reset_seen("b") == "x"


# ---- a restart keeps it ------------------------------------------------------------------------------

OPEN_STATUS = {
    "conditions": [
        {
            "type": "CircuitBreakerOpen",
            "status": "True",
            "reason": "FaultStorm",
            "message": "6 of 10 GPU nodes faulted within 600s (> 30%): ...",
            "lastTransitionTime": format_time(T0),
        }
    ],
    "circuitBreakerReset": "old",
}


def test_the_policy_status_records_the_breaker() -> None:
    assert policy_object(status=OPEN_STATUS).breaker_record == BreakerRecord(
        open_since=T0, reason="6 of 10 GPU nodes faulted within 600s (> 30%): ...", reset_seen="old"
    )
    reset = {
        "conditions": [
            {
                "type": "CircuitBreakerOpen",
                "status": "False",
                "reason": "Reset",
                "message": "",
                "lastTransitionTime": format_time(T0),
            }
        ]
    }
    assert policy_object(status=reset).breaker_record == BreakerRecord(reset_at=T0)
    for junk in ({"conditions": "x"}, {"conditions": [1, {"type": "CircuitBreakerOpen"}]}, {"circuitBreakerReset": 3}):
        assert policy_object(status=junk).breaker_record == BreakerRecord()


def test_a_restarted_round_keeps_an_open_breaker_open() -> None:
    # A fresh round (a restarted controller, a new leader) over a calm cluster: the status says open.
    owner = workload("web", WorkloadClass.INFERENCE)
    victim = pod("victim", "n1", owner=owner, devices=[device(gpu_id("n1", 0), BAD)])
    v = view([node(f"n{i}") for i in range(10)], [victim])
    policies = [policy_object(status=OPEN_STATUS, reset="old")]  # the reset already acted on is not a new one
    result = DecisionRound().run(Host(), v, policies, T0 + 3600)
    assert result.breaker.open and result.breaker.open_since == T0
    assert result.plan.breaker_open
    # The pod's eviction and its node's taint (it stops scheduling on a node): both held by the breaker.
    assert {b.action.kind for b in result.plan.blocked} == {ActionKind.DESCHEDULE, ActionKind.TAINT}
    assert {(b.rail, b.why) for b in result.plan.blocked} == {
        ("circuit-breaker", OPEN_STATUS["conditions"][0]["message"])
    }
    # A new reset value does close it.
    policies = [policy_object(status=OPEN_STATUS, reset="new")]
    result = DecisionRound().run(Host(), v, policies, T0 + 3600)
    assert not result.breaker.open and result.breaker.closed_by_reset
    assert victim.key in [a.target for a in result.plan.actions]


def broken_fleet(count: int, since: float) -> ClusterView:
    """Ten GPU nodes, ``count`` of them with no allocatable GPU since ``since`` (a NodeDevicesFailed finding
    under GAP_AT_ONCE)."""
    return view([node(f"n{i}", allocatable=0, gap_since=since) if i < count else node(f"n{i}") for i in range(10)])


GAP_AT_ONCE = {"capacityGapAfter": "0s"}


def test_a_round_carries_the_breaker_and_forgets_it_on_request() -> None:
    rounds, host, policies = DecisionRound(), Host(), [policy_object(node=GAP_AT_ONCE)]
    rounds.run(host, fleet(), policies, T0)
    assert rounds.breaker is not None and not rounds.breaker.open
    assert rounds.run(host, broken_fleet(4, T0), policies, T0 + 1).breaker.open
    assert rounds.run(host, fleet(), policies, T0 + 2).breaker.open  # healthy again: still open (cool-down)
    rounds.forget_breaker()
    assert rounds.breaker is None
    # Nothing recorded in a status here: the next round rebuilds it closed, then counts again.
    assert not rounds.run(host, fleet(), policies, T0 + 3).breaker.open


@pytest.mark.parametrize("minutes", [11, 20, 40])
def test_through_rounds_it_is_still_open_after_its_window(minutes: int) -> None:
    """The defects: it closed once its window had passed (the faults grew older than the window), and the storm
    went on; later, it closed after the cool-down while the nodes were still broken. Now it stays open while
    they are, and closes a cool-down after they recovered."""
    rounds, host, policies = DecisionRound(), Host(), [policy_object(node=GAP_AT_ONCE)]
    broken = broken_fleet(4, T0)  # the nodes stay broken: their findings grow older
    for t in range(0, (minutes + 41) * 60 + 1, 60):
        result = rounds.run(host, broken, policies, T0 + t)
        assert result.plan.breaker_open, f"closed at +{t}s with 4 of 10 nodes broken"
    healed = T0 + (minutes + 42) * 60
    for t in range(0, int(COOL_DOWN), 60):
        result = rounds.run(host, fleet(), policies, healed + t)
        assert result.plan.breaker_open
    assert not rounds.run(host, fleet(), policies, healed + COOL_DOWN).plan.breaker_open
