"""decide within the node budgets: unhealthy nodes cluster-wide and per pool."""

from __future__ import annotations

from devheal.engine.decide import decide
from devheal.model.cluster import Node
from devheal.model.plan import Action, InFlight, Phase
from devheal.model.policy import ActionKind, Policy

from .builders import NOW, gpu_id, node, node_failed, policy, report, reported, view

NO_BREAKER = {"circuitBreaker": {"maxFaultyNodesPercent": 100}}


def budgeted(**budgets: object) -> Policy:
    return policy(budgets={"maxUnhealthyNodesPerPool": "100%", **NO_BREAKER, **budgets})


def targets(actions: tuple[Action, ...]) -> list[str]:
    return [a.target for a in actions]


def test_max_unhealthy_nodes_blocks_the_second_node() -> None:
    v = view([node(f"n{i}") for i in range(1, 5)])
    plan = decide(v, [node_failed("n1"), node_failed("n2")], [budgeted(maxUnhealthyNodes=1)], [], NOW)
    assert targets(plan.actions) == ["n1"]
    [blocked] = plan.blocked
    assert (blocked.action.kind, blocked.action.target, blocked.rail) == (ActionKind.TAINT, "n2", "max-unhealthy-nodes")
    assert blocked.why == "max unhealthy nodes 1 reached: 1 of 4 GPU nodes already out (n1)"


def test_a_percentage_budget_counts_selected_nodes() -> None:
    nodes = [node(f"n{i}") for i in range(10)] + [node(f"x{i}", pool="x") for i in range(10)]
    only_pool_a = policy(
        selector={"nodeSelector": {"matchLabels": {"devheal.io/pool": "a"}}},
        budgets={"maxUnhealthyNodes": "20%", "maxUnhealthyNodesPerPool": "100%", **NO_BREAKER},
    )
    findings = [node_failed(f"n{i}") for i in range(4)]
    plan = decide(view(nodes), findings, [only_pool_a], [], NOW)
    assert targets(plan.actions) == ["n0", "n1"]
    assert [b.rail for b in plan.blocked] == ["max-unhealthy-nodes"] * 2
    assert "2 of 10 GPU nodes already out" in plan.blocked[0].why


def test_nodes_already_out_count_against_the_budget() -> None:
    v = view([node("n1", owned=["cordon"]), node("n2"), node("n3"), node("n4")])
    plan = decide(v, [node_failed("n2")], [budgeted(maxUnhealthyNodes=1)], [], NOW)
    assert plan.actions == ()
    assert plan.blocked[0].why.endswith("1 of 4 GPU nodes already out (n1)")


def test_active_node_remediations_count_against_the_budget() -> None:
    v = view([node(f"n{i}") for i in range(1, 5)])
    draining = InFlight("drain-n1", ActionKind.DRAIN, "Node", "n1", "n1", Phase.IN_PROGRESS, NOW - 5)
    finished = InFlight("drain-n1-old", ActionKind.DRAIN, "Node", "n3", "n3", Phase.SUCCEEDED, NOW - 500)
    ps = [budgeted(maxUnhealthyNodes=1)]
    assert [b.rail for b in decide(v, [node_failed("n2")], ps, [draining], NOW).blocked] == ["max-unhealthy-nodes"]
    assert targets(decide(v, [node_failed("n2")], ps, [finished], NOW).actions) == ["n2"]


def test_a_node_already_out_may_take_its_next_step() -> None:
    v = view([node("n1", owned=["taint"]), node("n2", owned=["taint"])])
    cordoning = [policy(node={"cordon": True}, budgets={"maxUnhealthyNodes": 1, **NO_BREAKER})]
    [cordon] = decide(v, [node_failed("n1")], cordoning, [], NOW).actions
    assert (cordon.kind, cordon.target) == (ActionKind.CORDON, "n1")


def test_zero_budget_takes_no_node_out() -> None:
    v = view([node("n1"), node("n2")])
    plan = decide(v, [node_failed("n1")], [budgeted(maxUnhealthyNodes="0%")], [], NOW)
    assert plan.actions == ()
    assert [b.rail for b in plan.blocked] == ["max-unhealthy-nodes"]


def test_per_pool_limit() -> None:
    nodes = [node("a1", pool="a"), node("a2", pool="a"), node("b1", pool="b"), node("b2", pool="b")]
    ps = [policy(budgets={"maxUnhealthyNodes": "100%", "maxUnhealthyNodesPerPool": 1, **NO_BREAKER})]
    plan = decide(view(nodes), [node_failed("a1"), node_failed("a2"), node_failed("b1")], ps, [], NOW)
    assert targets(plan.actions) == ["a1", "b1"]
    [blocked] = plan.blocked
    assert (blocked.action.target, blocked.rail) == ("a2", "max-unhealthy-nodes-per-pool")
    assert blocked.why == "max unhealthy nodes per pool 1 reached in pool a: 1 of 2 out"


def test_per_pool_percentage_default() -> None:
    nodes = [node(f"a{i}", pool="a") for i in range(4)]
    ps = [policy(budgets={"maxUnhealthyNodes": "100%", **NO_BREAKER})]
    plan = decide(view(nodes), [node_failed(f"a{i}") for i in range(4)], ps, [], NOW)
    assert targets(plan.actions) == ["a0", "a1"]
    assert [b.rail for b in plan.blocked] == ["max-unhealthy-nodes-per-pool"] * 2


def test_nodes_without_the_pool_label_share_one_pool() -> None:
    nodes = [node("u1", pool=""), node("u2", pool=""), node("a1", pool="a")]
    ps = [policy(budgets={"maxUnhealthyNodes": "100%", "maxUnhealthyNodesPerPool": 1, **NO_BREAKER})]
    plan = decide(view(nodes), [node_failed("u1"), node_failed("u2")], ps, [], NOW)
    assert targets(plan.actions) == ["u1"]
    assert "in pool (none)" in plan.blocked[0].why


# ---- GPU nodes only: CPU-only nodes under the same policy do not widen the budgets ----------------------------


def gpu_and_cpu_nodes(gpu: int, cpu: int, *, cpu_pool: str = "a") -> list[Node]:
    return [node(f"gpu{i:02d}", gpus=8) for i in range(gpu)] + [
        node(f"cpu{i:02d}", gpus=0, pool=cpu_pool) for i in range(cpu)
    ]


def test_ten_gpu_and_ninety_cpu_nodes_taint_one_gpu_node_at_a_time() -> None:
    # The defect: 10% of 100 selected nodes let all 10 GPU nodes be tainted.
    findings = [node_failed(f"gpu{i:02d}") for i in range(10)]
    # The default 10%; no breaker (10 of 10 GPU nodes faulty would open it, and it holds taints too).
    plan = decide(view(gpu_and_cpu_nodes(10, 90)), findings, [policy(budgets=NO_BREAKER)], [], NOW)
    assert targets(plan.actions) == ["gpu00"]
    assert [b.rail for b in plan.blocked] == ["max-unhealthy-nodes"] * 9
    assert "1 of 10 GPU nodes already out (gpu00)" in plan.blocked[0].why


def test_the_per_pool_budget_counts_the_pools_gpu_nodes() -> None:
    nodes = gpu_and_cpu_nodes(4, 40)  # one pool: 4 GPU nodes and 40 CPU-only nodes
    ps = [policy(budgets={"maxUnhealthyNodes": "100%", **NO_BREAKER})]  # the default 50% per pool
    plan = decide(view(nodes), [node_failed(f"gpu{i:02d}") for i in range(4)], ps, [], NOW)
    assert targets(plan.actions) == ["gpu00", "gpu01"]
    assert plan.blocked[0].why == "max unhealthy nodes per pool 50% reached in pool a: 2 of 4 out"


def test_a_node_with_an_agent_report_or_already_out_is_a_gpu_node() -> None:
    # No GPU capacity (its device plugin is gone) but an agent report, or a devheal mark: still GPU nodes.
    nodes = [node("reported", gpus=0), node("marked", gpus=0, owned=["taint"]), node("cpu", gpus=0)]
    v = view(nodes, reports=[report("reported", reported(gpu_id("reported", 0)))])
    plan = decide(v, [node_failed("reported")], [budgeted(maxUnhealthyNodes="50%")], [], NOW)
    assert plan.actions == ()
    assert plan.blocked[0].why.startswith("max unhealthy nodes 50% reached: 1 of 2 GPU nodes already out")


def test_no_gpu_node_allows_no_percentage() -> None:
    plan = decide(view(gpu_and_cpu_nodes(0, 5)), [node_failed("cpu00")], [budgeted(maxUnhealthyNodes="10%")], [], NOW)
    assert plan.actions == ()
