"""``devheal report``, run as a process against the in-memory API server: the loss-by-cause table of the
Remediations that ended within the window, by namespace, as a table or JSON; a record whose ``status.badput``
cannot be read is left out with one line naming it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from devheal.controller.records import REMEDIATIONS
from devheal.model.badput import remediation_badput
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")

HOUR = 3600.0


@pytest_asyncio.fixture(loop_scope="function")
async def api() -> AsyncIterator[MemApi]:
    async with MemApi() as server:
        yield server


async def devheal(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_SERVICE"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devheal",
        *args,
        env={**env, "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def record(
    api: MemApi, name: str, namespace: str, finding: str, badput: dict[str, Any] | None, kind: str = "Pod"
) -> None:
    api.create(
        REMEDIATIONS,
        {
            "apiVersion": "devheal.io/v1alpha1",
            "kind": "Remediation",
            "metadata": {"name": name},
            "spec": {
                "action": "Deschedule" if kind == "Pod" else "RestartGang",
                "target": {"kind": kind, "namespace": namespace, "name": name},
                "finding": {"kind": finding},
            },
        },
    )
    status: dict[str, Any] = {"phase": "Succeeded"}
    if badput is not None:
        status["badput"] = badput
    api.patch(f"{REMEDIATIONS}/{name}/status", {"status": status})


def lost(cause: str, gpus: int, awaiting_s: float, restart_s: float, ago_s: float = 60.0) -> dict[str, Any]:
    until = time.time() - ago_s
    badput = remediation_badput(cause, gpus, until - awaiting_s - restart_s, until - restart_s, until)
    assert badput is not None
    return badput.to_status()


def cluster(api: MemApi) -> None:
    record(api, "a", "training", "DeviceFailed", lost("faulty-gpu", 64, 0.5 * HOUR, 0.25 * HOUR))
    record(api, "b", "training", "GangStalled", lost("network", 64, 2 * HOUR, 0.25 * HOUR), kind="Gang")
    record(api, "c", "serving", "DeviceFailed", lost("faulty-gpu", 8, 0.0, HOUR))
    record(api, "old", "training", "DeviceFailed", lost("gpu-hbm3", 64, HOUR, HOUR, ago_s=2 * 86400))
    record(api, "before-badput", "training", "DeviceFailed", None)  # an older record: nothing booked


async def test_the_report_sums_the_windows_records_by_cause_and_namespace(api: MemApi, tmp_path: Path) -> None:
    cluster(api)
    kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
    code, out, err = await devheal("report", "--kubeconfig", kubeconfig, "--since", "24h", "-o", "json")
    assert (code, err) == (0, "")
    body = json.loads(out)
    assert body["records"] == 3
    assert body["gpuHours"] == pytest.approx(48 + 144 + 8, abs=0.01)
    by = body["byNamespace"]
    assert list(by) == ["serving", "training", "all namespaces"]
    assert by["training"]["network"] == {
        "awaiting-remediation": pytest.approx(128, abs=0.01),
        "restart": pytest.approx(16, abs=0.01),
    }
    assert by["all namespaces"]["faulty-gpu"]["restart"] == pytest.approx(16 + 8, abs=0.01)
    assert "gpu-hbm3" not in by["all namespaces"]  # ended two days ago

    code, out, err = await devheal("report", "--kubeconfig", kubeconfig, "--no-color")
    assert (code, err) == (0, "")
    assert "GPU-hours lost by cause" in out
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["network"] == ["GangStalled", "0", "144 (128)", "144 (128)"]
    assert rows["faulty-gpu"] == ["DeviceFailed", "8.0", "48 (32)", "56 (32)"]
    assert out.rstrip().endswith("3 remediations, 200.00 GPU-hours lost")


async def test_the_report_of_one_namespace_and_a_shorter_window(api: MemApi, tmp_path: Path) -> None:
    cluster(api)
    kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
    code, out, _ = await devheal("report", "--kubeconfig", kubeconfig, "-n", "serving", "--since", "168h", "-o", "json")
    assert code == 0
    body = json.loads(out)
    assert body["namespace"] == "serving"
    assert body["byNamespace"] == {"serving": {"faulty-gpu": {"restart": pytest.approx(8, abs=0.01)}}}
    code, out, _ = await devheal("report", "--kubeconfig", kubeconfig, "--since", "30s", "--no-color")
    assert code == 0 and out.startswith("no workload lost GPU time from ")


async def test_a_record_whose_badput_cannot_be_read_is_left_out_with_its_name(api: MemApi, tmp_path: Path) -> None:
    record(api, "fine", "training", "DeviceFailed", lost("faulty-gpu", 8, 0.0, HOUR))
    record(api, "odd", "training", "DeviceFailed", {**lost("faulty-gpu", 8, 0.0, HOUR), "losses": {"coffee": 1.0}})
    kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
    code, out, err = await devheal("report", "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 0 and json.loads(out)["records"] == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("devheal report: remediation odd: status.badput.losses: expected GPU-hours")
    assert line.endswith("(left out)")


async def test_an_unreachable_cluster_is_one_line(tmp_path: Path) -> None:
    async with MemApi() as server:
        kubeconfig = str(server.kubeconfig(tmp_path / "kubeconfig"))
    code, _, err = await devheal("report", "--kubeconfig", kubeconfig)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("devheal report: cannot reach the Kubernetes API server")
