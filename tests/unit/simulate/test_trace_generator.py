"""The trace generator: calibrated rates per class, reproducible seeds, lemons, gray nodes, bursts."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from devheal.simulate.failures import (
    CLASSES,
    DAY,
    LLAMA3_RATE,
    FailureClass,
    Signal,
    TraceError,
    TraceSpec,
    generate_trace,
)

NODES, GPUS = 2048, 8


def test_default_rate_is_llama3_419_interruptions_in_54_days_on_16384_gpus() -> None:
    assert pytest.approx(419 / (16384 * 54 * 24)) == LLAMA3_RATE
    assert pytest.approx(1.97e-5, rel=0.01) == LLAMA3_RATE
    assert sum(c.count for c in CLASSES.values()) == 419


def test_class_weights_follow_the_published_counts() -> None:
    rates = TraceSpec().class_rates()
    assert sum(rates.values()) == pytest.approx(LLAMA3_RATE)
    assert rates["faulty-gpu"] / LLAMA3_RATE == pytest.approx(148 / 419)
    assert rates["gpu-hbm3"] / LLAMA3_RATE == pytest.approx(72 / 419)
    gpu_related = sum(c.count for c in CLASSES.values() if c.signal in (Signal.DEVICE, Signal.SILENT))
    assert gpu_related == 268  # faulty GPU, HBM3, SRAM, system processor, thermal, SDC


def test_total_and_per_class_counts_match_the_rates_within_poisson_tolerance() -> None:
    days = 540.0  # ten Llama 3 snapshots: about 4,200 failures
    spec = TraceSpec(burst_probability=0.0)
    trace = generate_trace(NODES, GPUS, days * DAY, spec, seed=11)
    expected_total = LLAMA3_RATE * NODES * GPUS * days * 24
    assert abs(len(trace.faults) - expected_total) < 4 * math.sqrt(expected_total)
    counts = trace.counts_by_class()
    for name, rate in spec.class_rates().items():
        expected = rate * NODES * GPUS * days * 24
        assert abs(counts[name] - expected) < 4 * math.sqrt(expected) + 2, name


def test_bursts_keep_the_expected_total() -> None:
    spec = TraceSpec(burst_probability=0.3, burst_extra=(2, 4))
    totals = [len(generate_trace(NODES, GPUS, 108 * DAY, spec, seed).faults) for seed in range(4)]
    expected = LLAMA3_RATE * NODES * GPUS * 108 * 24
    # Clustered arrivals vary more than Poisson: allow a wider band, but the mean stays put.
    assert abs(sum(totals) / len(totals) - expected) < 0.08 * expected


def test_bursts_cluster_in_time_and_rack() -> None:
    spec = TraceSpec(burst_probability=1.0, burst_extra=(1, 1), rack_size=4)
    trace = generate_trace(64, GPUS, 300 * DAY, spec, seed=3)
    pairs = 0
    for a, b in zip(trace.faults, trace.faults[1:], strict=False):
        if b.time - a.time <= spec.burst_window_s and a.cls == b.cls and a.node // 4 == b.node // 4:
            pairs += 1
    assert pairs >= len(trace.faults) // 4


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    spec = TraceSpec()
    one = generate_trace(NODES, GPUS, 54 * DAY, spec, seed=7)
    again = generate_trace(NODES, GPUS, 54 * DAY, spec, seed=7)
    other = generate_trace(NODES, GPUS, 54 * DAY, spec, seed=8)
    assert one.faults == again.faults
    assert one.lemons == again.lemons and one.slow == again.slow
    assert one.faults != other.faults


def test_faults_are_sorted_and_inside_the_fleet_and_horizon() -> None:
    trace = generate_trace(300, 4, 30 * DAY, TraceSpec(), seed=1)
    trace.validate()
    assert all(0 <= f.node < 300 and 0 <= f.gpu < 4 and 0 <= f.time < 30 * DAY for f in trace.faults)
    assert [f.time for f in trace.faults] == sorted(f.time for f in trace.faults)


def test_lemon_nodes_fail_more_often() -> None:
    spec = TraceSpec(lemon_fraction=0.02, lemon_hazard=10.0, burst_probability=0.0)
    trace = generate_trace(1000, GPUS, 2000 * DAY, spec, seed=5)
    per_node = Counter(f.node for f in trace.faults)
    assert len(trace.lemons) == 20
    lemon_mean = sum(per_node[n] for n in trace.lemons) / len(trace.lemons)
    other_mean = sum(c for n, c in per_node.items() if n not in trace.lemons) / (1000 - len(trace.lemons))
    assert 7.0 < lemon_mean / other_mean < 13.0


def test_gray_nodes_are_half_a_percent_and_1_1_to_1_5_slow() -> None:
    trace = generate_trace(2000, GPUS, DAY, TraceSpec(), seed=2)
    assert len(trace.slow) == 10
    assert all(1.1 <= s <= 1.5 for s in trace.slow.values())


def test_reboot_fixes_follows_the_class_probability() -> None:
    trace = generate_trace(NODES, GPUS, 540 * DAY, TraceSpec(burst_probability=0.0), seed=4)
    gsp = [f for f in trace.faults if f.cls == "gpu-system-processor"]
    share = sum(f.reboot_fixes for f in gsp) / len(gsp)
    assert abs(share - CLASSES["gpu-system-processor"].reboot_fixes) < 0.12
    assert not any(f.reboot_fixes for f in trace.faults if f.cls == "sdc")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (TraceSpec(rate_per_gpu_hour=-1.0), "rate_per_gpu_hour"),
        (TraceSpec(class_weights={"cosmic-rays": 1.0}), "cosmic-rays"),
        (TraceSpec(lemon_fraction=1.5), "lemon_fraction"),
        (TraceSpec(gray_slowdown=(0.9, 1.2)), "gray_slowdown"),
        (TraceSpec(rack_size=0), "rack_size"),
    ],
)
def test_bad_specs_name_the_field(spec: TraceSpec, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        generate_trace(10, 8, DAY, spec, seed=0)


def test_a_zero_rate_gives_an_empty_trace() -> None:
    assert generate_trace(10, 8, DAY, TraceSpec(rate_per_gpu_hour=0.0), seed=0).faults == ()


def test_every_class_has_a_signal_and_sane_probabilities() -> None:
    for cls in CLASSES.values():
        assert isinstance(cls, FailureClass)
        assert 0.0 <= cls.reboot_fixes <= 1.0
        assert cls.xid is None or cls.signal is Signal.DEVICE
