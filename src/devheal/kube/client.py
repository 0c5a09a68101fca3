"""A small asynchronous client for the Kubernetes API, speaking plain JSON.

``devheal.kube.kubeconfig`` finds the server and the credentials (kubeconfig or in-cluster
service account) the way kubectl does; we send requests over one aiohttp session ourselves
so that objects stay plain dicts (cheap to project into our own slim records), every
failure maps onto ``devheal.kube.errors``, and watches are streamed line by line.
A token that lives in a file (in-cluster, or a kubeconfig's ``tokenFile``) is read
again when the file changes (``devheal.kube.tokens``): bound tokens rotate hourly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from devheal.kube import errors, tokens
from devheal.kube import kubeconfig as kubecfg

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

log = logging.getLogger(__name__)

Obj = dict[str, Any]
T = TypeVar("T")

LIST_TOO_LARGE_TRIES = 10
"""Tries of one list request the server answers 504 "Too large resource version" (its watch
cache is behind): each after the server's ``retryAfterSeconds`` (1 s), as client-go's ten."""

WATCH_IDLE_TIMEOUT = 50.0
"""Seconds a watch may send nothing at all before it is given up as stalled (a hung connection).

A watch asks for bookmarks, and the API server sends one about every minute, so even a
healthy watch on a quiet collection is renewed about every 50 s: one request from its
resourceVersion, served from the server's watch cache. In exchange a stalled watch is
noticed, and its collection caught up, within the minute.
"""


def api_path(
    api_version: str,
    plural: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """``/api/v1/namespaces/ns/pods/p/status`` from its parts; ``api_version`` is ``v1`` or ``group/v``."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name:
        parts.append(quote(name, safe=""))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list."""

    items: list[Obj]
    resource_version: str
    """The list's resourceVersion (one snapshot: the same on every page)."""


class KubeClient:
    """One connection pool to one API server. Create with ``connect``; close when done."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        host: str,
        *,
        authorization: str | None = None,
        token_file: tokens.TokenFile | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self._session = session
        self._host = host.rstrip("/")
        self._headers: dict[str, str] = {"Accept": JSON, "User-Agent": "devheal"}
        self._authorization = authorization
        self._server_hostname = server_hostname
        self.token_file = token_file
        """Where the bearer token comes from when it rotates (in-cluster, a kubeconfig's ``tokenFile``)."""

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, *, context: str | None = None, max_connections: int = 64
    ) -> KubeClient:
        """From ``kubeconfig`` (a path), else $KUBECONFIG, else ~/.kube/config, else in-cluster, as kubectl.

        ``context`` picks a kubeconfig context. Raises ``kubecfg.ConfigError`` (a
        ``PermanentError``) with a one-line message when the configuration cannot be used.
        Nothing is sent yet: an unreachable server shows at the first request (``Unavailable``).
        """
        connection = await kubecfg.resolve(kubeconfig, context)
        token_file = None
        if connection.token_file is not None:
            try:
                token_file = tokens.TokenFile(connection.token_file)
            except OSError as exc:
                raise kubecfg.ConfigError(connection.source, f"{exc}: check the token file") from exc
        ssl_context = connection.ssl_context()
        proxy, proxy_auth = env_proxy(connection.server)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=ssl_context),
            # The environment's proxy for the one server, read once: with trust_env aiohttp reads it (and ~/.netrc)
            # again in a thread for every request, two thread hops per request under a storm's thousands.
            proxy=proxy,
            proxy_auth=proxy_auth,
            read_bufsize=2**21,  # a watch event of a large object exceeds aiohttp's default buffer
        )
        return cls(
            session,
            connection.server,
            authorization=connection.authorization,
            token_file=token_file,
            server_hostname=connection.tls_server_name,
        )

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _auth_headers(self) -> dict[str, str]:
        if self.token_file is not None:
            return {"Authorization": self.token_file.authorization()}
        return {"Authorization": self._authorization} if self._authorization else {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = 30.0,
    ) -> Obj:
        """Send one request; return the decoded JSON answer or raise a ``KubeError``."""
        status, raw = await self._send(
            method, path, params=params, body=body, content_type=content_type, timeout=timeout
        )
        what = f"{method} {path}"
        try:
            decoded: Any = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"message": raw[:200].decode(errors="replace")}
        if not 200 <= status < 300:
            raise errors.from_status(status, decoded, what)
        if not isinstance(decoded, dict):
            raise errors.PermanentError(f"{what}: expected a JSON object, got {type(decoded).__name__}")
        return decoded

    async def get_text(self, path: str, *, timeout: float = 30.0) -> str:
        """GET a text answer (the API server's ``/metrics``); raises a ``KubeError`` as ``request`` does."""
        status, raw = await self._send("GET", path, timeout=timeout)
        text = raw.decode(errors="replace")
        if not 200 <= status < 300:
            raise errors.from_status(status, {"message": text[:200]}, f"GET {path}")
        return text

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """One request (sent once more when a rotated token was refused): the status and the raw answer."""
        url = self._host + path
        if params:
            url += "?" + urlencode({k: str(v) for k, v in params.items()})
        data = None
        if body is not None:
            data = json.dumps(body)
        what = f"{method} {path}"
        for attempt in range(2):
            headers = {**self._headers, **self._auth_headers()}
            if data is not None:
                headers["Content-Type"] = content_type
            try:
                async with self._session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                    server_hostname=self._server_hostname,
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise errors.Unavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
            if attempt or not self._token_refused(status):
                break
        return status, raw

    def _token_refused(self, status: int) -> bool:
        """A 401 with a token file that changed since it was read: the caller sends the request once more."""
        return status == 401 and self.token_file is not None and self.token_file.reload()

    async def get(self, path: str, **params: str | int) -> Obj:
        return await self.request("GET", path, params=params or None)

    async def list_pages(
        self, path: str, params: Mapping[str, str | int] | None = None, *, page_size: int = 500
    ) -> AsyncGenerator[Page, None]:
        """A collection page by page, following ``continue`` tokens, so a caller never holds all of it at once.

        The next page is asked for before a page is handed over: the server prepares it while the
        caller reads this one (a caller that awaits now and then lets the request go out), so at
        most two pages are held at once. Raises ``Gone`` when a continuation has expired (list
        again from the start).
        """
        query: dict[str, str | int] = {**(params or {}), "limit": page_size}
        pending = asyncio.ensure_future(self._list_page(path, query))
        try:
            while True:
                answer = await pending
                meta = answer.get("metadata") or {}
                token = str(meta.get("continue") or "")
                page = Page(answer.get("items") or [], str(meta.get("resourceVersion") or ""))
                del answer
                if token:
                    pending = asyncio.ensure_future(self._list_page(path, {**query, "continue": token}))
                yield page
                if not token:
                    return
        finally:
            # A page the caller no longer wants: its request ends with the caller, its error is not news.
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending

    async def _list_page(self, path: str, query: Mapping[str, str | int]) -> Obj:
        """One list request; sent again while the server's watch cache is behind (504, too large version)."""
        for attempt in range(LIST_TOO_LARGE_TRIES):
            try:
                return await self.request("GET", path, params=query, timeout=120.0)
            except errors.ResourceVersionTooLarge as exc:
                if attempt == LIST_TOO_LARGE_TRIES - 1:
                    raise
                log.info("%s; listing again in %.1fs", exc, exc.delay)
                await asyncio.sleep(exc.delay)
        raise AssertionError("unreachable")

    async def list_all(
        self, path: str, params: Mapping[str, str | int] | None = None, *, page_size: int = 500
    ) -> tuple[list[Obj], str]:
        """Every item of a collection, following ``continue`` tokens; returns (items, resourceVersion).

        Holds the whole collection: for a large one, project each page of ``list_pages`` instead.
        """
        items: list[Obj] = []
        version = ""
        async for page in self.list_pages(path, params, page_size=page_size):
            items.extend(page.items)
            version = page.resource_version
        return items, version

    async def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        idle_timeout: float = WATCH_IDLE_TIMEOUT,
        **params: str | int,
    ) -> AsyncIterator[Obj]:
        """Stream watch events ({type, object}) from ``resource_version``, bookmarks included.

        Ends when the server closes the watch (after ``timeout_seconds``); raises ``Gone``
        when the version has expired, so the caller lists again, and ``WatchStalled`` when
        nothing at all (no event, no bookmark) came for ``idle_timeout`` seconds.
        """
        query: dict[str, str | int] = {
            **params,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
        }
        url = self._host + path + "?" + urlencode({k: str(v) for k, v in query.items()})
        what = f"WATCH {path}"
        try:
            async with self._open_watch(url, idle_timeout) as resp:
                if resp.status != 200:
                    raw = await resp.read()
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = {}
                    raise errors.from_status(resp.status, body, what)
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise errors.from_status(int(status.get("code") or 500), status, what)
                    yield event
        except aiohttp.ServerTimeoutError as exc:
            raise errors.WatchStalled(
                f"{what}: nothing received for {idle_timeout:g}s (no event, no bookmark): the watch is stalled"
            ) from exc
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise errors.Unavailable(f"{what}: {type(exc).__name__}: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _open_watch(self, url: str, read_timeout: float) -> AsyncIterator[aiohttp.ClientResponse]:
        """The watch's response (sent once more after a 401 when the token file changed meanwhile)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
        for attempt in range(2):
            headers = {**self._headers, **self._auth_headers()}
            async with self._session.get(
                url, headers=headers, timeout=timeout, server_hostname=self._server_hostname
            ) as resp:
                if attempt == 0 and self._token_refused(resp.status):
                    continue
                yield resp
                return

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body=body)

    async def patch(self, path: str, body: Any, *, content_type: str = MERGE_PATCH) -> Obj:
        return await self.request("PATCH", path, body=body, content_type=content_type)

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        return await self.request("DELETE", path, body=body)

    async def apply(self, path: str, body: Obj, *, field_manager: str = "devheal", force: bool = True) -> Obj:
        """Server-side apply of a whole object."""
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self.request("PATCH", path, params=params, body=body, content_type="application/apply-patch+yaml")


def env_proxy(server: str) -> tuple[str | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for ``server`` (``HTTPS_PROXY``/``HTTP_PROXY``, not where ``NO_PROXY``
    matches, its credentials from the URL or ~/.netrc), as kubectl and client-go use it; (None, None) when none."""
    try:
        url, auth = get_env_proxy_for_url(URL(server))
    except LookupError:
        return None, None
    return str(url), auth


async def retrying(
    attempt: Callable[[], Awaitable[T]], *, tries: int = 5, base_delay: float = 0.1, max_delay: float = 5.0
) -> T:
    """Run ``await attempt()`` and retry temporary errors with exponential backoff."""
    delay = base_delay
    for n in range(tries):
        try:
            result: T = await attempt()
            return result
        except errors.TemporaryError as exc:
            if n == tries - 1:
                raise
            await asyncio.sleep(max(exc.delay, delay))
            delay = min(max_delay, delay * 2)
    raise AssertionError("unreachable")
