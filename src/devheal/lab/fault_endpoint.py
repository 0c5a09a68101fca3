"""``POST /v1/nodes/{node}/faults``, as both of the lab's fault APIs answer it: the simulated nodes'
(``devheal.lab.nodesim.faultapi``) and a real node's simulated GPUs (``devheal.lab.gpuplugin``).

A JSON object in, what the fault did out; a body that is no JSON object or a bad value: 400; a node or
device not there: 404; the API server refusing what the fault writes: 502."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from devheal.kube import errors

Inject = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Injects the fault a request's body describes into the named node: what it did; raises ``KeyError`` naming
what is not there, ``ValueError`` or ``IndexError`` for a bad value."""


def fault_endpoint(inject: Inject) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The request handler that hands each fault to ``inject``."""

    async def post_fault(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        try:
            return web.json_response(await inject(request.match_info["node"], body))
        except KeyError as exc:
            return web.json_response({"error": str(exc.args[0])}, status=404)
        except (ValueError, IndexError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except errors.KubeError as exc:
            return web.json_response({"error": f"API server refused the update: {exc}"}, status=502)

    return post_fault
