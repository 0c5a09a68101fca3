"""The launcher's loopback HTTP endpoint: the child POSTs step times, anyone in the pod GETs the figures.

``POST /steps`` with ``{"duration_seconds": float, "step": int | null}`` records a step
(204), with ``{"joined": true}`` that the run reached its gang's rendezvous (204), with ``{"checkpoint": true}``
that it saved a checkpoint (204), with
``{"collectives": int}`` how many collectives the run entered so far (204), with
``"exits": int, "inside_seconds": float | null`` also how many it left and how long it has been inside the one it
is in now (null: outside every collective; ``devheal.launch.collective``);
``GET /steps`` returns the aggregate as JSON. Bound to a loopback address only:
step reports never leave the pod and never reach the API server.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from devheal.launch.reporting import STEPS_PATH
from devheal.launch.steps import InvalidStep, StepStats

MAX_BODY_BYTES = 4096


def parse_steps_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6) with a loopback host; raises ValueError saying what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:0), got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"the port must be a number within 0..65535, got {port_text!r}")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            raise ValueError(f"the host must be a loopback IP address or localhost, got {host!r}") from None
        if not loopback:
            raise ValueError(f"step reports stay inside the pod: the host must be loopback, got {host!r}")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StepsServer:
    """Serves ``stats`` on ``host:port``; ``extra`` adds launcher facts (generation, restarts) to ``GET /steps``."""

    def __init__(
        self,
        stats: StepStats,
        host: str,
        port: int,
        *,
        extra: Callable[[], dict[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self.host = host
        self.port = port
        self.extra = extra or dict
        self.clock = clock
        self._runner: web.AppRunner | None = None
        self.address = ""
        """``host:port`` actually bound (the real port when 0 was asked for); set by ``start``."""

    async def start(self) -> str:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(STEPS_PATH, self._post)
        app.router.add_get(STEPS_PATH, self._get)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        bound = self.port
        for sockname in self._runner.addresses:
            bound = int(sockname[1])
            break
        self.address = format_address(self.host, bound)
        return self.address

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _post(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="expected a JSON object {duration_seconds, step}\n")
        if not isinstance(body, dict):
            return web.Response(status=400, text="expected a JSON object {duration_seconds, step}\n")
        if body.get("joined") is True and "duration_seconds" not in body:
            self.stats.joined(self.clock())
            return web.Response(status=204)
        if body.get("checkpoint") is True and "duration_seconds" not in body:
            self.stats.checkpointed(self.clock())
            return web.Response(status=204)
        if "collectives" in body and "duration_seconds" not in body:
            try:
                if "exits" in body:
                    self.stats.collective_marks(
                        body["collectives"], body["exits"], body.get("inside_seconds"), self.clock()
                    )
                else:
                    self.stats.entered_collectives(body["collectives"])
            except InvalidStep as exc:
                return web.Response(status=400, text=f"{exc}\n")
            return web.Response(status=204)
        try:
            self.stats.record(body.get("duration_seconds"), body.get("step"), self.clock())  # type: ignore[arg-type]
        except InvalidStep as exc:
            return web.Response(status=400, text=f"{exc}\n")
        return web.Response(status=204)

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response({**self.stats.snapshot(self.clock()), **self.extra()})
