"""On a real API server: `devheal crds apply` installs what the controller checks for at start, and the
controller then runs, logging one JSON object a line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from devheal.kube.client import KubeClient
from devheal.kube.crds import CRD_NAMES, check_installed
from devheal.lab.cluster import Lab


async def test_crds_apply_then_the_controller_starts_and_logs_json(lab: Lab, kube: KubeClient) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_SERVICE"))}
    kubeconfig = str(lab.kubeconfig)
    apply = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devheal", "crds", "apply", "--kubeconfig", kubeconfig, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(apply.communicate(), timeout=120)
    assert apply.returncode == 0, err.decode()
    assert out.decode().splitlines() == [f"customresourcedefinition {name} applied and served" for name in CRD_NAMES]
    await check_installed(kube)  # discovery now lists every resource

    controller = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devheal", "controller", "--kubeconfig", kubeconfig, "--no-leader-elect",
        "--dry-run", "--log-format", "json", env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert controller.stderr is not None
    try:
        first = await asyncio.wait_for(controller.stderr.readline(), timeout=60)
        entry = json.loads(first)
        assert entry["logger"].startswith("devheal.") and entry["time"].endswith("Z"), entry
    finally:
        if controller.returncode is None:
            controller.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(controller.stderr.read(), timeout=60)
        await controller.wait()
    for line in rest.decode().splitlines():
        json.loads(line)  # every line, to the end, is one JSON object
    assert controller.returncode == 0
