"""The launcher's published step report (``devheal.io/steps``): written compactly, read strictly."""

from __future__ import annotations

import pytest

from devheal.model.steps import MAX_ANNOTATION_LENGTH, StepReport, parse_step_report

T = 1_764_587_000.25


def test_round_trip() -> None:
    report = StepReport(count=1234, window=10, p50=0.4123456789, last=T, run=T - 1000)
    text = report.to_annotation()
    assert text == '{"count":1234,"window":10,"p50":0.412346,"last":1764587000.25,"run":1764586000.25}'
    assert parse_step_report(text) == (StepReport(1234, 10, 0.412346, T, T - 1000), "")


def test_the_interval_between_reports_round_trips_and_is_optional() -> None:
    report = StepReport(count=1234, window=10, p50=0.1, last=T, run=T - 1000, interval=0.6)
    text = report.to_annotation()
    assert '"interval":0.6' in text
    assert parse_step_report(text) == (report, "")
    assert parse_step_report('{"count":5,"window":5,"p50":1,"interval":null}')[0] == StepReport(5, 5, 1.0, None)


def test_when_the_run_reached_its_rendezvous_round_trips_and_is_optional() -> None:
    report = StepReport(count=50, window=0, p50=None, last=None, run=T - 10, joined=T - 4)
    text = report.to_annotation()
    assert '"joined":1764586996.25' in text
    assert parse_step_report(text) == (report, "")
    assert '"joined"' not in StepReport(count=50, window=0, p50=None, last=None, run=T).to_annotation()
    refused, why = parse_step_report('{"count":5,"window":0,"p50":null,"joined":"soon"}')
    assert refused is None and why.startswith("joined: expected a finite number or null")


def test_since_when_the_store_is_unreachable_round_trips_and_is_optional() -> None:
    report = StepReport(count=50, window=5, p50=0.2, last=T, run=T - 100, unreachable=T + 3)
    text = report.to_annotation()
    assert '"unreachable":1764587003.25' in text
    assert parse_step_report(text) == (report, "")
    assert '"unreachable"' not in StepReport(count=50, window=0, p50=None, last=None, run=T).to_annotation()
    for bad in ('"soon"', "1e400", "-1", "true"):
        refused, why = parse_step_report(f'{{"count":5,"window":0,"p50":null,"unreachable":{bad}}}')
        assert refused is None and why.startswith("unreachable: expected"), (bad, why)


def test_the_runs_latest_checkpoint_round_trips_and_is_optional() -> None:
    report = StepReport(count=50, window=5, p50=0.2, last=T, run=T - 100, checkpoint=T - 30)
    text = report.to_annotation()
    assert '"checkpoint":1764586970.25' in text
    assert parse_step_report(text) == (report, "")
    assert '"checkpoint"' not in StepReport(count=50, window=0, p50=None, last=None, run=T).to_annotation()
    for bad in ('"soon"', "1e400", "5"):
        refused, why = parse_step_report(f'{{"count":5,"window":0,"p50":null,"checkpoint":{bad}}}')
        assert refused is None and why.startswith("checkpoint: expected"), (bad, why)


def test_a_new_run_has_an_empty_window() -> None:
    report = StepReport(count=50, window=0, p50=None, last=T, run=T)
    assert parse_step_report(report.to_annotation()) == (report, "")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "expected a JSON object as a string"),
        ("x" * (MAX_ANNOTATION_LENGTH + 1), "longer than 512 characters"),
        ("{", "not JSON"),
        ("[1]", "expected a JSON object"),
        ('{"window":1,"p50":1}', "count: expected a whole number >= 0, got None"),
        ('{"count":-1,"window":0}', "count: expected a whole number >= 0"),
        ('{"count":true,"window":0}', "count: expected a whole number >= 0"),
        ('{"count":1.5,"window":0}', "count: expected a whole number >= 0"),
        ('{"count":5,"window":6,"p50":1}', "window: expected a whole number within 0..count (5)"),
        ('{"count":5,"window":5,"p50":-1}', "p50: expected a number within 0..86400"),
        ('{"count":5,"window":5,"p50":1e9}', "p50: expected a number within 0..86400"),
        ('{"count":5,"window":5,"p50":"1"}', "p50: expected a finite number or null"),
        ('{"count":5,"window":5,"p50":NaN}', "p50: expected a finite number or null"),
        ('{"count":5,"window":5,"p50":Infinity}', "p50: expected a finite number or null"),
        ('{"count":5,"window":5,"p50":1,"last":12}', "last: expected a number within 1e+09..1e+11"),
        ('{"count":5,"window":5,"p50":null}', "p50: null although window is 5"),
        ('{"count":5,"window":5,"p50":1,"interval":-1}', "interval: expected a number within 0..86400"),
        ('{"count":5,"window":5,"p50":1,"interval":"1"}', "interval: expected a finite number or null"),
    ],
)
def test_bad_values_are_refused_with_the_reason(text: object, why: str) -> None:
    report, reason = parse_step_report(text)
    assert report is None and why in reason


def test_the_runs_collective_count_round_trips_and_is_optional() -> None:
    report = StepReport(count=50, window=10, p50=0.1, last=T, run=T - 10, collectives=480)
    text = report.to_annotation()
    assert '"collectives":480' in text
    assert parse_step_report(text) == (report, "")
    assert '"collectives"' not in StepReport(count=50, window=0, p50=None, last=None, run=T).to_annotation()
    assert parse_step_report('{"count":5,"window":0,"p50":null,"collectives":null}')[0] == StepReport(5, 0, None, None)
    for bad in ('"many"', "-1", "2.5", "true"):
        refused, why = parse_step_report('{"count":5,"window":0,"p50":null,"collectives":' + bad + "}")
        assert refused is None and why.startswith("collectives: expected a whole number >= 0 or null"), bad


def test_the_runs_collective_marks_round_trip_and_are_optional() -> None:
    inside = StepReport(count=50, window=10, p50=0.1, last=T, run=T - 10, collectives=481, exits=480, inside=T - 2)
    text = inside.to_annotation()
    assert '"exits":480,"inside":1764586998.25' in text
    assert parse_step_report(text) == (inside, "")
    outside = StepReport(count=50, window=10, p50=0.1, last=T, run=T - 10, collectives=480, exits=480)
    assert '"inside"' not in outside.to_annotation() and outside.marks_exits
    assert parse_step_report(outside.to_annotation()) == (outside, "")
    unmarked = StepReport(count=50, window=10, p50=0.1, last=T, run=T - 10, collectives=480)
    assert '"exits"' not in unmarked.to_annotation() and not unmarked.marks_exits


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ('"collectives":4,"exits":5', "exits: expected a whole number within 0..collectives (4) or null, got 5"),
        ('"collectives":4,"exits":-1', "exits: expected a whole number within 0..collectives (4) or null, got -1"),
        ('"collectives":4,"exits":"3"', "exits: expected a whole number within 0..collectives (4) or null"),
        ('"exits":3', "exits: given without collectives, got 3"),
        ('"collectives":4,"exits":3,"inside":"now"', "inside: expected a finite number or null"),
        ('"collectives":4,"exits":3,"inside":12', "inside: expected a number within 1e+09..1e+11"),
        ('"collectives":4,"inside":1764587000', "inside: a collective entered and not left, but exits is None of 4"),
        ('"collectives":4,"exits":4,"inside":1764587000', "inside: a collective entered and not left, but exits is 4"),
    ],
)
def test_bad_collective_marks_are_refused_naming_the_field(fields: str, why: str) -> None:
    report, reason = parse_step_report('{"count":5,"window":0,"p50":null,' + fields + "}")
    assert report is None and why in reason
