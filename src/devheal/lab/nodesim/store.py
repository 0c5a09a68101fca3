"""The simulated machines' state: each node's GPUs and the images on its disk.

Every role of the simulator reads and changes the same devices, so they live here, once.
Device state (health, XIDs, slowdowns, recovery actions: what faults changed) is saved to a JSON file, so it
survives a simulator restart and other tools (``devheal lab``, the simulated agent backend)
can read it; pulled images are not kept across a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devheal.lab import devices as devmod
from devheal.lab.devices import SimulatedNodeGpus
from devheal.lab.nodesim.nodes import node_name
from devheal.lab.nodesim.startup import NodeImages
from devheal.model.values import whole_number

log = logging.getLogger(__name__)

SAVE_DELAY_SECONDS = 0.05
"""Changes within this long are saved in one write."""


@dataclass
class NodeStore:
    state_file: Path
    nodes: dict[str, SimulatedNodeGpus] = field(default_factory=dict)
    node_index: dict[str, int] = field(default_factory=dict)
    images: dict[str, NodeImages] = field(default_factory=dict)  # node -> its images
    dra: set[str] = field(default_factory=set)
    """Nodes whose GPUs are the DRA driver's (the last ``dra_nodes`` of them)."""
    _save_pending: bool = False

    def load_or_create(self, count: int, gpus: int, model: str, dra_nodes: int = 0) -> None:
        saved: dict[str, Any] = {}
        if self.state_file.exists():
            try:
                saved = json.loads(self.state_file.read_text())
            except (OSError, ValueError):
                log.warning("ignoring unreadable device state %s", self.state_file)
        for i in range(count):
            name = node_name(i)
            self.node_index[name] = i
            nd = SimulatedNodeGpus.create(name, gpus, model)
            for dev_json in (saved.get("nodes", {}).get(name, {}) or {}).get("devices", []):
                idx = int(dev_json.get("index", -1))
                if 0 <= idx < len(nd.devices):
                    dev = nd.devices[idx]
                    dev.health = devmod.Health(dev_json.get("health", "Healthy"))
                    dev.reason = str(dev_json.get("reason", ""))
                    dev.slowdown = float(dev_json.get("slowdown", 1.0))
                    dev.xids = [
                        devmod.XidRecord(int(x["code"]), float(x["at"]), str(x["message"]))
                        for x in dev_json.get("xids", [])
                    ]
                    dev.recovery_action = whole_number(dev_json.get("recoveryAction"))
            self.nodes[name] = nd
            if i >= count - dra_nodes:
                self.dra.add(name)

    def index(self, node: str) -> int:
        """The node's number (``gpu-node-007`` is 7); 0 for a node this process does not serve."""
        return self.node_index.get(node, 0)

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        return {"updated": now, "nodes": {name: nd.to_json(now) for name, nd in self.nodes.items()}}

    def schedule_save(self) -> None:
        if self._save_pending:
            return
        self._save_pending = True
        asyncio.get_running_loop().call_later(SAVE_DELAY_SECONDS, self.save)

    def save(self) -> None:
        self._save_pending = False
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(self.state_file)
