"""The metrics port's HTTP server: ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` (liveness: the kubelet restarts a container that fails it) answers 200 while
the process's loops are not stuck, e.g. the decision loop went round recently
(``Heartbeat``). ``/readyz`` answers 200 while the process can do its job: caches synced,
no supervised loop down. Each is a list of named checks, functions that return None when
all is well or a line saying what is wrong; the body lists them the way the API server's
``?verbose`` probes do (``[+]cache ok``, ``[-]loops failed: ...``) and a failing probe
answers 503. ``/metrics`` is Prometheus' text format of a registry, rendered in a thread.

The server runs in the process's event loop (aiohttp), so a blocked event loop does not
answer its probes either: just what a liveness probe should find out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from devheal.kube.supervision import Supervisor

log = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""None when all is well, else a line saying what is wrong."""


class Heartbeat:
    """When a loop last went round (on the event loop's clock); stale after ``max_age`` seconds."""

    def __init__(self, name: str, max_age: float) -> None:
        self.name = name
        self.max_age = max_age
        self.last: float | None = None

    def beat(self) -> None:
        self.last = asyncio.get_running_loop().time()

    def check(self) -> str | None:
        """Stale after ``max_age``; a loop that has not gone round yet is not stuck (readiness says so)."""
        if self.last is None:
            return None
        age = asyncio.get_running_loop().time() - self.last
        if age > self.max_age:
            return f"{self.name} last went round {age:.0f}s ago (more than {self.max_age:g}s): stuck"
        return None

    def started(self) -> str | None:
        """A readiness check: the loop has gone round at least once."""
        return None if self.last is not None else f"{self.name} has not gone round yet"


class FailureStreak:
    """Failures in a row of something that is retried (a decision round): a readiness check fails from
    ``limit`` of them on, and passes again at the first success."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.count = 0
        self.last_error = ""

    def failed(self, error: str) -> None:
        self.count += 1
        self.last_error = error

    def succeeded(self) -> None:
        self.count = 0
        self.last_error = ""

    def check(self) -> str | None:
        if self.count < self.limit:
            return None
        return f"{self.name} failed {self.count} times in a row; last: {self.last_error[:300]}"


def loops_check(loops: Supervisor) -> Check:
    """A readiness check: no loop of ``loops`` is down."""

    def check() -> str | None:
        problems = loops.problems()
        return "; ".join(problems) if problems else None

    return check


class ProbeServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on ``address:port`` (port 0: any free one, see ``port``)."""

    def __init__(self, port: int, address: str = "0.0.0.0", *, registry: CollectorRegistry = REGISTRY) -> None:
        self.address = address
        self.port = port
        self.registry = registry
        self.health: dict[str, Check] = {}
        self.ready: dict[str, Check] = {}
        self._runner: web.AppRunner | None = None

    def add_health(self, name: str, check: Check) -> None:
        self.health[name] = check

    def add_ready(self, name: str, check: Check) -> None:
        self.ready[name] = check

    async def start(self) -> ProbeServer:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/livez", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self.address, self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ProbeServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _metrics(self, _: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._probe(request.path.strip("/"), self.health)

    async def _readyz(self, request: web.Request) -> web.Response:
        return self._probe("readyz", self.ready)

    @staticmethod
    def _probe(what: str, checks: dict[str, Check]) -> web.Response:
        lines = []
        failed = False
        for name, check in checks.items():
            try:
                problem = check()
            except Exception as exc:
                problem = f"the check raised {type(exc).__name__}: {exc}"
            if problem is None:
                lines.append(f"[+]{name} ok")
            else:
                failed = True
                lines.append(f"[-]{name} failed: {problem}")
        lines.append(f"{what} check {'failed' if failed else 'passed'}")
        return web.Response(text="\n".join(lines) + "\n", status=503 if failed else 200)
