"""Every parser of outside input takes any value: a sane result, or its declared error, never anything else.

The parsers (``grep -rn "def parse_\\|def project_" src``), what they read, their error, and where fuzzed:

- ``model.times``: ``parse_time`` (None), ``parse_duration`` (the caller's class), ``format_time`` (never
  raises): here, and ``tests/unit/model/test_times_input.py``.
- ``model.values``: ``whole_number``, ``finite`` (None), ``show``, ``label_value`` (never raise): here.
- ``model.fields``: the field readers the parsers below share (the caller's class): ``tests/unit/model/test_fields.py``.
- ``model.steps.parse_step_report``: a pod's ``devheal.io/steps`` (None and why): here.
- ``model.run_failure.parse_run_failure``: a pod's ``devheal.io/launcher-failed`` (None and why): here, and
  ``tests/unit/model/test_run_failure.py``.
- ``model.cluster.parse_generation``: restart generations (None): ``tests/unit/model/test_generation_input.py``.
- ``model.policy.parse_policy`` and ``parse_quantity``, and the section parsers it calls with ``PolicyError``:
  ``node_policy.parse_template``/``parse_escalation``, ``selectors.parse_selector``,
  ``spares_policy.parse_spares``, ``signals_policy.parse_signals``, ``straggler_policy.parse_stragglers``,
  ``infrastructure_policy.parse_infrastructure``, ``device_policy.parse_devices``,
  ``degradation_policy.parse_degradation``/``parse_repair``: here (every section, every optional field, each
  section alone and in a whole policy), and ``tests/unit/model/test_policy_input.py``.
- ``model.dra.parse_device_id``, ``parse_claim_entry`` (None): here.
- ``controller.projections.project_pod`` (steps, generations, claims, gang labels), ``project_node``,
  ``project_node_devices``, ``project_remediation`` (``ProjectionError``): here, and
  ``tests/unit/shell/controller/test_projections_input.py``.
- ``controller.dra_projections.project_resource_slice``, ``project_device_taint_rule`` (``ProjectionError``):
  here.
- ``model.badput.Badput.from_status``: a Remediation's ``status.badput`` (``BadputError``): here, and
  ``tests/unit/model/test_badput.py``.
- ``controller.gangs.recorded_restart``: a gang restart's notes on its Remediation (``InvalidGeneration``): here.
- ``agent.classification.parse_classification``, ``merge_tables`` (``ClassificationError``):
  ``tests/unit/agent/test_classification_input.py``; ``load_classification`` of an override file's text
  (``ClassificationError`` naming the file): here.

``DEVHEAL_FUZZ_EXAMPLES=5000`` searches harder (``tests.unit.fuzzing.FUZZ``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from devheal.agent.classification import ClassificationError, load_classification
from devheal.controller.dra_projections import project_device_taint_rule, project_resource_slice
from devheal.controller.gangs import InvalidGeneration, recorded_restart
from devheal.controller.projections import (
    ProjectionError,
    project_node,
    project_node_devices,
    project_pod,
    project_remediation,
)
from devheal.controller.records import remediation_body
from devheal.model import times
from devheal.model.badput import Badput, BadputError
from devheal.model.degradation_policy import parse_degradation, parse_repair
from devheal.model.device_policy import parse_devices
from devheal.model.dra import parse_claim_entry, parse_device_id
from devheal.model.infrastructure_policy import parse_infrastructure
from devheal.model.node_policy import parse_escalation, parse_template
from devheal.model.policy import PolicyError, parse_policy, parse_quantity
from devheal.model.run_failure import RUN_FAILURE_ANNOTATION, parse_run_failure
from devheal.model.selectors import parse_selector
from devheal.model.signals_policy import parse_signals
from devheal.model.spares_policy import parse_spares
from devheal.model.steps import STEPS_ANNOTATION, parse_step_report
from devheal.model.straggler_policy import parse_stragglers
from devheal.model.values import INT64_MAX, finite, label_value, show, whole_number
from tests.unit.fuzzing import FUZZ, NASTY, json_values, shaped

from . import strategies as s
from .validity import date_time, remediation_problems
from .validity import label_value as is_label_value

# ---- times and values ---------------------------------------------------------------------------


@FUZZ
@given(st.one_of(s.times(), json_values()))
@example("0001-01-01T00:00:00+23:59")
@example("9999-12-31T23:59:59.999999999Z")
@example("1969-12-31T23:59:59Z")
@example("2024-05-01T23:59:60Z")
def test_a_parsed_time_is_within_what_can_be_written_back(value: Any) -> None:
    ts = times.parse_time(value)
    if ts is not None:
        assert times.EARLIEST <= ts <= times.LATEST
        assert times.parse_time(times.format_time(ts)) == math.floor(ts)


@FUZZ
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), s.numbers()), st.booleans())
@example(-62135596800.0 - 60, False)
@example(253402300799.9999999, True)
def test_format_time_writes_any_number_as_an_rfc3339_time(ts: Any, micro: bool) -> None:
    assert date_time(times.format_time(ts, micro=micro))


@FUZZ
@given(json_values(), st.integers(-(2**70), 2**70), st.integers(-(2**70), 2**70), st.booleans())
def test_value_readers_answer_within_bounds_or_none(value: Any, low: int, high: int, text: bool) -> None:
    number = whole_number(value, minimum=low, maximum=high, text=text)
    assert number is None or (type(number) is int and low <= number <= high)
    real = finite(value)
    assert real is None or math.isfinite(real)
    assert len(show(value)) <= 80
    assert is_label_value(label_value(show(value, 500)))


# ---- step reports -------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(s.step_annotations(), json_values()))
@example('{"count":1,"window":1,"p50":' + s.BIG + ',"last":null}')
@example('{"count":1,"window":1,"p50":Infinity,"last":NaN}')
def test_a_step_report_is_sane_or_refused_with_a_reason(value: Any) -> None:
    report, why = parse_step_report(value)
    if report is None:
        assert why and len(why) < 1000
        return
    assert 0 <= report.window <= report.count <= INT64_MAX
    assert all(v is None or math.isfinite(v) for v in (report.p50, report.last, report.run, report.inside))
    assert report.exits is None or (report.collectives is not None and report.exits <= report.collectives)
    assert report.inside is None or report.exits is not None
    pod = project_pod({"metadata": {"namespace": "ml", "name": "p", "annotations": {STEPS_ANNOTATION: value}}})
    assert pod.steps == report


# ---- a Remediation's badput ---------------------------------------------------------------------

BADPUT = {
    "cause": ("faulty-gpu", "network", "other"),
    "gpus": (1, 8, 4096),
    "since": ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00.250000Z"),
    "until": ("2026-01-01T00:10:00Z", "2026-01-02T00:00:00.000001Z"),
    "gpuHours": (0.0, 1.5),
    "losses": {"awaiting-remediation": (0.0, 0.25), "restart": (1.0, 1234.5)},
}


@FUZZ
@given(st.one_of(shaped(BADPUT), json_values()))
def test_a_status_badput_reads_back_sanely_or_is_refused_naming_the_field(value: Any) -> None:
    try:
        badput = Badput.from_status(value)
    except BadputError as exc:
        assert str(exc).startswith("status.badput") and len(str(exc)) < 1000
        return
    assert badput.gpus >= 1 and badput.until >= badput.since
    assert all(math.isfinite(h) and h >= 0 for h in badput.losses.values())
    assert Badput.from_status(badput.to_status()).cause == badput.cause


# ---- held failed runs ---------------------------------------------------------------------------


@FUZZ
@given(
    st.one_of(
        st.fixed_dictionaries({"code": json_values(), "at": json_values(), "generation": json_values()}).map(
            json.dumps
        ),
        json_values(),
    )
)
@example('{"code":1,"at":' + s.BIG + ',"generation":1}')
@example('{"code":1,"at":NaN,"generation":1}')
def test_a_held_failed_run_is_sane_or_refused_with_a_reason(value: Any) -> None:
    failure, why = parse_run_failure(value)
    if failure is None:
        assert why and len(why) < 1000
        return
    assert 1 <= failure.code <= 255 and 0 <= failure.generation <= INT64_MAX and math.isfinite(failure.at)
    pod = project_pod({"metadata": {"namespace": "ml", "name": "p", "annotations": {RUN_FAILURE_ANNOTATION: value}}})
    assert pod.run_failure == failure


# ---- policies -----------------------------------------------------------------------------------

SECTION_PARSERS: dict[str, Callable[[Any, str, type[ValueError]], Any]] = {
    "infrastructure": parse_infrastructure,
    "devices": parse_devices,
    "stragglers": parse_stragglers,
    "spares": lambda v, w, e: parse_spares(v, w, e, lambda sel, at: parse_selector(sel, at, e)),
    "signals": parse_signals,
    "degradation": parse_degradation,
    "repair": parse_repair,
}


class SectionError(ValueError):
    """A caller's own error class, as parse_policy passes PolicyError."""


def _section(name: str, value: Any) -> None:
    try:
        SECTION_PARSERS[name](value, f"spec.{name}", SectionError)
    except SectionError as exc:
        assert str(exc).startswith(f"spec.{name}"), exc
        assert len(str(exc)) < 1000, exc


@FUZZ
@pytest.mark.parametrize("name", sorted(SECTION_PARSERS))
@given(data=st.data())
def test_each_policy_section_parser_raises_only_its_callers_error(name: str, data: st.DataObject) -> None:
    _section(name, data.draw(st.one_of(shaped(s.SECTIONS[name]), json_values(), st.none())))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("degradation", {"enterAfter": "1h"}),
        ("degradation", {"leaveAfter": "1m"}),
        ("degradation", {"enterAfter": "1" * 400 + "s"}),
        ("stragglers", {"stall": {"after": "0s"}}),
        ("spares", {"size": 1}),
        ("signals", {"conditions": {"A": "Nope"}}),
    ],
)
def test_a_section_with_an_optional_field_left_out_is_parsed_or_refused_naming_the_section(
    name: str, value: Any
) -> None:
    _section(name, value)


class FieldError(ValueError):
    pass


@FUZZ
@given(st.one_of(shaped(s.SELECTOR), json_values()), st.one_of(shaped(s.TEMPLATE), json_values()))
def test_selectors_templates_and_ladders_raise_only_the_callers_error(selector: Any, template: Any) -> None:
    for parse, value in (
        (parse_selector, selector),
        (parse_template, template),
        (parse_escalation, [{"template": template, "timeout": "1m"}]),
        (parse_escalation, template),
    ):
        try:
            parse(value, "at", FieldError)
        except FieldError as exc:
            assert str(exc).startswith("at"), exc


@FUZZ
@given(st.one_of(st.sampled_from(NASTY), json_values(), st.sampled_from(["10%", "101%", "0%", s.BIG + "%"])))
def test_a_quantity_is_a_bounded_count_or_percentage_or_a_policy_error(value: Any) -> None:
    try:
        quantity = parse_quantity(value, "spec.budgets.maxUnhealthyNodes")
    except PolicyError as exc:
        assert str(exc).startswith("spec.budgets.maxUnhealthyNodes"), exc
    else:
        assert 0 <= quantity.value <= 2**31 - 1 and (not quantity.percent or quantity.value <= 100)


def _parse_policy(obj: Any) -> None:
    try:
        policy = parse_policy(obj)
    except PolicyError as exc:
        assert len(str(exc)) < 1000, exc
    else:
        record = policy.breaker_record
        assert record.open_since is None or math.isfinite(record.open_since)


@FUZZ
@given(shaped(s.POLICY, max_changes=4))
@example({"metadata": {"name": "p"}, "spec": {"selector": {"namespaces": ["ml"]}, "degradation": {"enterAfter": "1h"}}})
def test_a_whole_policy_with_any_sections_and_optional_fields_parses_or_is_a_policy_error(obj: Any) -> None:
    _parse_policy(obj)


@FUZZ
@given(st.sets(st.sampled_from(sorted(s.SECTIONS)), max_size=4), st.data())
def test_any_combination_of_valid_sections_parses_or_is_a_policy_error(names: set[str], data: st.DataObject) -> None:
    spec = {"selector": {"namespaces": ["ml"]}}
    spec.update({name: data.draw(shaped(s.SECTIONS[name], max_changes=0)) for name in names})
    _parse_policy({"metadata": {"name": "p"}, "spec": spec})


# ---- objects the controller watches -------------------------------------------------------------


def _project(project: Callable[[Any], Any], obj: Any) -> Any:
    try:
        return project(obj)
    except ProjectionError as exc:
        assert len(str(exc)) < 1000, exc
        return None


@FUZZ
@given(shaped(s.POD, max_changes=4))
def test_project_pod_reads_steps_generations_claims_and_gang_labels_or_raises_projection_error(obj: Any) -> None:
    pod = _project(project_pod, obj)
    if pod is not None:
        assert pod.steps is None or all(
            v is None or math.isfinite(v) for v in (pod.steps.p50, pod.steps.last, pod.steps.run)
        )
        assert abs(pod.restart_generation) <= INT64_MAX and 0 <= pod.acknowledged_generation <= INT64_MAX
        assert pod.deletion_at is None or times.EARLIEST <= pod.deletion_at <= times.LATEST


@FUZZ
@given(shaped(s.NODE, max_changes=4))
def test_project_node_reads_conditions_and_marks_or_raises_projection_error(obj: Any) -> None:
    node = _project(project_node, obj)
    if node is not None:
        assert 0 <= node.lifts <= INT64_MAX
        assert all(c.since is None or times.EARLIEST <= c.since <= times.LATEST for c in node.conditions)


@FUZZ
@given(shaped(s.NODE_DEVICES, max_changes=4))
def test_project_node_devices_reads_reasons_and_times_or_raises_projection_error(obj: Any) -> None:
    report = _project(project_node_devices, obj)
    if report is not None:
        since = [d.since for d in report.devices] + [r.since for d in report.devices for r in d.reasons]
        assert all(t is None or times.EARLIEST <= t <= times.LATEST for t in since)


@FUZZ
@given(shaped(s.REMEDIATION, max_changes=4))
@example(
    {"spec": {"action": "Taint", "target": {"kind": "Node", "name": "n"}}, "status": {"startedAt": s.HOSTILE_TIMES[0]}}
)
def test_project_remediation_reads_times_and_labels_or_raises_projection_error(obj: Any) -> None:
    record = _project(project_remediation, obj)
    if record is None:
        return
    assert date_time(times.format_time(record.started))
    assert record.finished is None or date_time(times.format_time(record.finished))
    if record.resume is not None:
        assert remediation_problems(remediation_body(record.resume)) == []


@FUZZ
@given(shaped(s.RESOURCE_SLICE, max_changes=4), shaped(s.DEVICE_TAINT_RULE, max_changes=4))
def test_dra_objects_project_or_raise_projection_error(resource_slice: Any, rule: Any) -> None:
    devices = _project(project_resource_slice, resource_slice)
    for device in devices or ():
        assert device.since is None or times.EARLIEST <= device.since <= times.LATEST
    quarantine = _project(project_device_taint_rule, rule)
    if quarantine is not None:
        assert times.EARLIEST <= quarantine.created <= times.LATEST


@FUZZ
@given(st.one_of(st.text(max_size=80), st.sampled_from(NASTY).map(str), st.just("a.b/" + "p/" * 600 + "d")))
def test_dra_ids_and_claim_entries_parse_or_are_none(text: str) -> None:
    device = parse_device_id(text)
    assert device is None or device.id == text
    entry = parse_claim_entry(text)
    assert entry is None or entry[0]


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["devheal.io/generation", "devheal.io/size", "devheal.io/started"]),
        st.one_of(st.sampled_from(NASTY).map(str), st.text("0123456789.-e", max_size=20), st.just(s.BIG)),
    )
)
def test_a_gang_restarts_notes_read_as_bounded_numbers_or_invalid_generation(notes: dict[str, str]) -> None:
    try:
        generation, size, started = recorded_restart(notes, "r")
    except InvalidGeneration as exc:
        assert str(exc).startswith("Remediation r: annotation"), exc
    else:
        assert 1 <= generation <= INT64_MAX and (size is None or 0 <= size < 2**31)
        assert started is None or math.isfinite(started)


# ---- the node agent's override file -------------------------------------------------------------

YAML_TEXT = st.one_of(
    st.text(alphabet="[]{}:,-? \n'\"&*!|>#%@`0123456789abcxidsrules", max_size=200),
    st.sampled_from([1, 2, 1200, 3000]).map(lambda n: "[" * n),
    st.sampled_from([1, 1200]).map(lambda n: "a: " + "{b: " * n),
    st.sampled_from([1, 900]).map(lambda n: "rules: " + "[" * n + "]" * n),
    st.just("quietWindow: " + "9" * 5000),
)
FEWER = settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 4))
"""Each example reads the packaged table too: a quarter of the examples keeps the suite fast."""


@FEWER
@given(YAML_TEXT)
@example("[" * 1200)
def test_any_override_file_gives_a_table_or_a_classification_error_naming_it_in_one_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "override.yaml"
        path.write_text(text)
        try:
            load_classification(path)
        except ClassificationError as exc:
            assert str(exc).startswith(f"classification override {path}: ") and "\n" not in str(exc), exc


@FUZZ
@given(json_values())
def test_every_projection_takes_a_value_that_is_no_object(value: Any) -> None:
    for project in (
        project_pod,
        project_node,
        project_node_devices,
        project_remediation,
        project_resource_slice,
        project_device_taint_rule,
    ):
        _project(project, value)
