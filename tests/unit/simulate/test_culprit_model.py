"""The culprit model: when a stalled gang's step reports name the rank that stopped it, from the real-gang bench."""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.simulate.config import ConfigError, with_culprit_model, with_parallelism
from devheal.simulate.culprits import (
    CALIBRATED,
    CLASS_FAULTS,
    CULPRIT_MODELS,
    MISSES_RENDEZVOUS,
    BenchFault,
    Parallelism,
    named_with,
)
from devheal.simulate.failures import FAILURE_CLASSES, Signal
from devheal.simulate.simulation import STALLING

from .builders import small_config

DDP, FSDP = Parallelism.DDP, Parallelism.FSDP


def test_every_stalling_failure_class_maps_onto_a_measured_fault() -> None:
    stalling = {c.name for c in FAILURE_CLASSES if c.signal in STALLING}
    assert stalling == set(CLASS_FAULTS)


@pytest.mark.parametrize(
    ("cls", "ddp", "fsdp"),
    [
        ("faulty-gpu", True, True),  # device XID: right / right
        ("network", False, False),  # network cut: none / none
        ("nic", False, False),
        # Blocked outside the collectives, as a hang in compute: right / right (FSDP: a collective behind its peers).
        ("ssd", True, True),
        ("io-expansion-board", True, True),
        ("software-bug", False, False),  # a crash stalls nothing
    ],
)
def test_the_calibrated_model_names_what_the_bench_named(cls: str, ddp: bool, fsdp: bool) -> None:
    assert CALIBRATED.names_stall(cls, DDP, fault=0, run=0) is ddp
    assert CALIBRATED.names_stall(cls, FSDP, fault=0, run=0) is fsdp


def test_a_stopped_process_is_named_in_half_the_stalls_under_ddp_and_none_under_fsdp() -> None:
    """SIGSTOP with exit marks: its last post said "outside" in 1 of 2 DDP runs (named), "inside" under FSDP."""
    ddp = [CALIBRATED.names_stall("host-maintenance", DDP, fault=i, run=run) for i in range(200) for run in range(5)]
    assert 0.4 < sum(ddp) / len(ddp) < 0.6
    assert ddp == [CALIBRATED.names_stall("host-maintenance", DDP, i, run) for i in range(200) for run in range(5)]
    assert not any(CALIBRATED.names_stall("host-maintenance", FSDP, fault=i, run=0) for i in range(200))


def test_a_slow_rank_stands_out_under_ddp_and_fsdp() -> None:
    # FSDP too: each rank reports its own per-layer compute, the all-gather waits excluded.
    assert CALIBRATED.names_slow(DDP, node=3) and CALIBRATED.names_slow(FSDP, node=3)


def test_the_what_ifs_name_always_never_or_with_a_probability() -> None:
    always, never = CULPRIT_MODELS["always-named"], CULPRIT_MODELS["never-named"]
    assert all(always.names_stall("network", FSDP, i, 0) and not never.names_stall("ssd", DDP, i, 0) for i in range(50))
    half = named_with(0.5)
    named = [half.names_stall("network", FSDP, i, run) for i in range(200) for run in range(5)]
    assert 0.4 < sum(named) / len(named) < 0.6
    assert named == [half.names_stall("network", FSDP, i, run) for i in range(200) for run in range(5)]  # fixed


def test_bad_models_and_parallelisms_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"probability: expected 0\.\.1"):
        named_with(1.5)
    config = small_config()
    with pytest.raises(ConfigError, match="culprits: culprit model odd: probability"):
        replace(config, culprits=replace(CALIBRATED, name="odd", probability=-1.0)).validate()
    with pytest.raises(ConfigError, match="culprit model: unknown 'sometimes'"):
        with_culprit_model(config, "sometimes")
    with pytest.raises(ConfigError, match="parallelism: unknown 'tp'; expected one of ddp, fsdp"):
        with_parallelism(config, "tp")
    assert with_parallelism(config, "ddp").fleet.gangs[0].parallelism is DDP


def test_the_ranks_that_miss_a_rendezvous_are_those_behind_a_network_cut() -> None:
    # The bench's network cut: no stall names the rank; its restarted process never reaches the rendezvous.
    hidden = {c.name for c in FAILURE_CLASSES if c.signal is Signal.HIDDEN}
    assert MISSES_RENDEZVOUS == {cls for cls in hidden if CLASS_FAULTS[cls] is BenchFault.NETWORK} == {"network", "nic"}
