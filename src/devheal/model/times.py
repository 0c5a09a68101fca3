"""Timestamps and durations as written in Kubernetes objects and devheal's resources (pure).

- ``format_time``: seconds since the epoch -> RFC 3339 in UTC, to the second
  (``2024-05-01T12:00:00Z``, a ``metav1.Time``), or to the microsecond with ``micro=True``
  (``2024-05-01T12:00:00.000000Z``, a ``metav1.MicroTime`` such as a Lease's ``renewTime``).
- ``parse_time``: either form (or any RFC 3339 offset) -> seconds since the epoch; ``None``
  for anything that is not a timestamp, so a reader can fall back to another field.
- ``parse_duration``: ``30s``, ``5m``, ``1h30m`` -> seconds, as RemediationPolicy and the
  agent's classification table write durations.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
_MICROSECONDS = "%Y-%m-%dT%H:%M:%S.%fZ"

# ASCII digits only and full matches, exactly as the CRD's patterns (the API server's regex engine).
_DURATION = re.compile(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+(?:\.[0-9]+)?)s)?")


def format_time(ts: float, *, micro: bool = False) -> str:
    """Seconds since the epoch -> RFC 3339 UTC: ``...T12:00:00Z``, or ``...T12:00:00.123456Z`` if ``micro``."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime(_MICROSECONDS if micro else _SECONDS)


def parse_time(text: Any) -> float | None:
    """An RFC 3339 timestamp -> seconds since the epoch; ``None`` if ``text`` is not one.

    A timestamp without an offset is taken as UTC (the API server always writes ``Z``)."""
    if not text or not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def parse_duration(text: Any, where: str, *, error: type[ValueError] = ValueError) -> float:
    """``90s``, ``5m``, ``1h30m`` -> seconds; anything else raises ``error`` naming ``where``.

    Callers pass their own exception class (``PolicyError``, ``ClassificationError``) so the
    error says which document and field is wrong and what was expected."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) and text else None
    if match is None or not any(match.groups()):
        raise error(f"{where}: expected a duration like 30s, 5m or 1h30m, got {text!r}")
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)
