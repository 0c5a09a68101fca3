"""The simulated cache: a settled node's objects are reused only while nothing devheal wrote on it changed."""

from __future__ import annotations

from devheal.model.degradation_policy import DEGRADED_MARK
from devheal.simulate.engine_view import CacheView
from devheal.simulate.simulation import Simulation
from devheal.simulate.strategies import KubernetesDefault

from .builders import small_config, trace_of


def test_a_degraded_taints_escalated_effect_shows_on_a_settled_node() -> None:
    config = small_config()
    cache = CacheView(Simulation(config, trace_of(config, []), KubernetesDefault()))
    cache.sim.nodes[1].marks.add(DEGRADED_MARK)
    first = cache._objects(1)[0]
    assert [t.effect for t in first.taints] == ["PreferNoSchedule"]
    cache.degraded_effect[1] = "NoSchedule"  # a rank there is fenced: the same marks, a harder effect
    assert [t.effect for t in cache._objects(1)[0].taints] == ["NoSchedule"]
