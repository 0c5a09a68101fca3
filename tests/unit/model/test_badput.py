"""Badput's one computation: the simulator's losses and the controller's records make the same loss-by-cause table,
a record's split of the time is awaiting remediation then restart, and ``status.badput`` reads back as written
(or is refused naming the field)."""

from __future__ import annotations

from typing import Any

import pytest

from devheal.model.badput import (
    ALL_NAMESPACES,
    Badput,
    BadputError,
    BookedLoss,
    Loss,
    cause_cell,
    cause_table,
    findings_by_cause,
    mean_by_cause,
    remediation_badput,
    report_columns,
)
from devheal.simulate import results
from devheal.simulate.failures import CLASSES
from devheal.simulate.fleet import Unit, UnitKind

HOUR = 3600.0


def gang(gpus_per_node: int, losses: dict[tuple[str, Loss], float]) -> Unit:
    unit = Unit(0, UnitKind.GANG, "train", "ml-training", 2, gpus_per_node, 900.0, 10.0, 120.0)
    unit.by_cause = dict(losses)
    return unit


def booked(cause: str, gpus: int, awaiting_s: float, restart_s: float, namespace: str = "ml-training") -> BookedLoss:
    badput = remediation_badput(cause, gpus, 1000.0, 1000.0 + awaiting_s, 1000.0 + awaiting_s + restart_s)
    assert badput is not None
    return BookedLoss(namespace, "DeviceFailed", badput)


def test_the_simulator_and_the_records_make_the_same_table_from_the_same_losses() -> None:
    # A gang of 2 nodes x 8 GPUs: a faulty GPU cost it 10 min awaiting remediation and 2 min restarting, a
    # stalled gang (network) 1 h awaiting and 2 min restarting.
    unit = gang(
        8,
        {
            ("faulty-gpu", Loss.AWAITING_REMEDIATION): 600.0,
            ("faulty-gpu", Loss.RESTART): 120.0,
            ("network", Loss.AWAITING_REMEDIATION): HOUR,
            ("network", Loss.RESTART): 120.0,
        },
    )
    records = [booked("faulty-gpu", 16, 600.0, 120.0), booked("network", 16, HOUR, 120.0)]
    simulated = results.losses_by_cause([unit])
    live = report_columns(records)
    assert live == {"ml-training": simulated}

    def signal(cause: str) -> str:
        return str(CLASSES[cause].signal)

    assert cause_table({"run": simulated}, signal).rows == cause_table(live, signal).rows
    table = cause_table(live, signal)
    assert table.headers == ("cause", "seen by", "ml-training")
    assert table.rows == (("network", "hidden", "17 (16)"), ("faulty-gpu", "device", "3.2 (2.7)"))


def test_the_table_orders_causes_by_their_largest_loss_and_leaves_absent_cells_zero() -> None:
    columns = {
        "a": {"x": {"restart": 1.0}, "y": {"restart": 50.0}},
        "b": {"x": {"restart": 80.0, "awaiting-remediation": 20.0}},
    }
    table = cause_table(columns, lambda _: "-")
    assert [row[0] for row in table.rows] == ["x", "y"]
    assert table.rows[1] == ("y", "-", "50", "0")
    assert table.rows[0][3] == "100 (20)"


def test_mean_by_cause_counts_a_cause_absent_from_a_run_as_nothing_there() -> None:
    runs = [{"sdc": {"restart": 4.0}}, {"nic": {"rollback": 2.0}}]
    assert mean_by_cause(runs) == {"nic": {"rollback": 1.0}, "sdc": {"restart": 2.0}}


def test_the_report_has_a_column_per_namespace_and_one_for_all_when_there_are_several() -> None:
    records = [booked("faulty-gpu", 8, 0.0, HOUR, "a"), booked("faulty-gpu", 8, HOUR, 0.0, "b")]
    columns = report_columns(records)
    assert list(columns) == ["a", "b", ALL_NAMESPACES]
    assert columns[ALL_NAMESPACES] == {"faulty-gpu": {"awaiting-remediation": 8.0, "restart": 8.0}}
    assert findings_by_cause(records) == {"faulty-gpu": "DeviceFailed"}
    assert list(report_columns(records[:1])) == ["a"]


@pytest.mark.parametrize(
    ("losses", "cell"),
    [
        ({}, "0"),
        ({"restart": 0.04}, "0.0"),
        ({"restart": 2.0, "awaiting-remediation": 0.5}, "2.5 (0.5)"),
        ({"awaiting-remediation": 0.01}, "0.0"),
        ({"rollback": 1234.0, "awaiting-remediation": 1000.4}, "2,234 (1,000)"),
    ],
)
def test_a_cell_shows_all_losses_and_those_awaiting_remediation(losses: dict[str, float], cell: str) -> None:
    assert cause_cell(losses) == cell


def test_a_records_loss_is_awaiting_remediation_until_it_started_then_restart() -> None:
    badput = remediation_badput("gpu-hbm3", 16, since=0.0, started=90.0, until=390.0)
    assert badput is not None
    assert badput.losses == {"awaiting-remediation": pytest.approx(0.4), "restart": pytest.approx(16 * 300 / HOUR)}
    assert badput.gpu_hours == pytest.approx(16 * 390 / HOUR)


@pytest.mark.parametrize(
    ("since", "started", "until", "awaiting_s", "restart_s"),
    [
        (100.0, 50.0, 400.0, 0.0, 300.0),  # started before the fault was seen (another machine's clock)
        (100.0, 500.0, 400.0, 300.0, 0.0),  # ended before it started
        (100.0, 200.0, 50.0, 0.0, 0.0),  # ended before the fault was seen: nothing
    ],
)
def test_times_out_of_order_are_clamped_never_negative(
    since: float, started: float, until: float, awaiting_s: float, restart_s: float
) -> None:
    badput = remediation_badput("other", 1, since, started, until)
    expected = {k: v / HOUR for k, v in (("awaiting-remediation", awaiting_s), ("restart", restart_s)) if v > 0}
    assert (badput.losses if badput else {}) == pytest.approx(expected)


def test_a_workload_without_gpus_or_with_no_time_lost_books_nothing() -> None:
    assert remediation_badput("faulty-gpu", 0, 0.0, 10.0, 20.0) is None
    assert remediation_badput("faulty-gpu", 8, 5.0, 5.0, 5.0) is None
    assert remediation_badput("faulty-gpu", 8, float("nan"), 5.0, 5.0) is None


def test_status_badput_reads_back_as_written() -> None:
    badput = remediation_badput("nic", 64, since=1_764_000_000.25, started=1_764_000_030.5, until=1_764_000_400.0)
    assert badput is not None
    status = badput.to_status()
    assert status["since"] == "2025-11-24T16:00:00.250000Z"
    assert status["gpuHours"] == pytest.approx(64 * 399.75 / HOUR, abs=1e-4)
    back = Badput.from_status(status)
    assert (back.cause, back.gpus, back.since, back.until) == (badput.cause, 64, badput.since, badput.until)
    assert back.losses == pytest.approx(badput.losses, abs=1e-4)


def valid() -> dict[str, Any]:
    return {
        "cause": "nic",
        "gpus": 8,
        "since": "2026-01-01T00:00:00Z",
        "until": "2026-01-01T00:10:00Z",
        "gpuHours": 1.3,
        "losses": {"restart": 1.3},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cause": ""}, "status.badput.cause: expected a cause name, got ''"),
        ({"gpus": 0}, "status.badput.gpus: expected a whole number of at least 1, got 0"),
        ({"gpus": "8"}, "status.badput.gpus: expected a whole number of at least 1, got '8'"),
        ({"until": "2025-01-01T00:00:00Z"}, "until not before since"),
        ({"since": "yesterday"}, "expected since and until as RFC 3339 times"),
        ({"losses": {}}, "status.badput.losses: expected GPU-hours by loss category, got {}"),
        ({"losses": {"restart": -1}}, "got 'restart': -1"),
        (
            {"losses": {"coffee": 1}},
            "checkpoints, restart, rollback, stragglers, got 'coffee': 1",
        ),
        ({"losses": {"restart": "inf"}}, "got 'restart': 'inf'"),
    ],
)
def test_a_status_badput_devheal_never_writes_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(BadputError, match=None) as caught:
        Badput.from_status({**valid(), **change})
    assert message in str(caught.value)


def test_a_status_badput_that_is_no_object_is_refused() -> None:
    with pytest.raises(BadputError, match=r"status\.badput: expected an object, got \[\]"):
        Badput.from_status([])
