"""Timestamps and durations as written in Kubernetes objects and devheal's resources (pure).

- ``format_time``: seconds since the epoch -> RFC 3339 in UTC, to the second
  (``2024-05-01T12:00:00Z``, a ``metav1.Time``), or to the microsecond with ``micro=True``
  (``2024-05-01T12:00:00.000000Z``, a ``metav1.MicroTime`` such as a Lease's ``renewTime``).
- ``parse_time``: either form (or any RFC 3339 offset) -> seconds since the epoch; ``None``
  for anything that is not a timestamp, so a reader can fall back to another field, and for a
  time outside ``EARLIEST``..``LATEST`` (before 1970, or one that cannot be written back).
- ``format_time`` never raises: a time outside what RFC 3339 can write (before year 1, after
  9999, inf, nan) is written as the nearest one it can.
- ``parse_duration``: ``30s``, ``5m``, ``1h30m`` -> seconds, as RemediationPolicy and the
  agent's classification table write durations; at most ``MAX_DURATION`` (Go's longest
  ``time.Duration``), so a duration added to a time can always be written back.
- ``format_duration``: seconds -> ``1h30m``, what ``parse_duration`` reads back (nan and less than
  nothing: ``0s``; more than ``MAX_DURATION``: that).

Both read ASCII digits only: Python's parsers also take '٣' and '１２'.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

from devheal.model.values import show

_UNIX_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

EARLIEST = 0.0
"""1970-01-01T00:00:00Z. No clock devheal reads (the API server's, a node agent's) runs earlier, and what it
derives from a time (a record's epoch label) must not be negative: an earlier time reads as no time."""
LATEST = 253402300799.0
"""9999-12-31T23:59:59Z, the last second RFC 3339 (and Go's ``time.Time`` marshalling) can write."""
_FIRST = -62135596800.0
"""0001-01-01T00:00:00Z, the first second RFC 3339 can write."""

# ASCII digits only and full matches, exactly as the CRD's patterns (the API server's regex engine).
_DURATION = re.compile(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+(?:\.[0-9]+)?)s)?")
_DURATION_MAX_LENGTH = 64
"""Longer is no duration a person writes (the CRD allows 32 characters); cut off before int() reads it."""

MAX_DURATION = (2**63 - 1) / 1e9
"""Seconds in Go's longest ``time.Duration`` (2562047h47m16.854775807s)."""


def format_time(ts: float, *, micro: bool = False) -> str:
    """Seconds since the epoch -> RFC 3339 UTC: ``...T12:00:00Z``, or ``...T12:00:00.123456Z`` if ``micro``.

    Never raises: a time RFC 3339 cannot write is written as the nearest one it can (nan as the epoch)."""
    try:
        number = float(ts)
    except OverflowError:  # an int too large for a float
        number = math.inf if ts > 0 else -math.inf
    seconds = 0.0 if math.isnan(number) else min(max(number, _FIRST), LATEST)
    m = _UNIX_EPOCH + datetime.timedelta(seconds=seconds)
    # Not strftime: its %Y writes year 1 as "1", which is no RFC 3339 year.
    text = f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
    return f"{text}.{m.microsecond:06d}Z" if micro else f"{text}Z"


def parse_time(text: Any) -> float | None:
    """An RFC 3339 timestamp -> seconds since the epoch; ``None`` if ``text`` is not one.

    A timestamp without an offset is taken as UTC (the API server always writes ``Z``)."""
    if not text or not isinstance(text, str) or not text.isascii():
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    try:
        seconds = (moment - _UNIX_EPOCH).total_seconds()
    except OverflowError:  # year 1 with a positive offset is before year 1 in UTC
        return None
    return seconds if EARLIEST <= seconds <= LATEST else None


def parse_duration(text: Any, where: str, *, error: type[ValueError] = ValueError) -> float:
    """``90s``, ``5m``, ``1h30m`` -> seconds; anything else raises ``error`` naming ``where``.

    Callers pass their own exception class (``PolicyError``, ``ClassificationError``) so the
    error says which document and field is wrong and what was expected."""
    readable = isinstance(text, str) and 0 < len(text) <= _DURATION_MAX_LENGTH
    match = _DURATION.fullmatch(text) if readable else None
    if match is None or not any(match.groups()):
        raise error(f"{where}: expected a duration like 30s, 5m or 1h30m, got {show(text)}")
    hours, minutes, seconds = match.groups()
    total = int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)
    if total > MAX_DURATION:
        raise error(f"{where}: expected a duration of at most 2562047h47m16.854775807s, got {show(text)}")
    return total


def format_duration(seconds: float) -> str:
    """Seconds -> a duration as policies write it (``parse_duration`` reads it back): ``30s``, ``5m``, ``1h30m``,
    ``720h``; ``0s`` for none (negative, nan too); fractions of a second to the millisecond."""
    longest = math.floor(MAX_DURATION * 1000)
    millis = 0 if math.isnan(seconds) else longest if seconds >= MAX_DURATION else round(max(0.0, seconds) * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    parts = [f"{hours}h"] if hours else []
    if minutes:
        parts.append(f"{minutes}m")
    if rest or not parts:
        parts.append(f"{rest // 1000}s" if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0") + "s")
    return "".join(parts)
