"""Logging for the long-running commands: one JSON object a line for collectors, text for a person.

A log collector (Loki, Cloud Logging, Elasticsearch) reads a line at a time, so in JSON
format every record is exactly one line holding one valid JSON object: ``time`` (RFC 3339,
UTC, milliseconds), ``level``, ``logger``, ``message``, the record's ``extra`` fields, and
the exception's traceback as the field ``exc`` (never as loose lines). ``auto`` picks text
when stderr is a terminal (someone is watching) and JSON otherwise (a pod, a pipe).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from enum import StrEnum
from typing import Annotated, Any, TextIO

import typer

from devheal.model.times import format_time


class LogFormat(StrEnum):
    JSON = "json"
    TEXT = "text"
    AUTO = "auto"


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

LogLevel = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")]
LogFormatOption = Annotated[
    LogFormat,
    typer.Option(
        case_sensitive=False,
        help="json: one JSON object a line; text: for people; auto: text when stderr is a terminal, else json.",
    ),
]

# Attributes every LogRecord has: anything else on a record came in through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def rfc3339_millis(created: float) -> str:
    """Seconds since the epoch -> ``2026-12-01T08:00:00.123Z``."""
    return format_time(created, micro=True)[:23] + "Z"


def _plain(value: Any) -> Any:
    """A JSON-ready value: JSON's own types as they are, anything else (and NaN) as its ``str``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and infinities are not JSON
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    """One record -> one line of JSON (newlines inside strings are escaped, never written)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339_millis(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = _plain(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, allow_nan=False)


class TextFormatter(logging.Formatter):
    """``08:00:00.123 INFO  devheal.controller.loop: message key=value``, tracebacks below."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-5s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extra:
            first, nl, rest = text.partition("\n")
            text = first + " " + " ".join(f"{k}={v}" for k, v in extra.items()) + nl + rest
        return text


def resolve(log_format: LogFormat, stream: TextIO) -> LogFormat:
    """``auto`` -> text on a terminal, json elsewhere."""
    if log_format is not LogFormat.AUTO:
        return log_format
    isatty = getattr(stream, "isatty", None)
    return LogFormat.TEXT if isatty is not None and isatty() else LogFormat.JSON


def setup(level: str, log_format: LogFormat | str = LogFormat.AUTO, stream: TextIO | None = None) -> None:
    """Send every log record to stderr (or ``stream``) in the format asked for, from ``level`` up."""
    name = level.upper()
    if name not in LEVELS:
        raise typer.BadParameter(f"expected one of {', '.join(LEVELS)}, got {level!r}", param_hint="--log-level")
    try:
        chosen = LogFormat(str(log_format).lower())
    except ValueError as exc:
        raise typer.BadParameter(f"expected json, text or auto, got {log_format!r}", param_hint="--log-format") from exc
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if resolve(chosen, out) is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(name)
