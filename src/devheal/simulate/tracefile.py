"""Trace files: replay a fleet's recorded failures (CSV or JSONL), or save a generated trace.

One failure per row (CSV, with a header) or per line (JSONL, one object):

    time_h         hours since the start, a number >= 0                  (required)
    node           node index, 0 .. nodes-1 (workload nodes first, then spares) (required)
    class          a failure class name, e.g. faulty-gpu, network       (required)
    gpu            GPU index on the node, default 0
    reboot_fixes   true/false: does a node reboot clear it? default: the class's usual answer

Rows may come in any order; the trace is sorted by time. A bad row is rejected with its
line number and field. This module does I/O; the rest of the simulator does not.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from devheal.simulate.failures import CLASSES, HOUR, Fault, Trace, TraceError

FIELDS = ("time_h", "node", "class", "gpu", "reboot_fixes")
REQUIRED = ("time_h", "node", "class")


class TraceFileError(TraceError):
    """A trace file cannot be read; the message names the file, the line and the field."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise TraceFileError(f"{where}: expected a number of hours >= 0, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceFileError(f"{where}: expected a number of hours >= 0, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise TraceFileError(f"{where}: expected a number of hours >= 0, got {value!r}")
    return number


def _index(value: Any, where: str, limit: int) -> int:
    if isinstance(value, bool):
        raise TraceFileError(f"{where}: expected a whole number 0..{limit - 1}, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise TraceFileError(f"{where}: expected a whole number 0..{limit - 1}, got {value!r}")
    if not 0 <= number < limit:
        raise TraceFileError(f"{where}: {number} is outside 0..{limit - 1}")
    return number


def _flag(value: Any, where: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise TraceFileError(f"{where}: expected true or false, got {value!r}")


def _fault(row: Mapping[str, Any], where: str, nodes: int, gpus_per_node: int) -> Fault:
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise TraceFileError(f"{where}: unknown field(s) {', '.join(unknown)}; expected {', '.join(FIELDS)}")
    for name in REQUIRED:
        if row.get(name) in (None, ""):
            raise TraceFileError(f"{where}, field {name}: missing")
    cls_name = str(row["class"]).strip()
    cls = CLASSES.get(cls_name)
    if cls is None:
        raise TraceFileError(
            f"{where}, field class: unknown failure class {cls_name!r}; expected one of {', '.join(CLASSES)}"
        )
    gpu = row.get("gpu")
    return Fault(
        time=_number(row["time_h"], f"{where}, field time_h") * HOUR,
        node=_index(row["node"], f"{where}, field node", nodes),
        cls=cls_name,
        gpu=0 if gpu in (None, "") else _index(gpu, f"{where}, field gpu", gpus_per_node),
        reboot_fixes=_flag(row.get("reboot_fixes"), f"{where}, field reboot_fixes", cls.reboot_fixes >= 0.5),
    )


def _rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFileError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceFileError(f"{path}:{number}: expected an object with {', '.join(REQUIRED)}")
            yield number, obj
        return
    if path.suffix.lower() != ".csv":
        raise TraceFileError(f"{path}: expected a .csv or .jsonl file")
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [f for f in REQUIRED if f not in header]
    if missing:
        raise TraceFileError(f"{path}:1: header lacks {', '.join(missing)} (has {', '.join(header) or 'nothing'})")
    for row in reader:
        if None in row:
            raise TraceFileError(f"{path}:{reader.line_num}: more values than header fields")
        yield reader.line_num, {k: v for k, v in row.items() if k is not None}


def read_trace(path: Path, nodes: int, gpus_per_node: int, horizon_s: float) -> Trace:
    """Faults from a CSV or JSONL file, for a fleet of ``nodes`` x ``gpus_per_node`` over ``horizon_s``."""
    if not path.is_file():
        raise TraceFileError(f"{path}: no such file")
    faults = [_fault(row, f"{path}:{number}", nodes, gpus_per_node) for number, row in _rows(path)]
    faults.sort(key=lambda f: (f.time, f.node, f.cls))
    trace = Trace(nodes=nodes, gpus_per_node=gpus_per_node, horizon_s=horizon_s, faults=tuple(faults), source=str(path))
    trace.validate()
    return trace


def write_trace(trace: Trace, path: Path) -> None:
    """Save a trace as CSV or JSONL (by suffix), readable by ``read_trace``."""
    rows = [
        {
            "time_h": repr(f.time / HOUR),
            "node": f.node,
            "class": f.cls,
            "gpu": f.gpu,
            "reboot_fixes": str(f.reboot_fixes).lower(),
        }
        for f in trace.faults
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        path.write_text(
            "".join(
                json.dumps({**r, "time_h": f.time / HOUR, "reboot_fixes": f.reboot_fixes}) + "\n"
                for r, f in zip(rows, trace.faults, strict=True)
            ),
            encoding="utf-8",
        )
        return
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=list(FIELDS))
        writer.writeheader()
        writer.writerows(rows)
