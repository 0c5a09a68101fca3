"""The lab's fault APIs answer a bad fault with its status and a one-line reason (``devheal.lab.fault_endpoint``),
over real HTTP on loopback."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from devheal.kube import errors
from devheal.lab.fault_endpoint import fault_endpoint


async def inject(node: str, body: dict[str, Any]) -> dict[str, Any]:
    if node != "gpu-node-000":
        raise KeyError(f"no simulated node {node!r}")
    if body.get("kind") == "refused":
        raise errors.Forbidden("nodes is forbidden")
    if body.get("gpu") == 9:
        raise IndexError("gpu 9 out of range (0-7)")
    if body.get("kind") != "xid":
        raise ValueError(f"unknown fault kind {body.get('kind')!r}")
    return {"node": node, "applied": body}


async def answers(path: str, data: str) -> tuple[int, dict[str, Any]]:
    app = web.Application()
    app.router.add_post("/v1/nodes/{node}/faults", fault_endpoint(inject))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.post(path, data=data, headers={"Content-Type": "application/json"})
        return response.status, await response.json()


async def test_a_fault_is_injected_and_its_result_returned() -> None:
    status, body = await answers("/v1/nodes/gpu-node-000/faults", '{"kind": "xid", "gpu": 0}')
    assert (status, body) == (200, {"node": "gpu-node-000", "applied": {"kind": "xid", "gpu": 0}})


async def test_a_body_that_is_not_a_json_object_is_a_bad_request() -> None:
    for data in ("not json", "[1, 2]", '"xid"'):
        assert await answers("/v1/nodes/gpu-node-000/faults", data) == (400, {"error": "body must be a JSON object"})


async def test_an_unknown_node_is_not_found_and_a_bad_value_a_bad_request_each_saying_why() -> None:
    assert await answers("/v1/nodes/nope/faults", '{"kind": "xid"}') == (404, {"error": "no simulated node 'nope'"})
    assert await answers("/v1/nodes/gpu-node-000/faults", '{"kind": "xid", "gpu": 9}') == (
        400,
        {"error": "gpu 9 out of range (0-7)"},
    )
    status, body = await answers("/v1/nodes/gpu-node-000/faults", '{"kind": "melt"}')
    assert (status, body) == (400, {"error": "unknown fault kind 'melt'"})


async def test_the_api_server_refusing_what_the_fault_writes_is_a_bad_gateway() -> None:
    status, body = await answers("/v1/nodes/gpu-node-000/faults", '{"kind": "refused"}')
    assert status == 502
    assert body["error"].startswith("API server refused the update: ")
