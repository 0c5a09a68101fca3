"""``python -m devheal.lab.gpuplugin``: the simulated GPUs of one real lab node, as a device plugin.

A real node's kubelet learns its ``nvidia.com/gpu`` devices from this process over kubelet's own
device plugin API (devheal.kubelet.deviceplugin): it registers on the node's ``kubelet.sock``,
advertises the node's simulated GPUs (devheal.lab.devices: the same UUIDs and models as a
simulated node's) and reports each one's health in ``ListAndWatch``. The lab's fault injection
reaches it on a loopback HTTP port with the node simulator's fault API
(``POST /v1/nodes/<node>/faults``): an XID that breaks a GPU makes it Unhealthy in
``ListAndWatch``, so the real kubelet drops it from allocatable and reports it in the status of
the pod holding it; ``recover`` makes it Healthy again. Allocation is kubelet's: the plugin
keeps no holders. A device plugin restart is a real one: the lab stops this process and starts
another (``Lab.stop_device_plugin``/``start_device_plugin``), so the GPUs' health is saved to
``--state-file`` on every change and read back at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from devheal.kubelet.deviceplugin import DevicePluginServer, PluginDevice
from devheal.lab import devices as devmod
from devheal.lab.devices import SimulatedNodeGpus
from devheal.lab.fault_endpoint import fault_endpoint
from devheal.model.cluster import GPU_RESOURCE
from devheal.model.values import whole_number

log = logging.getLogger("devheal.lab.gpuplugin")

ENDPOINT = "devheal-gpu.sock"
"""The plugin's socket in kubelet's device-plugin directory."""

FAULT_KINDS = ("xid", "recover", "recovery-action")
"""What this plugin can be told; the other faults of the node simulator do not reach real nodes yet."""


def load_health(gpus: SimulatedNodeGpus, state_file: Path) -> None:
    """Take the GPUs' health from ``state_file`` (what an earlier plugin process of this node saved)."""
    try:
        saved = json.loads(state_file.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable GPU state %s: %s", state_file, exc)
        return
    for dev_json in saved.get("devices", []) if isinstance(saved, dict) else []:
        index = int(dev_json.get("index", -1))
        if 0 <= index < len(gpus.devices):
            dev = gpus.devices[index]
            dev.health = devmod.Health(dev_json.get("health", "Healthy"))
            dev.reason = str(dev_json.get("reason", ""))
            dev.xids = [
                devmod.XidRecord(int(x["code"]), float(x["at"]), str(x["message"])) for x in dev_json.get("xids", [])
            ]
            dev.recovery_action = whole_number(dev_json.get("recoveryAction"))


class GpuPlugin:
    def __init__(self, gpus: SimulatedNodeGpus, plugin_dir: Path, state_file: Path) -> None:
        self.gpus = gpus
        self.state_file = state_file
        load_health(gpus, state_file)
        self.save()  # from the start: the node's agent pod reads its GPUs from this file (devheal.lab.install)
        self.server = DevicePluginServer(plugin_dir, GPU_RESOURCE, ENDPOINT, self.advertised())

    def save(self) -> None:
        partial = self.state_file.with_suffix(".partial")
        partial.write_text(json.dumps(self.snapshot()))
        partial.replace(self.state_file)

    def advertised(self) -> list[PluginDevice]:
        # kubelet knows Healthy and Unhealthy: a degraded GPU still serves (devices.kubelet_health).
        return [PluginDevice(dev.uuid, dev.allocatable) for dev in self.gpus.devices]

    async def inject(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        if node != self.gpus.node:
            raise KeyError(f"this device plugin serves node {self.gpus.node}, not {node!r}")
        kind = body.get("kind")
        if kind not in FAULT_KINDS:
            supported = ", ".join(FAULT_KINDS)
            raise ValueError(f"fault kind {kind!r} is not supported on a real node (supported: {supported})")
        gpu = body.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool):
            raise ValueError(f"gpu must be a GPU index (0..{len(self.gpus.devices) - 1}), got {gpu!r}")
        if kind == "xid":
            code = body.get("code")
            if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
                raise ValueError(f"code must be a positive XID number, got {code!r}")
            changed = self.gpus.inject_xid(gpu, code, time.time())
        elif kind == "recovery-action":
            # The agent reads it; kubelet's view (the plugin's devices) does not change.
            if self.gpus.set_recovery_action(gpu, body.get("action")):
                self.save()
            return self.snapshot()
        else:
            changed = self.gpus.recover(gpu)
        if changed:
            self.save()
            await self.server.set_devices(self.advertised())
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        return self.gpus.to_json(time.time())

    def http_app(self) -> web.Application:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            serving = self.server.socket.exists()
            return web.json_response({"ok": serving}, status=200 if serving else 503)

        async def get_node(request: web.Request) -> web.Response:
            if request.match_info["node"] != self.gpus.node:
                return web.json_response({"error": f"no real node {request.match_info['node']!r} here"}, status=404)
            return web.json_response(self.snapshot())

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/v1/nodes/{node}", get_node)
        app.router.add_post("/v1/nodes/{node}/faults", fault_endpoint(self.inject))
        return app


async def _main(args: argparse.Namespace) -> None:
    gpus = SimulatedNodeGpus.create(args.node, args.gpus, args.gpu_model)
    plugin = GpuPlugin(gpus, Path(args.plugin_dir), Path(args.state_file))
    runner = web.AppRunner(plugin.http_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.http_port).start()
    log.info("serving %d GPUs of %s on %s", args.gpus, args.node, plugin.server.socket)
    try:
        await plugin.server.serve_forever()
    finally:
        await plugin.server.stop()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devheal.lab.gpuplugin",
        description="devheal lab: a real node's simulated GPUs as a device plugin",
    )
    parser.add_argument("--node", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu-model", default="NVIDIA H100 80GB HBM3")
    parser.add_argument("--plugin-dir", required=True, help="kubelet's device-plugin directory (kubelet.sock is in it)")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--state-file", required=True, help="where the GPUs' health is kept across restarts")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
