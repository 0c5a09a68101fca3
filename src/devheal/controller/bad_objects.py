"""Objects the controller cannot read, told on the objects themselves.

The cache leaves an unreadable object out of every decision (``devheal.controller.cache``) and has
already logged and counted each distinct error of an unreadable object; the leader writes one Warning
Event per error on the object, saying which field held what and what was expected, so ``kubectl
describe`` shows why devheal ignores it. An object fixed or deleted before its Event is written gets none.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from devheal.controller.cache import ClusterCache
from devheal.controller.events import EventRecorder
from devheal.kube.informer import Unreadable

UNREADABLE_EVENT = "DevhealInvalidObject"
"""The Event reason on an object devheal cannot read."""


class BadObjectReports:
    """Turns the cache's unreadable objects into Event writes, once per distinct error."""

    def __init__(self, events: EventRecorder) -> None:
        self.events = events

    def check(self, cache: ClusterCache) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """(work-queue key, Event write) for each unreadable object's error not reported yet."""
        pending, cache.unreadable = cache.unreadable, {}
        return [
            (f"unreadable/{item.kind}/{item.key}", functools.partial(self._event, item))
            for item in pending.values()
            if cache.still_unreadable(item)
        ]

    async def _event(self, item: Unreadable) -> None:
        involved = {"kind": item.kind, "name": item.name, "uid": item.uid, "apiVersion": item.api_version}
        if item.namespace:
            involved["namespace"] = item.namespace
        await self.events.record(involved, UNREADABLE_EVENT, item.message, "Warning")
