"""Trace files: CSV and JSONL replay, round trips, and errors that name the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devheal.simulate.failures import DAY, HOUR, TraceSpec, generate_trace
from devheal.simulate.tracefile import TraceFileError, read_trace, write_trace


def test_csv_replay(tmp_path: Path) -> None:
    path = tmp_path / "faults.csv"
    path.write_text("time_h,node,class,gpu,reboot_fixes\n2.5,3,faulty-gpu,7,true\n1,0,network,,\n")
    trace = read_trace(path, nodes=4, gpus_per_node=8, horizon_s=DAY)
    assert [(f.time, f.node, f.cls, f.gpu, f.reboot_fixes) for f in trace.faults] == [
        (1 * HOUR, 0, "network", 0, False),
        (2.5 * HOUR, 3, "faulty-gpu", 7, True),
    ]
    assert trace.source == str(path)


def test_jsonl_replay_defaults_reboot_fixes_from_the_class(tmp_path: Path) -> None:
    path = tmp_path / "faults.jsonl"
    lines = [
        {"time_h": 3, "node": 1, "class": "host-maintenance"},
        {"time_h": 4, "node": 2, "class": "gpu-thermal", "gpu": 1},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    trace = read_trace(path, nodes=4, gpus_per_node=8, horizon_s=DAY)
    assert [(f.cls, f.reboot_fixes) for f in trace.faults] == [("host-maintenance", True), ("gpu-thermal", False)]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_generated_traces_round_trip(tmp_path: Path, suffix: str) -> None:
    trace = generate_trace(64, 8, 30 * DAY, TraceSpec(rate_per_gpu_hour=1e-3), seed=9)
    path = tmp_path / f"trace{suffix}"
    write_trace(trace, path)
    again = read_trace(path, 64, 8, 30 * DAY)
    assert len(again.faults) == len(trace.faults) > 100
    for a, b in zip(trace.faults, again.faults, strict=True):
        assert (a.node, a.cls, a.gpu, a.reboot_fixes) == (b.node, b.cls, b.gpu, b.reboot_fixes)
        assert a.time == pytest.approx(b.time, abs=1e-6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "time_h,node,class\nsoon,0,faulty-gpu\n",
            r"faults.csv:2, field time_h: expected a number of hours >= 0, got 'soon'",
        ),
        ("time_h,node,class\n1,0,faulty-gpu\n-2,0,faulty-gpu\n", r"faults.csv:3, field time_h"),
        ("time_h,node,class\n1,9,faulty-gpu\n", r"faults.csv:2, field node: 9 is outside 0..3"),
        ("time_h,node,class\n1,x,faulty-gpu\n", r"faults.csv:2, field node: expected a whole number"),
        ("time_h,node,class\n1,0,cosmic-rays\n", r"faults.csv:2, field class: unknown failure class 'cosmic-rays'"),
        ("time_h,node,class,gpu\n1,0,nic,8\n", r"faults.csv:2, field gpu: 8 is outside 0..7"),
        (
            "time_h,node,class,reboot_fixes\n1,0,nic,maybe\n",
            r"faults.csv:2, field reboot_fixes: expected true or false",
        ),
        ("time_h,node,class\n1,0\n", r"faults.csv:2, field class: missing"),
        ("time_h,node,class\n1,0,nic,extra\n", r"faults.csv:2: more values than header fields"),
        ("time,node,class\n1,0,nic\n", r"faults.csv:1: header lacks time_h"),
    ],
)
def test_bad_csv_rows_name_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "faults.csv"
    path.write_text(text)
    with pytest.raises(TraceFileError, match=message):
        read_trace(path, nodes=4, gpus_per_node=8, horizon_s=DAY)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"faults.jsonl:2: not valid JSON"),
        ("[1, 2]", r"faults.jsonl:2: expected an object"),
        ('{"time_h": true, "node": 0, "class": "nic"}', r"faults.jsonl:2, field time_h"),
        ('{"time_h": 1, "node": 0, "class": "nic", "colour": "red"}', r"faults.jsonl:2: unknown field\(s\) colour"),
        ('{"time_h": 1, "class": "nic"}', r"faults.jsonl:2, field node: missing"),
    ],
)
def test_bad_jsonl_lines_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "faults.jsonl"
    path.write_text('{"time_h": 0.5, "node": 1, "class": "ssd"}\n' + line + "\n")
    with pytest.raises(TraceFileError, match=message):
        read_trace(path, nodes=4, gpus_per_node=8, horizon_s=DAY)


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError, match="no such file"):
        read_trace(tmp_path / "nope.csv", 4, 8, DAY)
    other = tmp_path / "faults.txt"
    other.write_text("x")
    with pytest.raises(TraceFileError, match=r"expected a \.csv or \.jsonl file"):
        read_trace(other, 4, 8, DAY)
