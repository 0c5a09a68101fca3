"""The yardstick: a strategy's lead over the best baseline per seed, its share of the bound's, and what is left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from devheal.cli.app import app
from devheal.simulate.config import build_preset
from devheal.simulate.leads import leads, margins
from devheal.simulate.results import StrategyResult
from devheal.simulate.runner import run_comparison
from devheal.simulate.strategies import lineup

HOURS = 1000.0
"""Training GPU-hours of each made-up run: 1 GPU for 1,000 hours."""


def result(name: str, seed: int, **lost: float) -> StrategyResult:
    """A run that lost ``lost`` training GPU-hours by cause (all as rollback): its ETTR follows from them."""
    return StrategyResult(
        strategy=name,
        description="",
        seed=seed,
        horizon_s=HOURS * 3600,
        training_gpus=1,
        training_ettr=1 - sum(lost.values()) / HOURS,
        inference_availability=None,
        batch_goodput=None,
        fleet_goodput=0.0,
        interruptions=0,
        faults=0,
        faults_absorbed=0,
        loss_gpu_hours={},
        training_loss_gpu_hours={},
        remediations={},
        recoveries_s=[],
        series_bin_s=3600.0,
        training_series=[],
        min_spares=0,
        repair_node_hours=0.0,
        broken_node_hours=0.0,
        events=0,
        training_loss_by_cause={cause: {"rollback": hours} for cause, hours in lost.items()},
    )


def results(**runs: list[dict[str, float]]) -> dict[str, list[StrategyResult]]:
    return {name: [result(name, seed, **lost) for seed, lost in enumerate(per_seed)] for name, per_seed in runs.items()}


RUNS = results(
    **{
        "kubernetes-default": [{"network": 200, "sdc": 100}, {"network": 300, "sdc": 100}],
        "pod-watcher": [{"network": 150, "sdc": 100}, {"network": 320, "sdc": 100}],
        "devheal-default": [{"network": 60, "sdc": 100}, {"network": 110, "sdc": 150}],
        "ideal-bound": [{"network": 50, "sdc": 50}, {"network": 100, "sdc": 50}],
    }
)


def test_the_lead_is_over_the_best_baseline_of_each_seed() -> None:
    # Seed 0: the pod watcher is best (ETTR 0.75), seed 1 kubernetes-default (0.6).
    assert margins(RUNS, "devheal-default") == pytest.approx([0.09, 0.14])
    assert margins(RUNS, "ideal-bound") == pytest.approx([0.15, 0.25])


def test_the_share_of_the_bounds_lead_and_what_most_of_the_rest_is() -> None:
    (lead,) = leads(RUNS, [0, 1])
    assert lead.strategy == "devheal-default"
    assert lead.share == pytest.approx((0.6, 0.56))
    assert lead.worst() == (pytest.approx(0.56), 1)
    # Beyond the bound's: sdc 50 and 100 (mean 75), network 10 both (mean 10).
    assert lead.gap == pytest.approx({"sdc": 75.0, "network": 10.0})
    assert lead.matched is not None and lead.matched[0] == "sdc"
    # Losing the bound's 50 to sdc: seed 0 leads by 0.14 of the bound's 0.15, seed 1 by 0.24 of 0.25.
    assert lead.matched[1] == pytest.approx((0.14 / 0.15, 0.24 / 0.25))
    assert lead.summary() == [
        "devheal-default: leads the best baseline by +11.50 points (+9.00 to +14.00 over the seeds); "
        "takes 58.0% (worst 56.0%, seed 1) of the ideal bound's lead",
        "  sdc is 88% of the training GPU-hours it loses beyond the bound's; losing no more than the bound to sdc, "
        "it would take 94.7% (worst 93.3%, seed 0)",
    ]
    saved = lead.to_json()
    assert saved["share_worst"] == {"share": pytest.approx(0.56), "seed": 1}
    assert saved["share_if_matched"]["cause"] == "sdc"
    json.dumps(saved)


def test_without_the_bound_only_the_lead_and_a_seed_the_bound_does_not_lead_has_no_share() -> None:
    unbound = {name: runs for name, runs in RUNS.items() if name != "ideal-bound"}
    (lead,) = leads(unbound, [0, 1])
    assert lead.share is None and lead.gap is None
    assert lead.summary() == [
        "devheal-default: leads the best baseline by +11.50 points (+9.00 to +14.00 over the seeds)"
    ]
    even = dict(RUNS, **results(**{"ideal-bound": [{"network": 150, "sdc": 100}, {"network": 100, "sdc": 50}]}))
    (lead,) = leads(even, [0, 1])
    assert lead.share is not None and lead.share[0] is None
    assert lead.worst() == (pytest.approx(0.56), 1)


def test_no_leads_without_a_baseline_or_without_training() -> None:
    assert leads({"devheal-default": RUNS["devheal-default"]}, [0, 1]) == []
    untrained = {
        name: [r.__class__(**{**r.__dict__, "training_ettr": None}) for r in runs] for name, runs in RUNS.items()
    }
    assert leads(untrained, [0, 1]) == []
    with pytest.raises(ValueError, match="no baseline ran"):
        margins({"devheal-default": RUNS["devheal-default"]}, "devheal-default")


def test_a_simulated_comparison_adds_up() -> None:
    """The gap by cause is the ETTR the strategy leaves to the bound, in GPU-hours, on a real (small) run."""
    config = build_preset("llama3-405b", nodes=64, days=5)
    comparison = run_comparison(config, lineup(bound=True), seeds=[0, 1])
    (lead,) = comparison.leads()
    ours, bound = comparison.results["devheal-default"], comparison.results["ideal-bound"]
    assert lead.gap is not None and lead.share is not None
    capacity = [r.training_gpus * r.horizon_s / 3600 for r in ours]
    left = sum(
        ((b.training_ettr or 0) - (o.training_ettr or 0)) * c for o, b, c in zip(ours, bound, capacity, strict=True)
    )
    assert left > 0  # the bound leads: the identity is not 0 = 0
    assert sum(lead.gap.values()) == pytest.approx(left / len(ours))
    assert comparison.to_json()["leads"]["devheal-default"]["seeds"] == [0, 1]


def test_simulate_prints_the_lead_and_writes_it(tmp_path: Path) -> None:
    args = ["simulate", "--preset", "llama3-405b", "--nodes", "64", "--days", "5", "--seeds", "2", "--bound"]
    out = CliRunner().invoke(app, [*args, "--no-plots", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "devheal-default: leads the best baseline by" in out.output
    assert "of the ideal bound's lead" in out.output
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["leads"]) == {"devheal-default"}
