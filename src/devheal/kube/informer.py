"""List-then-watch reflectors feeding an in-memory store, the client-go way.

A ``Reflector`` lists a collection page by page (each page projected and stored as it
arrives, so a large cluster is never held raw), then watches from the list's
resourceVersion with bookmarks. An expired version (410 Gone) means "list again
and diff", so no deletion is ever missed; a watch that sends nothing for 50 s (a
hung connection) is opened again from its version; other failures back off
exponentially with jitter, up to 4 s. Objects may be projected on arrival (keep only the fields a caller
uses) so the store stays small; handlers get (old, new) and only enqueue work.

An object whose newest version cannot be projected, whatever the exception, is *unreadable*: it is
never kept at an older copy (nothing may be decided from what the object no longer says). It leaves
the store, or is replaced by what its ``fallback`` projection still reads of it, and is listed in
``invalid`` until a readable version arrives or it is deleted; each distinct error is logged once (one
line) and handed once to the ``on_invalid`` callbacks while it lasts (a new version with the same error,
a heartbeat say, is not reported again).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from devheal.kube import errors
from devheal.kube.client import WATCH_IDLE_TIMEOUT, KubeClient, Obj

log = logging.getLogger(__name__)

T = TypeVar("T")

YIELD_EVERY = 100
"""Objects of a list page projected between two turns of the event loop."""

Handler = Callable[[str, "T | None", "T | None"], None]
"""Called as ``handler(key, old, new)``: new is None on delete, old is None on add."""


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    ns = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


@dataclass(frozen=True, slots=True)
class Unreadable:
    """One version of an object its reflector could not project: who it is and why, in words."""

    kind: str
    key: str
    """``namespace/name`` or ``name``, as in the store."""
    name: str
    namespace: str
    uid: str
    version: str
    """Its resourceVersion."""
    api_version: str
    message: str
    """Which object, and what could not be read in it (the projection's own error, or the unexpected one)."""


def _reference(raw: Obj) -> tuple[str, str, str, str]:
    """(name, namespace, uid, resourceVersion) of a raw object, each "" where it is not a string."""
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    fields = (meta.get(f) for f in ("name", "namespace", "uid", "resourceVersion"))
    name, namespace, uid, version = (v if isinstance(v, str) else "" for v in fields)
    return name, namespace, uid, version


@dataclass
class Reflector(Generic[T]):
    """Keeps ``store`` equal to the server's collection at ``path``."""

    client: KubeClient
    path: str
    project: Callable[[Obj], T]
    handlers: list[Handler[T]] = field(default_factory=list)
    params: dict[str, str | int] = field(default_factory=dict)
    store: dict[str, T] = field(default_factory=dict)
    kind: str = ""
    """The objects' kind, for messages ("" : the path's last segment)."""
    expected: tuple[type[BaseException], ...] = ()
    """The projection's own errors (each names the object, the field and what was expected); any other
    exception is unexpected: logged with its traceback, its type named in the message."""
    fallback: Callable[[Obj], T] | None = None
    """What is still known of an unreadable object (its identity, say); None (or a fallback that fails too):
    the object leaves the store."""
    on_invalid: list[Callable[[Unreadable], None]] = field(default_factory=list)
    """Called once per distinct error of an unreadable object, while it lasts."""
    invalid: dict[str, Unreadable] = field(default_factory=dict)
    """The objects whose newest version could not be projected, by key."""
    resource_version: str = ""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    relists: int = 0
    page_size: int = 500
    """Objects per list request: the most raw objects held at once while listing."""
    max_backoff: float = 4.0
    """The longest wait (before jitter) between two failed tries: the cache catches up within
    5 s of the API server coming back."""
    idle_timeout: float = WATCH_IDLE_TIMEOUT
    """Seconds a watch may send nothing (no event, no bookmark) before it is opened again."""

    def _notify(self, key: str, old: T | None, new: T | None) -> None:
        for handler in self.handlers:
            try:
                handler(key, old, new)
            except Exception:
                log.exception("handler for %s failed on %s", self.path, key)

    def _apply(self, event_type: str, raw: Obj) -> None:
        key = object_key(raw)
        if event_type == "DELETED":
            self.invalid.pop(key, None)
            old = self.store.pop(key, None)
            if old is not None:
                self._notify(key, old, None)
            return
        try:
            new = self.project(raw)
        except Exception as exc:
            # A malformed object must never stop the watch, nor be decided on from an older copy.
            self._unreadable(key, raw, exc)
            return
        self.invalid.pop(key, None)
        old = self.store.get(key)
        self.store[key] = new
        self._notify(key, old, new)

    def _unreadable(self, key: str, raw: Obj, exc: Exception) -> None:
        """Drop (or replace by its fallback) an object whose newest version cannot be projected; report the
        version once."""
        name, namespace, uid, version = _reference(raw)
        kind = self.kind or self.path.rsplit("/", 1)[-1]
        expected = isinstance(exc, self.expected)
        why = str(exc)[:1000] if expected else f"{kind} {key}: unexpected {type(exc).__name__}: {str(exc)[:500]}"
        message = f"{why}; the {kind} is left out of every decision until a version that can be read arrives"
        item = Unreadable(kind, key, name, namespace, uid, version, str(raw.get("apiVersion") or ""), message)
        known = self.invalid.get(key)
        self.invalid[key] = item
        # Once per distinct error while it lasts: a heartbeat that rewrites the same bad object says nothing new.
        if known is None or known.message != message:
            log.warning("%s (resourceVersion %s)", message, version or "?", exc_info=not expected)
            for callback in self.on_invalid:
                try:
                    callback(item)
                except Exception:
                    log.exception("on_invalid callback for %s failed on %s", self.path, key)
        fallback: T | None = None
        if self.fallback is not None:
            try:
                fallback = self.fallback(raw)
            except Exception:
                fallback = None  # not even that can be read: the object leaves the store
        old = self.store.pop(key, None)
        if fallback is not None:
            self.store[key] = fallback
            self._notify(key, old, fallback)
        elif old is not None:
            self._notify(key, old, None)

    async def _take(self, items: list[Obj], seen: set[str]) -> None:
        """Project and store one page of a list (an object that cannot be read leaves the store).

        Every ``YIELD_EVERY`` objects the loop gets a turn: the next page's request goes out while
        this one is projected, and the other watches and the leader's lease are served meanwhile.
        """
        for index, item in enumerate(items):
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            seen.add(object_key(item))
            self._apply("MODIFIED", item)

    async def _relist(self) -> None:
        """List page by page, storing each page as it arrives; then drop what the list no longer has.

        At most two pages of raw objects are held at a time, the one projected and the next one
        arriving (raw pods weigh about 45 KB each, their projections a few hundred bytes); the
        keys seen are kept to find the deletions once the list is complete. A list that fails
        half-way (a continuation answered 410) has stored objects no older than the store's and
        deleted nothing; the next list starts over.
        """
        seen: set[str] = set()
        version = ""
        async for page in self.client.list_pages(self.path, self.params, page_size=self.page_size):
            await self._take(page.items, seen)
            version = page.resource_version
            page.items.clear()  # the raw objects go before the next page arrives
        for key in [k for k in self.store if k not in seen]:
            old = self.store.pop(key)
            self._notify(key, old, None)
        for key in [k for k in self.invalid if k not in seen]:
            del self.invalid[key]
        self.resource_version = version
        self.relists += 1
        self.synced.set()

    async def run(self) -> None:
        """List and watch forever (until cancelled)."""
        backoff = 0.2
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                timeout = random.randint(240, 360)
                async for event in self.client.watch(
                    self.path,
                    self.resource_version,
                    timeout_seconds=timeout,
                    idle_timeout=self.idle_timeout,
                    **self.params,
                ):
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if event.get("type") != "BOOKMARK":
                        self._apply(str(event.get("type")), obj)
                    if version:
                        self.resource_version = str(version)
                backoff = 0.2
            except errors.Gone:
                need_list = True
            except errors.WatchStalled as exc:
                # A hung connection, or a quiet collection between two of the server's bookmarks:
                # either way, watch again at once from the version reached.
                log.info("%s; watching again from %s", exc, self.resource_version)
            except asyncio.CancelledError:
                raise
            except errors.KubeError as exc:
                log.warning("watch %s failed: %s; retrying in %.1fs", self.path, exc, backoff)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self.max_backoff)
                if isinstance(exc, errors.PermanentError):
                    need_list = True


def raw(obj: Obj) -> Obj:
    """Projection that keeps the whole object."""
    return obj
