"""How much slower a lab pod's GPUs make its work: what ``faults.degrade`` does to the workload.

The node simulator saves every GPU's state, the pod holding it and its slowdown included, to
the lab's ``devices.json`` (``Lab.devices_path``). A lab workload standing in for a training
process (it runs on this machine, not in a container) asks ``PodSlowdown.factor()`` before
each step and stretches its own compute by that factor, as a throttled or degraded GPU
would: ``faults.degrade(node, gpu, 1.3)`` makes the steps of the pod holding that GPU take
1.3 times as long, and so the step times its launcher reports.

A workload finds the file and its pod in ``$DEVHEAL_LAB_DEVICES`` and ``$DEVHEAL_LAB_POD``
(``namespace/name``); without them the factor is 1. The file is read again only when it
changed; one that cannot be read (being replaced, not there yet) leaves the last factor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DEVICES_ENV = "DEVHEAL_LAB_DEVICES"
POD_ENV = "DEVHEAL_LAB_POD"


def pod_slowdown(state: Any, namespace: str, pod: str) -> float:
    """The largest slowdown among the GPUs ``namespace/pod`` holds in the simulator's saved state (1.0: none)."""
    factor = 1.0
    nodes = state.get("nodes") if isinstance(state, dict) else None
    for node in (nodes or {}).values():
        for dev in (node.get("devices") if isinstance(node, dict) else None) or []:
            holder = dev.get("holder") if isinstance(dev, dict) else None
            if not isinstance(holder, dict) or (holder.get("namespace"), holder.get("pod")) != (namespace, pod):
                continue
            slowdown = dev.get("slowdown")
            if isinstance(slowdown, int | float) and not isinstance(slowdown, bool) and 1.0 <= slowdown < 1000:
                factor = max(factor, float(slowdown))
    return factor


class PodSlowdown:
    """The current slowdown of one pod's GPUs, from the simulator's state file."""

    def __init__(self, path: Path | None, namespace: str, pod: str) -> None:
        self.path = path
        self.namespace = namespace
        self.pod = pod
        self._seen: tuple[int, int] | None = None
        self._factor = 1.0

    @classmethod
    def from_env(cls) -> PodSlowdown:
        path = os.environ.get(DEVICES_ENV, "")
        namespace, _, pod = os.environ.get(POD_ENV, "").partition("/")
        return cls(Path(path) if path and pod else None, namespace, pod)

    def factor(self) -> float:
        if self.path is None:
            return 1.0
        try:
            stat = self.path.stat()
            seen = (stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                self._factor = pod_slowdown(json.loads(self.path.read_text()), self.namespace, self.pod)
                self._seen = seen
        except (OSError, ValueError):
            pass  # being rewritten, or not there yet: keep the last factor
        return self._factor
