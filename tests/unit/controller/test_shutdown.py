"""A controller told to stop stops within seconds, even while its API server is unreachable."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

from devheal.controller.loop import Controller, ControllerOptions
from devheal.kube.client import KubeClient


def _unreachable_kubeconfig(tmp_path: Path) -> Path:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return path


async def test_stop_while_the_api_server_is_unreachable(tmp_path: Path) -> None:
    client = await KubeClient.connect(str(_unreachable_kubeconfig(tmp_path)))
    try:
        stop = asyncio.Event()
        controller = Controller(client, ControllerOptions(leader_elect=True, retry_period=0.1))
        running = asyncio.create_task(controller.run(stop))
        await asyncio.sleep(0.5)  # the cache and the elector keep failing and retrying
        assert not running.done()
        began = time.monotonic()
        stop.set()
        await asyncio.wait_for(running, timeout=10)
        assert time.monotonic() - began < 5.0  # a pod's grace period is the budget
    finally:
        await client.close()
