"""An in-memory Kubernetes API server on 127.0.0.1, speaking the REST/JSON protocol.

The real ``devheal.kube.client.KubeClient`` connects to it through a kubeconfig (plain
http, no auth), so unit tests run the real request, ``list_all`` and watch code and the
real error mapping against real objects (``tests.shell.store``). It runs in the test's
own event loop, so it works on virtual time (``tests.shell.virtual_time``).

Besides the protocol, it has knobs a test turns to make the server misbehave:

- ``fail_next``: answer the next matching request(s) with an error status (429, 500, 504...);
  ``too_large_resource_version``: the 504 the server sends while its watch cache lags;
- ``slow_next``: answer the next matching request(s) only after a delay (a hung server);
- ``meanwhile``: make a change just before serving the next matching request (a race lost);
- ``gone_next_watch``: the next watch answers 410 Gone (an ERROR event, as the server does);
- ``compact``: forget the event history, so watches and list continuations from older
  versions are answered 410 Gone;
- ``stall_watches`` / ``resume_watches``: open watches stop sending anything (a hung
  connection) until resumed;
- ``stop_failing``: forget the faults not used up yet (an outage made of
  ``fail_next(..., times=many)`` ends);
- ``close_watches``: end open watches cleanly (as their timeout would); ``bookmark``:
  send a BOOKMARK to every watch that allows them.

Every request is recorded in ``requests`` with its loop time and its user. Several clients
can tell themselves apart: ``kubeconfig(path, user="a")`` makes a client send the bearer
token ``a``, and every knob takes ``user=`` to hit only that client's requests (one replica
cut off from the API while another still reaches it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.shell import store as store_module
from tests.shell.selectors import Matcher, SelectorError, matcher
from tests.shell.store import ApiError, Event, Obj, Ref, Store

_CLOSE = object()
_WRITES = frozenset({"create", "update", "patch", "delete"})


@dataclass(frozen=True)
class Call:
    verb: str
    """get, list, watch, create, update, patch or delete (Kubernetes' verbs)."""
    path: str
    params: dict[str, str]
    at: float
    """The loop's time when the request arrived."""
    user: str = ""
    """The bearer token the client sent (``kubeconfig(path, user=...)``), empty without one."""


@dataclass
class Fault:
    status: int
    """The status to answer with; 0 to answer normally, after ``delay``."""
    verb: str
    path: str
    times: int
    reason: str
    message: str
    delay: float = 0.0
    meanwhile: Callable[[], object] | None = None
    """Run just before the request is served (another client's change that races it)."""
    user: str = ""
    """Only requests of this user (any if empty)."""
    details: dict[str, Any] | None = None
    """The Status's ``details`` (causes, retryAfterSeconds), if any."""

    def matches(self, verb: str, path: str, user: str = "") -> bool:
        return (
            self.times > 0
            and (not self.verb or self.verb == verb)
            and path.startswith(self.path)
            and (not self.user or self.user == user)
        )


_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class _Watch:
    path: str
    ref: Ref
    match: Matcher
    bookmarks: bool
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    stalled: bool = False
    """Hung by ``stall_watches(..., later=False)`` until resumed."""

    def translate(self, event: Event) -> tuple[str, Obj] | None:
        """The event as this watch sees it: objects moving in or out of its selectors are added or deleted."""
        if not self.ref.in_collection(event.key):
            return None
        if event.type == "DELETED":
            return ("DELETED", event.obj) if self.match(event.obj) else None
        was = event.prev is not None and self.match(event.prev)
        now = self.match(event.obj)
        if now:
            return ("MODIFIED" if was else "ADDED"), event.obj
        return ("DELETED", event.obj) if was else None


class MemApi:
    """Start with ``async with MemApi() as api``; ``api.kubeconfig(path)`` writes a kubeconfig for it."""

    def __init__(self, *, now: Callable[[], Any] | None = None, window: int = 1000) -> None:
        self.store = Store(window=window) if now is None else Store(now=now, window=window)
        self.requests: list[Call] = []
        self.faults: list[Fault] = []
        self.watches: list[_Watch] = []
        self._gone_watches = 0
        self._stalls: list[str] = []
        self._resume = asyncio.Event()
        self._resume.set()
        self._sleeping: set[asyncio.Task[Any]] = set()
        self.discovery: dict[str, Obj] = {}
        """Answers to discovery requests (``/apis/<group>/<version>``), by path: see ``serve_discovery``."""
        self._cut_off: dict[str, int] = {}
        """Per user, the writes still to land before that client is cut off (``cut_off``)."""
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.store.listeners.append(self._publish)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> MemApi:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        self.resume_watches()
        for watch in self.watches:
            watch.queue.put_nowait(_CLOSE)
        for task in self._sleeping:
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> MemApi:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def kubeconfig(self, path: Path, user: str = "", *, token_file: Path | None = None) -> Path:
        """A kubeconfig for this server; with ``user``, the client sends it as its bearer token.

        With ``token_file``, the user's token is read from that file (``tokenFile``), which a test
        may rewrite (a rotated token); requests then carry the file's token as their user.
        """
        credentials: dict[str, str] = {"token": user} if user else {}
        if token_file is not None:
            credentials["tokenFile"] = str(token_file)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "memapi", "cluster": {"server": self.url}}],
            "users": [{"name": "memapi", "user": credentials}],
            "contexts": [{"name": "memapi", "context": {"cluster": "memapi", "user": "memapi"}}],
            "current-context": "memapi",
        }
        path.write_text(json.dumps(config))
        return path

    # ---- changes made "meanwhile on the server", without a request ---------------------------

    def create(self, path: str, body: Obj) -> Obj:
        """Create at a collection path, as another client would (watchers see it)."""
        return self.store.create(Ref.parse(path), body)

    def patch(self, path: str, body: Any, content_type: str = store_module.MERGE_PATCH) -> Obj:
        return self.store.patch(Ref.parse(path), body, content_type)

    def delete(self, path: str) -> Obj:
        return self.store.delete(Ref.parse(path))

    def get(self, path: str) -> Obj:
        return self.store.get(Ref.parse(path))

    # ---- knobs --------------------------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        *,
        verb: str = "",
        path: str = "",
        times: int = 1,
        reason: str = "",
        message: str = "",
        user: str = "",
        details: dict[str, Any] | None = None,
    ) -> None:
        """Answer the next ``times`` requests of ``verb`` (any if empty) under ``path`` with ``status``.

        ``details`` goes into the Status as is (``causes``, ``retryAfterSeconds``); see
        ``too_large_resource_version`` for the one the API server sends when its watch cache lags.
        """
        reason = reason or _REASONS.get(status, "")
        message = message or f"injected {status} {reason}"
        self.faults.append(Fault(status, verb, path, times, reason, message, user=user, details=details))

    def too_large_resource_version(self, *, verb: str = "list", path: str = "", times: int = 1) -> None:
        """Answer as the API server does while its watch cache is behind the version asked for.

        Its ``storage.NewTooLargeResourceVersionError``: a 504 ``Timeout`` Status with the cause
        ``ResourceVersionTooLarge`` and ``retryAfterSeconds`` 1.
        """
        wanted = self.store.rv + 1
        self.fail_next(
            504,
            verb=verb,
            path=path,
            times=times,
            reason="Timeout",
            message=f"Timeout: Too large resource version: {wanted}, current: {self.store.rv}",
            details={
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            },
        )

    def slow_next(self, seconds: float, *, verb: str = "", path: str = "", times: int = 1, user: str = "") -> None:
        """Answer the next ``times`` requests of ``verb`` under ``path`` only after ``seconds`` (a hung server)."""
        self.faults.append(Fault(0, verb, path, times, "", "", delay=seconds, user=user))

    def meanwhile(
        self, change: Callable[[], object], *, verb: str = "", path: str = "", times: int = 1, user: str = ""
    ) -> None:
        """Just before serving the next matching request, make ``change`` (another client's write racing it)."""
        self.faults.append(Fault(0, verb, path, times, "", "", meanwhile=change, user=user))

    def serve_discovery(self, group_version: str, *plurals: str) -> None:
        """Answer ``GET /apis/<group_version>`` with an APIResourceList naming ``plurals`` (an installed CRD's group).

        Without it, as on an API server without the definitions, that path is 404.
        """
        self.discovery[f"/apis/{group_version}"] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {"name": p, "namespaced": False, "kind": "", "verbs": ["get", "list", "watch"]} for p in plurals
            ],
        }

    def cut_off(self, user: str, after_writes: int) -> None:
        """Let ``after_writes`` more writes of ``user`` land, then hold every request of theirs for good.

        The last write is stored but never answered: the client looks like a process killed
        right after the API server persisted its write (SIGKILL at that point), whatever it
        meant to do next.
        """
        self._cut_off[user] = after_writes

    def is_cut_off(self, user: str) -> bool:
        return self._cut_off.get(user, 1) <= 0

    def gone_next_watch(self, times: int = 1) -> None:
        self._gone_watches += times

    def compact(self) -> None:
        self.store.compact()

    def stall_watches(self, path: str = "", *, later: bool = True) -> None:
        """Watches under ``path`` (open now or opened later) send nothing, not even their end, until resumed.

        With ``later=False`` only the watches open now hang (a dead connection): new ones work.
        """
        if later:
            self._stalls.append(path)
        for watch in self.watches:
            if watch.path.startswith(path):
                watch.stalled = True
        self._resume.clear()

    def resume_watches(self) -> None:
        self._stalls.clear()
        for watch in self.watches:
            watch.stalled = False
        self._resume.set()

    def stop_failing(self) -> None:
        """Forget the faults not used up yet (``fail_next(..., times=many)`` as an outage: the API is back)."""
        self.faults.clear()

    def close_watches(self, path: str = "") -> None:
        for watch in self.watches:
            if watch.path.startswith(path):
                watch.queue.put_nowait(_CLOSE)

    def bookmark(self) -> None:
        for watch in self.watches:
            if watch.bookmarks:
                marker = {"kind": "Bookmark", "apiVersion": watch.ref.api_version}
                marker["metadata"] = {"resourceVersion": str(self.store.rv)}
                watch.queue.put_nowait(("BOOKMARK", marker))

    def watching(self, path: str = "") -> int:
        """How many watches under ``path`` are open."""
        return sum(1 for w in self.watches if w.path.startswith(path))

    def calls(self, verb: str = "", path: str = "", user: str = "") -> list[Call]:
        return [
            c
            for c in self.requests
            if (not verb or c.verb == verb) and c.path.startswith(path) and (not user or c.user == user)
        ]

    # ---- the protocol -------------------------------------------------------------------------

    def _publish(self, event: Event) -> None:
        for watch in self.watches:
            seen = watch.translate(event)
            if seen is not None:
                watch.queue.put_nowait(seen)

    async def _sleep(self, seconds: float | None) -> None:
        """Hold a request for ``seconds``, or for good with None (cancelled when the server closes: a client
        that gave up leaves it behind)."""
        task = asyncio.current_task()
        assert task is not None
        self._sleeping.add(task)
        try:
            if seconds is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(seconds)
        finally:
            self._sleeping.discard(task)

    @staticmethod
    def _answer(body: Any, status: int = 200) -> web.Response:
        return web.json_response(body, status=status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if request.method == "GET" and request.path in self.discovery:
            return self._answer(self.discovery[request.path])
        try:
            ref = Ref.parse(request.path)
        except ApiError as exc:
            return self._answer(exc.status(), exc.code)
        method = request.method
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "get")
        if method == "GET" and not ref.name:
            verb = "watch" if params.get("watch") in ("1", "true") else "list"
        auth = request.headers.get("Authorization", "")
        user = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
        self.requests.append(Call(verb, request.path, params, asyncio.get_running_loop().time(), user))
        if self.is_cut_off(user):
            await self._sleep(None)
        for fault in self.faults:
            if fault.matches(verb, request.path, user):
                fault.times -= 1
                if fault.delay:
                    await self._sleep(fault.delay)
                if fault.meanwhile is not None:
                    fault.meanwhile()
                if fault.status:
                    error = ApiError(fault.status, fault.reason, fault.message, fault.details)
                    return self._answer(error.status(), fault.status)
                break
        try:
            body = await self._body(request)
            match = matcher(params.get("labelSelector", ""), params.get("fieldSelector", ""))
            if verb == "watch":
                return await self._watch(request, ref, params, match)
            answer, status = self._serve(verb, ref, params, body, request.content_type, match)
            if user in self._cut_off and verb in _WRITES:
                self._cut_off[user] -= 1
                if self._cut_off[user] <= 0:
                    await self._sleep(None)  # stored, never answered
            return self._answer(answer, status)
        except ApiError as exc:
            return self._answer(exc.status(), exc.code)
        except SelectorError as exc:
            return self._answer(ApiError(400, "BadRequest", str(exc)).status(), 400)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        if not request.can_read_body:
            return None
        raw = await request.read()
        if not raw:
            return None
        try:
            if request.content_type == store_module.APPLY_PATCH:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"cannot decode the body: {exc}") from exc

    def _serve(
        self, verb: str, ref: Ref, params: dict[str, str], body: Any, ctype: str, match: Matcher
    ) -> tuple[Obj, int]:
        s = self.store
        if verb == "list":
            limit = int(params.get("limit") or 0)
            counted = not params.get("labelSelector") and not params.get("fieldSelector")
            return s.list(ref, match, limit=limit, token=params.get("continue", ""), counted=counted), 200
        if verb == "get":
            if ref.subresource not in ("", "status"):
                raise ApiError(405, "MethodNotAllowed", f"GET is not allowed on {ref.subresource}")
            return s.get(ref), 200
        if verb == "create":
            if ref.subresource == "eviction":
                return s.evict(ref, body, dry_run=params.get("dryRun") == "All"), 201
            if ref.subresource:
                raise ApiError(405, "MethodNotAllowed", f"POST is not allowed on {ref.subresource}")
            return s.create(ref, body), 201
        if verb == "update":
            return s.replace(ref, body), 200
        if verb == "patch":
            if ctype == store_module.APPLY_PATCH and ref.key not in s.objects and not ref.subresource:
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "an apply patch is an object")
                collection = Ref(ref.prefix, ref.plural, ref.namespace)
                return s.create(collection, {**body, "metadata": {**body.get("metadata", {}), "name": ref.name}}), 201
            return s.patch(ref, body, ctype), 200
        return s.delete(ref, body), 200

    async def _watch(
        self, request: web.Request, ref: Ref, params: dict[str, str], match: Matcher
    ) -> web.StreamResponse:
        watch = _Watch(request.path, ref, match, params.get("allowWatchBookmarks") == "true")
        since = params.get("resourceVersion", "")
        # Everything up to ``prepare`` is synchronous: no event can slip between the backlog and the live feed.
        if self._gone_watches > 0:
            self._gone_watches -= 1
            watch.queue.put_nowait(("ERROR", store_module.gone(f"too old resource version: {since}").status()))
            watch.queue.put_nowait(_CLOSE)
        elif since in ("", "0"):
            for key in sorted(k for k, obj in self.store.objects.items() if ref.in_collection(k) and match(obj)):
                watch.queue.put_nowait(("ADDED", self.store.get(Ref(*key))))
        else:
            try:
                backlog = self.store.events_after(int(since), (ref.prefix, ref.plural))
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from exc
            except ApiError as exc:
                watch.queue.put_nowait(("ERROR", exc.status()))
                watch.queue.put_nowait(_CLOSE)
                backlog = []
            for event in backlog:
                seen = watch.translate(event)
                if seen is not None:
                    watch.queue.put_nowait(seen)
        self.watches.append(watch)
        timer = asyncio.get_running_loop().call_later(
            float(params.get("timeoutSeconds") or 1800), watch.queue.put_nowait, _CLOSE
        )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request)
            while True:
                item = await watch.queue.get()
                while watch.stalled or any(watch.path.startswith(p) for p in self._stalls):
                    await self._resume.wait()
                if item is _CLOSE:
                    break
                kind, obj = item
                await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        except ConnectionError:
            pass  # the client went away
        finally:
            timer.cancel()
            self.watches.remove(watch)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response
