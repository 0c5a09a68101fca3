"""Step-time aggregation, with a fake clock."""

from __future__ import annotations

import math

import pytest

from devheal.launch.steps import PUBLISHED_WINDOW, InvalidStep, StepStats, percentile


def test_empty_stats_have_no_figures() -> None:
    snap = StepStats(window=10).snapshot(now=5.0)
    assert snap["count"] == 0 and snap["last_step"] is None and snap["window"] == 10
    for key in ("mean_seconds", "p50_seconds", "p90_seconds", "steps_per_second", "last_report_age_seconds"):
        assert snap[key] is None, key


def test_figures_over_the_window() -> None:
    stats = StepStats(window=10)
    for i in range(20):  # 20 steps, one every 0.5 s; durations 1..20 s
        stats.record(float(i + 1), i, now=100.0 + 0.5 * i)
    snap = stats.snapshot(now=112.0)
    assert snap["count"] == 20 and snap["last_step"] == 19 and snap["window_count"] == 10
    assert snap["mean_seconds"] == pytest.approx(15.5)  # mean of 11..20
    assert snap["p50_seconds"] == pytest.approx(15.5)
    assert snap["p90_seconds"] == pytest.approx(19.1)
    assert snap["steps_per_second"] == pytest.approx(2.0)
    assert snap["last_report_age_seconds"] == pytest.approx(2.5)


def test_step_number_is_optional_and_the_last_one_sticks() -> None:
    stats = StepStats()
    stats.record(0.1, 7, now=0.0)
    stats.record(0.1, None, now=1.0)
    assert stats.snapshot(1.0)["last_step"] == 7
    assert stats.count == 2


def test_new_run_forgets_the_window_but_keeps_the_totals() -> None:
    stats = StepStats()
    for i in range(5):
        stats.record(1.0, i, now=float(i))
    stats.new_run()
    snap = stats.snapshot(10.0)
    assert snap["count"] == 5 and snap["last_step"] == 4
    assert snap["mean_seconds"] is None and snap["steps_per_second"] is None
    stats.record(2.0, 5, now=11.0)
    assert stats.snapshot(11.0)["mean_seconds"] == 2.0


def test_rate_needs_two_distinct_arrivals() -> None:
    stats = StepStats()
    stats.record(1.0, 1, now=3.0)
    assert stats.steps_per_second() is None
    stats.record(1.0, 2, now=3.0)
    assert stats.steps_per_second() is None


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1", None, True])
def test_invalid_durations_are_refused(bad: object) -> None:
    stats = StepStats()
    with pytest.raises(InvalidStep, match="duration_seconds"):
        stats.record(bad, 1, now=0.0)  # type: ignore[arg-type]
    assert stats.count == 0


@pytest.mark.parametrize("bad", [1.5, "3", True])
def test_invalid_step_numbers_are_refused(bad: object) -> None:
    with pytest.raises(InvalidStep, match="step"):
        StepStats().record(1.0, bad, now=0.0)  # type: ignore[arg-type]


def test_percentile() -> None:
    assert percentile([5.0], 0.9) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_window_must_hold_a_step() -> None:
    with pytest.raises(ValueError, match="window"):
        StepStats(window=0)


def test_the_published_summary_is_the_recent_median_in_wall_clock_time() -> None:
    stats = StepStats()
    stats.new_run(100.0)
    for i in range(30):
        stats.record(2.0 if i < 20 else 1.0, i, 100.0 + i)
    report = stats.published(now=130.0, wall_now=1_900_000_030.0)
    assert (report.count, report.window, report.p50) == (30, PUBLISHED_WINDOW, 1.0), "the last 10 steps only"
    assert (report.last, report.run) == (1_900_000_029.0, 1_900_000_000.0)
    assert report.interval == 1.0, "the median time between the last 10 reports"
    stats.new_run(140.0)
    fresh = stats.published(now=141.0, wall_now=1_900_000_041.0)
    assert (fresh.count, fresh.window, fresh.p50, fresh.run, fresh.interval) == (30, 0, None, 1_900_000_040.0, None)


def test_the_published_interval_is_the_whole_step_when_the_rank_reports_only_its_own_work() -> None:
    """A DDP rank reports its forward pass (0.1 s) once a step of 0.5 s: the interval says 0.5 s."""
    stats = StepStats()
    stats.new_run(0.0)
    for i in range(12):
        stats.record(0.1, i, 1.0 + 0.5 * i)
    report = stats.published(now=7.0, wall_now=1_900_000_007.0)
    assert (report.p50, report.interval) == (0.1, 0.5)


def test_the_run_reached_its_rendezvous_is_published_once_and_forgotten_by_a_new_run() -> None:
    stats = StepStats()
    stats.new_run(100.0)
    assert stats.published(now=101.0, wall_now=1_900_000_001.0).joined is None
    stats.joined(103.0)
    stats.joined(105.0)  # the first report of it counts
    assert stats.published(now=106.0, wall_now=1_900_000_006.0).joined == 1_900_000_003.0
    stats.new_run(110.0)
    assert stats.published(now=111.0, wall_now=1_900_000_011.0).joined is None


def test_the_runs_latest_checkpoint_is_published_and_forgotten_by_a_new_run() -> None:
    stats = StepStats()
    stats.new_run(100.0)
    assert stats.published(now=101.0, wall_now=1_900_000_001.0).checkpoint is None
    stats.checkpointed(103.0)
    stats.checkpointed(105.0)  # the latest counts
    assert stats.published(now=106.0, wall_now=1_900_000_006.0).checkpoint == 1_900_000_005.0
    stats.new_run(110.0)
    assert stats.published(now=111.0, wall_now=1_900_000_011.0).checkpoint is None


def test_the_runs_collective_count_is_published_never_goes_back_and_is_forgotten_by_a_new_run() -> None:
    stats = StepStats()
    stats.new_run(100.0)
    assert stats.published(now=101.0, wall_now=1_900_000_001.0).collectives is None
    stats.entered_collectives(12)
    stats.entered_collectives(9)  # a late post of an older count
    assert stats.published(now=102.0, wall_now=1_900_000_002.0).collectives == 12
    for bad in (-1, 1.5, True, "3", None):
        with pytest.raises(InvalidStep, match="collectives must be a whole number >= 0"):
            stats.entered_collectives(bad)
    stats.new_run(110.0)
    assert stats.published(now=111.0, wall_now=1_900_000_011.0).collectives is None


def test_the_runs_collective_marks_say_whether_it_is_inside_one_and_since_when() -> None:
    stats = StepStats()
    stats.new_run(100.0)
    unmarked = stats.published(now=101.0, wall_now=1_900_000_001.0)
    assert (unmarked.exits, unmarked.inside) == (None, None)
    stats.collective_marks(12, 11, 0.5, now=104.0)  # inside its 12th collective since 103.5
    inside = stats.published(now=110.0, wall_now=1_900_000_010.0)
    assert (inside.collectives, inside.exits, inside.inside) == (12, 11, 1_900_000_003.5)
    stats.collective_marks(12, 12, None, now=111.0)
    outside = stats.published(now=112.0, wall_now=1_900_000_012.0)
    assert (outside.collectives, outside.exits, outside.inside) == (12, 12, None)
    stats.new_run(120.0)
    fresh = stats.published(now=121.0, wall_now=1_900_000_021.0)
    assert (fresh.collectives, fresh.exits, fresh.inside) == (None, None, None)


@pytest.mark.parametrize(
    ("count", "exits", "inside", "why"),
    [
        (5, 6, None, r"exits must be a whole number within 0..collectives \(5\), got 6"),
        (5, True, None, "exits must be a whole number within 0..collectives"),
        (5, 4, -1.0, "inside_seconds must be a finite number >= 0 or null, got -1.0"),
        (5, 4, float("inf"), "inside_seconds must be a finite number >= 0 or null"),
        (5, 4, "1", "inside_seconds must be a number >= 0 or null, got '1'"),
        (5, 5, 1.0, r"inside_seconds given, but every collective entered \(5\) was left"),
        (-1, 0, None, "collectives must be a whole number >= 0"),
    ],
)
def test_bad_collective_marks_are_refused_and_nothing_is_kept(
    count: object, exits: object, inside: object, why: str
) -> None:
    stats = StepStats()
    stats.new_run(100.0)
    with pytest.raises(InvalidStep, match=why):
        stats.collective_marks(count, exits, inside, now=101.0)
    assert (stats.collectives, stats.exits, stats.inside_since) == (None, None, None)
