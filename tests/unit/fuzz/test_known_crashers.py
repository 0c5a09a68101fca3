"""The inputs that once crashed a parser (or made a record the API server refused), kept as plain cases.

Each names the defect it was: a ``KeyError`` from a policy with only ``degradation.enterAfter``; an
``OverflowError`` from a 400-digit ``p50`` in a pod's step report; ``ValueError`` from formatting a time
before year 1 or after 9999 (a Remediation's ``startedAt``, an agent's ``firstSeen``); a negative epoch
label from a ``since`` before 1970; ``RecursionError`` from an override file of 1,200 nested ``[``; an
Event ``generateName`` from a gang label value with upper case or ``_``.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from devheal.agent.classification import ClassificationError, load_classification
from devheal.agent.runner import ClassificationSource
from devheal.cli.app import app
from devheal.controller.events import event_name_prefix
from devheal.controller.projections import project_node_devices, project_pod, project_remediation
from devheal.controller.records import remediation_body
from devheal.model.cluster import Workload, WorkloadClass
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, TargetKind
from devheal.model.policy import ActionKind, PolicyError, parse_policy
from devheal.model.steps import STEPS_ANNOTATION, parse_step_report
from devheal.model.times import format_time, parse_time

from .validity import date_time, dns_subdomain, remediation_problems

BEFORE_YEAR_1 = "0001-01-01T00:00:00+23:59"
AFTER_9999 = "9999-12-31T23:59:59.999999999Z"
HOSTILE_TIMES = (BEFORE_YEAR_1, AFTER_9999, "1969-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2024-05-01T23:59:60Z")
STEPS_400_DIGITS = '{"count":1,"window":1,"p50":' + "9" * 400 + ',"last":null}'


def test_a_degradation_with_only_enter_after_above_the_default_leave_after_is_a_policy_error() -> None:
    spec = {"selector": {"namespaces": ["ml"]}, "degradation": {"enterAfter": "1h"}}
    with pytest.raises(PolicyError, match=r"degradation.leaveAfter: must be at least enterAfter \(3600s\), got the"):
        parse_policy({"metadata": {"name": "p"}, "spec": spec})


def test_a_400_digit_p50_is_refused_and_the_pod_still_projects() -> None:
    report, why = parse_step_report(STEPS_400_DIGITS)
    assert report is None and why.startswith("p50: expected a finite number")
    pod = project_pod(
        {"metadata": {"namespace": "ml", "name": "p", "annotations": {STEPS_ANNOTATION: STEPS_400_DIGITS}}}
    )
    assert pod.steps is None


@pytest.mark.parametrize("text", HOSTILE_TIMES)
def test_a_time_that_cannot_be_written_back_reads_as_no_time(text: str) -> None:
    assert parse_time(text) is None


@pytest.mark.parametrize("ts", [math.inf, -math.inf, math.nan, 1e300, -1e300, 2.0**63, -62135596801.0, 253402300800.0])
def test_format_time_writes_any_float_as_an_rfc3339_time(ts: float) -> None:
    assert date_time(format_time(ts)) and date_time(format_time(ts, micro=True))


@pytest.mark.parametrize("text", HOSTILE_TIMES)
def test_a_remediation_started_at_a_hostile_time_gives_a_formattable_start(text: str) -> None:
    obj = {
        "metadata": {"name": "r"},
        "spec": {"action": "Taint", "target": {"kind": "Node", "name": "n1"}},
        "status": {"phase": "InProgress", "startedAt": text},
    }
    assert date_time(format_time(project_remediation(obj).started))


def _reported_since(text: str) -> float:
    devices = [{"id": "GPU-1", "health": "Unhealthy", "reasons": [{"code": 79, "firstSeen": text}]}]
    report = project_node_devices({"metadata": {"name": "n1"}, "status": {"devices": devices}})
    return report.devices[0].since or 0.0


def _taint(since: float, epoch: int) -> Action:
    finding = Finding(FindingKind.NODE_DEVICES_FAILED, "n1", (FindingSource.NODE_DEVICES,), "XID 79", since)
    return Action(ActionKind.TAINT, TargetKind.NODE, "n1", "n1", finding, "p", epoch=epoch)


@pytest.mark.parametrize("text", HOSTILE_TIMES)
def test_an_agents_hostile_first_seen_gives_a_record_the_api_server_accepts(text: str) -> None:
    since = _reported_since(text)
    assert remediation_problems(remediation_body(_taint(since, epoch=int(since)))) == []


@pytest.mark.parametrize("since", [-1.0, -1e12, math.inf, -math.inf, math.nan, 1e300, 253402300799.999999])
def test_a_record_body_is_valid_whatever_its_since(since: float) -> None:
    epoch = int(since) if math.isfinite(since) else 0
    assert remediation_problems(remediation_body(_taint(since, epoch))) == []


def test_a_negative_epoch_is_written_as_a_valid_label_and_read_back() -> None:
    action = _taint(-5.0, epoch=-5)
    body = remediation_body(action)
    assert body["metadata"]["labels"]["devheal.io/epoch"] == "n5"
    record = project_remediation({**body, "status": {"phase": "InProgress"}})
    assert record.resume is not None and record.resume.epoch == -5 and record.resume.name == action.name


def test_strings_past_the_crds_lengths_are_cut_to_them() -> None:
    every = tuple(FindingSource)  # 120 characters joined
    finding = Finding(FindingKind.DEVICE_FAILED, "n1", every, "e" * 5000, 0.0, device_ids=("d" * 300,) * 100)
    workload = Workload("ml", "K" * 100, "w" * 300, WorkloadClass.GANG)
    action = Action(
        ActionKind.DESCHEDULE,
        TargetKind.POD,
        "ml/" + "p" * 300,
        "n" * 300,
        finding,
        "q" * 300,
        workload,
        target_uid="u" * 100,
    )
    assert remediation_problems(remediation_body(action)) == []


def _deep_override(tmp_path: Path) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text("[" * 1200)
    return path


def test_an_override_file_nested_too_deep_is_a_classification_error_naming_it(tmp_path: Path) -> None:
    path = _deep_override(tmp_path)
    with pytest.raises(ClassificationError, match=f"^classification override {path}: not valid YAML: nested"):
        load_classification(path)


def test_an_override_nested_too_deep_stops_the_agent_at_start_with_a_one_line_error(tmp_path: Path) -> None:
    path = _deep_override(tmp_path)
    result = CliRunner().invoke(app, ["agent", "--node-name", "n1", "--classification", str(path)])
    assert result.exit_code == 2, result.output  # as any other bad option
    expected = f"classification override {path}: not valid YAML: nested deeper than it can read"
    # Compared without blanks: the terminal's width may wrap a long temporary path.
    assert "".join(expected.split()) in "".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_an_override_nested_too_deep_on_reload_is_logged_and_the_table_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "override.yaml"
    path.write_text("quietWindow: 45s\n")
    source = ClassificationSource(path, check_every=0.0)
    before = source.table
    path.write_text("[" * 1200)
    os.utime(path, (1, 1))  # a new mtime, whatever the file system's resolution
    with caplog.at_level(logging.ERROR, logger="devheal.agent.runner"):
        assert source.current() is before
    assert f"classification override {path}: not valid YAML" in caplog.text
    assert "keeping the previous table" in caplog.text


@pytest.mark.parametrize("name", ["My_Gang", "UPPER", "a_b.C-d", "x" * 253, "-.-", "", "ü", "a..b", None])
def test_an_event_name_prefix_is_a_dns_name_whatever_the_involved_name(name: Any) -> None:
    prefix = event_name_prefix(name)
    assert len(prefix) <= 58 and dns_subdomain(prefix + "abcde")
