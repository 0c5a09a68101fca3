"""Result arithmetic: percentiles and summaries over seeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from devheal.simulate.config import build_preset
from devheal.simulate.results import percentile
from devheal.simulate.runner import run_comparison
from devheal.simulate.strategies import lineup


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0


def test_summary_over_seeds_and_json() -> None:
    config = build_preset("mixed", nodes=60, days=10)
    comparison = run_comparison(config, lineup(), seeds=[0, 1, 2])
    data = comparison.to_json()
    summary = data["summary"]["devheal-default"]
    assert summary["seeds"] == [0, 1, 2]
    ettr = summary["training_ettr"]
    assert ettr["min"] <= ettr["mean"] <= ettr["max"] <= 1
    assert len(data["results"]["pod-watcher"]) == 3
    for results in comparison.results.values():
        for r in results:
            assert r.lost_gpu_hours == pytest.approx(sum(r.loss_gpu_hours.values()))
            assert len(r.training_series) == 10  # daily bins


def test_plots_include_the_loss_by_cause(tmp_path: Path) -> None:
    from devheal.simulate import plots

    if not plots.available():
        pytest.skip("matplotlib is an optional extra")
    comparison = run_comparison(build_preset("mixed", nodes=40, days=3), lineup(), seeds=[0])
    written = plots.write_plots(comparison, tmp_path)
    assert [p.name for p in written] == ["goodput_over_time.png", "loss_breakdown.png", "loss_by_cause.png"]
    assert all(p.stat().st_size > 10_000 for p in written)


def test_runs_in_worker_processes_give_the_serial_comparison() -> None:
    config = build_preset("mixed", nodes=40, days=5)
    strategies = lineup(bound=True)
    serial = run_comparison(config, strategies, seeds=[0, 1]).to_json()
    done: list[str] = []
    parallel = run_comparison(config, strategies, seeds=[0, 1], progress=done.append, jobs=2).to_json()
    assert len(done) == 2 * len(strategies)
    for data in (serial, parallel):
        data.pop("run_seconds")
        for results in data["results"].values():
            for r in results:
                r.pop("run_seconds")
    assert list(parallel["results"]) == [s.name for s in strategies]  # devheal-default keeps its name in a worker
    assert parallel == serial


def test_jobs_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="jobs: expected at least 1, got 0"):
        run_comparison(build_preset("mixed", nodes=40, days=1), lineup(), jobs=0)
