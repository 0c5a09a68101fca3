"""Lemon nodes: the excess hazard belongs to the machine, not to its slot in the fleet, and devheal keeps a node that
fails again within 30 days of being lifted out of use (``node.lemonAfter``)."""

from __future__ import annotations

from dataclasses import replace

from devheal.model.policy import RECOMMENDED_POLICY, ActionKind, NodeRules
from devheal.simulate.engine_strategy import EngineStrategy
from devheal.simulate.failures import DAY, HOUR, Fault, TraceSpec, generate_trace
from devheal.simulate.simulation import Simulation
from devheal.simulate.strategies import NodeHealthController

from .builders import fault, small_config, trace_of


def lemon(hours: float, node: int) -> Fault:
    return replace(fault(hours, node, reboot_fixes=True), lemon=True)


def test_a_lemons_own_faults_leave_with_the_machine_a_node_health_controller_replaces() -> None:
    config = small_config(days=2)
    faults = [lemon(2, 1), lemon(30, 1), replace(fault(31, 1), lemon=False)]
    sim = Simulation(config, trace_of(config, faults), NodeHealthController())
    result = sim.run()
    # The first fault gets the machine replaced; the lemon's second fault never happens on the fresh one, an
    # ordinary fault (its share of any node's hazard) still does.
    assert sim.nodes[1].replaced
    assert result.remediations["nhc:recreate-node"] == 2
    assert result.lemon_interruptions == 1


def test_devheal_keeps_a_node_that_fails_again_within_30_days_of_its_lift_out_of_use() -> None:
    config = small_config(spares=2)
    faults = [lemon(2, 1), lemon(10, 1)]  # the second lands on the node back in the spare pool

    def lifts(policy_node: NodeRules) -> tuple[int, Simulation]:
        devheal = EngineStrategy(replace(RECOMMENDED_POLICY, node=policy_node))
        sim = Simulation(config, trace_of(config, faults), devheal)
        sim.run()
        on_node = [r for r in devheal.store.records.values() if r.node == "node-00001"]
        return sum(1 for r in on_node if r.action is ActionKind.LIFT), sim

    count, sim = lifts(RECOMMENDED_POLICY.node)  # lemonAfter: 1
    assert count == 1 and sim.nodes[1].marks and 1 not in sim.pool
    count, sim = lifts(replace(RECOMMENDED_POLICY.node, lemon_after=0))
    assert count == 2 and not sim.nodes[1].marks and 1 in sim.pool


def test_a_lemon_stays_out_until_it_has_been_healthy_30_days_however_old_the_lift_that_made_it_one() -> None:
    """Lifted on day 0, failed again on day 20: a lemon, lifted 30 days after it became healthy again (day 50), not
    at the first round once the lift that made it one is 30 days old (day 35, another node's fault): that lift is
    still read, though older than the window."""
    config = small_config(spares=2, days=60)
    devheal = EngineStrategy(RECOMMENDED_POLICY)  # lemonAfter: 1
    days = DAY / HOUR
    faults = [lemon(2, 1), lemon(20 * days, 1), fault(35 * days, 2)]
    Simulation(config, trace_of(config, faults), devheal).run()
    on_node = [r for r in devheal.store.records.values() if r.node == "node-00001"]
    first, second = sorted(r.started for r in on_node if r.action is ActionKind.LIFT)
    assert first < DAY  # its reboot, then the hold-down
    assert 50 * DAY <= second < 51 * DAY


def test_generated_lemon_faults_are_the_excess_share_of_lemon_nodes_faults() -> None:
    trace = generate_trace(2112, 8, 54 * 24 * HOUR, TraceSpec(), seed=1)
    on_lemons = [f for f in trace.faults if f.node in trace.lemons]
    assert all(f.node in trace.lemons for f in trace.faults if f.lemon)
    assert on_lemons and 0.6 < sum(f.lemon for f in on_lemons) / len(on_lemons) <= 1.0  # (10 - 1) / 10 expected
