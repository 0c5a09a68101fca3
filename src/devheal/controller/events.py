"""Events written the way kubelet's and client-go's EventRecorder writes them: aggregated and rate-limited.

A controller that says the same thing on every pass (a refused eviction, a blocked decision)
must not fill etcd with Event objects. Three things keep it small, as client-go's
``EventCorrelator`` does:

- **the same Event is counted, not repeated**: an occurrence whose (involved object, reason,
  type, message) was recorded within ``window`` seconds (10 minutes) patches that Event's
  ``count`` and ``lastTimestamp`` instead of creating another object;
- **similar Events are combined**: from the ``similar``-th (10th) distinct message with the
  same (involved object, reason, type) within ``window``, the messages are merged into one
  Event, "(combined from similar events): <latest message>", so a message that embeds a
  changing number cannot make an Event per pass either;
- **each involved object has a token bucket** (``burst`` 25, one token back every
  ``refill`` seconds, 5 minutes): a write without a token is dropped, with a debug line and
  ``devheal_events_dropped_total``. A dropped occurrence is still counted, so the next
  write that gets through carries the true count.

What it remembers is bounded: at most ``capacity`` (4096) series and as many buckets, the
least recently used forgotten first. A failed write is logged and never raised: an Event is
a courtesy, the action it reports must not fail because of it. The clock is injected (the
controller's), so tests run on virtual time.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devheal.controller import metrics
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.times import format_time

log = logging.getLogger(__name__)

WINDOW = 600.0
"""Seconds within which a repeated Event is counted on the same object (client-go: 10 minutes)."""
SIMILAR = 10
"""Distinct messages of one (object, reason, type) within ``WINDOW`` after which they are combined."""
BURST = 25
"""Writes one involved object may have at once (client-go's spam filter)."""
REFILL = 300.0
"""Seconds for one write to come back to an involved object's bucket (client-go: 1 per 5 minutes)."""
CAPACITY = 4096
"""Series (and buckets) remembered at most; the least recently used are forgotten first."""
MESSAGE_LIMIT = 1000
COMBINED = "(combined from similar events): "

Key = tuple[str, ...]

_NOT_NAME = re.compile(r"[^a-z0-9]+")
_NAME_PREFIX = 40
"""Characters of the involved object's name kept: with ``.devheal.`` under the 58 the API server keeps of a
``generateName`` before its 5 random characters, so what it generates is the name asked for."""


def event_name_prefix(involved_name: object) -> str:
    """The Event's ``generateName``: the involved object's name, made a valid DNS subdomain.

    The involved object may be a gang named by a label value (upper case, '_' allowed) or a name of
    253 characters; the API server refuses an Event whose name is not a lowercase DNS subdomain."""
    readable = _NOT_NAME.sub("-", str(involved_name or "").lower())[:_NAME_PREFIX].strip("-")
    return f"{readable or 'object'}.devheal."


@dataclass
class _Series:
    """One Event object and the occurrences it counts."""

    first: float
    last: float
    count: int = 0
    name: str = ""
    """The Event object's name once created ("" until a write got through)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One write at a time per series: two racing first occurrences create one object."""


@dataclass
class _Similar:
    last: float
    messages: set[str] = field(default_factory=set)


@dataclass
class _Bucket:
    tokens: float
    at: float


class _Lru(OrderedDict[Key, Any]):
    """A dict that forgets its least recently used entries beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def touch(self, key: Key, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)
        return value


def _object_key(involved: Obj) -> Key:
    return tuple(str(involved.get(f) or "") for f in ("kind", "namespace", "name", "uid", "apiVersion"))


class EventRecorder:
    """Writes Events for one component, aggregated and rate-limited per involved object."""

    def __init__(
        self,
        client: KubeClient,
        clock: Callable[[], float],
        *,
        component: str = "devheal-controller",
        window: float = WINDOW,
        similar: int = SIMILAR,
        burst: int = BURST,
        refill: float = REFILL,
        capacity: int = CAPACITY,
    ) -> None:
        self.client = client
        self.clock = clock
        self.component = component
        self.window = window
        self.similar = similar
        self.burst = burst
        self.refill = refill
        self._series = _Lru(capacity)
        self._similar = _Lru(capacity)
        self._buckets = _Lru(capacity)

    async def record(self, involved: Obj, reason: str, message: str, type_: str = "Normal") -> None:
        """One occurrence of an Event on ``involved`` (an ObjectReference: kind, namespace, name, uid...).

        Never raises for an API failure: it is logged, and the next occurrence tries again."""
        now = self.clock()
        message = message[:MESSAGE_LIMIT]
        obj = _object_key(involved)
        combined = self._combined(obj, reason, type_, message, now)
        key = (*obj, reason, type_, COMBINED if combined else message)
        shown = f"{COMBINED}{message}"[:MESSAGE_LIMIT] if combined else message
        series = self._series.get(key)
        if series is None or now - series.last > self.window:
            series = _Series(first=now, last=now)
        self._series.touch(key, series)
        series.count += 1
        series.last = now
        if not self._allow(obj, now):
            metrics.EVENTS_DROPPED.labels(reason=reason).inc()
            log.debug(
                "event %s on %s %s dropped: over %d writes per %.0fs (occurrence %d)",
                reason,
                involved.get("kind"),
                involved.get("name"),
                self.burst,
                self.refill,
                series.count,
            )
            return
        async with series.lock:
            try:
                await self._write(involved, series, reason, shown, type_)
            except errors.KubeError as exc:
                log.warning(
                    "could not record event %s on %s %s: %s", reason, involved.get("kind"), involved.get("name"), exc
                )

    def _combined(self, obj: Key, reason: str, type_: str, message: str, now: float) -> bool:
        """Whether ``similar`` distinct messages of this (object, reason, type) came within the window: then
        they all go on one Event, which shows the latest."""
        key = (*obj, reason, type_)
        seen = self._similar.get(key)
        if seen is None or now - seen.last > self.window:
            seen = _Similar(last=now)
        seen.last = now
        self._similar.touch(key, seen)
        if len(seen.messages) < self.similar:
            seen.messages.add(message)
        return len(seen.messages) >= self.similar

    def _allow(self, obj: Key, now: float) -> bool:
        """Take a token from the involved object's bucket (refilled at one per ``refill`` seconds)."""
        bucket = self._buckets.get(obj)
        if bucket is None:
            bucket = _Bucket(tokens=float(self.burst), at=now)
        bucket.tokens = min(float(self.burst), bucket.tokens + max(0.0, now - bucket.at) / self.refill)
        bucket.at = now
        self._buckets.touch(obj, bucket)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    async def _write(self, involved: Obj, series: _Series, reason: str, message: str, type_: str) -> None:
        namespace = str(involved.get("namespace") or "default")
        last = format_time(series.last)
        if series.name:
            path = api_path("v1", "events", namespace=namespace, name=series.name)
            try:
                await self.client.patch(path, {"count": series.count, "lastTimestamp": last, "message": message})
                return
            except errors.NotFound:
                series.name = ""  # expired (the API server's Event TTL): a new object carries the count on
        created = await self.client.create(
            api_path("v1", "events", namespace=namespace),
            {
                "metadata": {"generateName": event_name_prefix(involved.get("name")), "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": self.component},
                "firstTimestamp": format_time(series.first),
                "lastTimestamp": last,
                "count": series.count,
            },
        )
        series.name = str((created.get("metadata") or {}).get("name") or "")


__all__ = ["EventRecorder", "event_name_prefix"]
