"""The sensitivity table: each group of assumptions at 0.5x and 2x, every strategy on the same seeds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.simulate.config import build_preset
from devheal.simulate.sensitivity import (
    CULPRIT_NAMING,
    FACTORS,
    GROUP_FACTORS,
    GROUPS,
    YOUNG_DALY,
    markdown,
    sensitivity,
    variant_name,
    young_daly_interval,
)
from devheal.simulate.strategies import lineup


def test_every_group_moves_its_parameters() -> None:
    config = build_preset("mixed", nodes=40, days=2)
    for name, change in GROUPS.items():
        for factor in GROUP_FACTORS.get(name, FACTORS):
            assert change(config, factor) != config, name
    doubled = GROUPS["restart costs"](config, 2.0)
    assert doubled.fleet.gangs[0].restart_s == 2 * config.fleet.gangs[0].restart_s
    assert doubled.costs.inplace_restart_s == 2 * config.costs.inplace_restart_s
    assert GROUPS["spare pool"](config, 0.5).fleet.spare_nodes == max(1, -(-config.fleet.spare_nodes // 2))
    assert GROUPS["failure rate"](config, 2.0).trace.rate_per_gpu_hour == 2 * config.trace.rate_per_gpu_hour


def test_a_table_row_per_variant_with_devheals_margin() -> None:
    config = build_preset("llama3-405b", nodes=64, days=5)
    rows = sensitivity(config, lineup(), seeds=[0, 1], groups=["mttr"])
    assert [(r.group, r.factor) for r in rows] == [("base", 1.0), ("mttr", 0.5), ("mttr", 2.0)]
    for r in rows:
        baselines = [r.ettr[n] for n in ("kubernetes-default", "node-health-controller", "pod-watcher")]
        assert r.margin_mean == pytest.approx(r.ettr["devheal-default"] - max(baselines), abs=0.02)
        assert r.margin_min <= r.margin_mean
    table = markdown(rows)
    assert table.splitlines()[0].startswith("| variant | kubernetes-default") and "mttr x0.5" in table
    # In worker processes: the same rows.
    assert sensitivity(config, lineup(), seeds=[0, 1], groups=["mttr"], jobs=2) == rows
    with pytest.raises(ValueError, match="unknown lunch"):
        sensitivity(config, lineup(), seeds=[0], groups=["lunch"])


def test_with_the_bound_each_row_says_what_any_strategy_could_reach() -> None:
    config = build_preset("llama3-405b", nodes=64, days=5)
    rows = sensitivity(config, lineup(bound=True), seeds=[0, 1], groups=["detection times"])
    for r in rows:
        assert r.bound_margin_min is not None and r.bound_cut is not None
        assert r.bound_margin_min >= r.margin_min - 1e-9 and r.bound_cut >= r.remediable_cut - 1e-9
    assert "| bound margin min | bound cut |" in markdown(rows).splitlines()[0]
    assert rows[0].to_json()["bound_cut"] == rows[0].bound_cut


def test_culprit_naming_is_an_axis_that_moves_devheal_and_no_baseline() -> None:
    config = build_preset("llama3-405b", nodes=64, days=10)
    # A trace with SSD and IO board faults (seed 4): a rank on a NotReady node and one cut off from its peers are
    # named whatever the step reports say (engine.lost_nodes, the launchers' store probes), so those are what naming
    # still moves.
    config = replace(config, trace=replace(config.trace, rate_per_gpu_hour=4e-4))
    # Spares enough that a rank replaced sooner runs sooner (with the preset's 2, every strategy waits for a repaired
    # node whichever way the culprit was found).
    config = replace(config, fleet=replace(config.fleet, spare_nodes=32))
    rows = sensitivity(config, lineup(), seeds=[4], groups=[CULPRIT_NAMING])
    assert [(r.group, r.factor) for r in rows] == [("base", 1.0)] + [(CULPRIT_NAMING, p) for p in (0.0, 0.5, 1.0)]
    for name in ("kubernetes-default", "node-health-controller", "pod-watcher"):  # they never read step reports
        assert len({r.ettr[name] for r in rows}) == 1, name
    never, always = rows[1].ettr["devheal-default"], rows[3].ettr["devheal-default"]
    assert always > never
    assert "| culprit naming 50% |" in markdown(rows)


def test_the_young_daly_variant_checkpoints_at_the_optimum_for_the_presets_rate() -> None:
    """sqrt(2 x 20 s x 3.1 h between interruptions) = 11.1 min for the llama3-405b preset (docs/simulator.md)."""
    config = build_preset("llama3-405b")
    changed = GROUPS[YOUNG_DALY](config, 1.0)
    assert changed.fleet.gangs[0].checkpoint_interval_s / 60 == pytest.approx(11.1, abs=0.05)
    assert young_daly_interval(config, 20.0, 16_384) == changed.fleet.gangs[0].checkpoint_interval_s
    assert variant_name(YOUNG_DALY, 1.0) == "checkpoint interval Young-Daly"
