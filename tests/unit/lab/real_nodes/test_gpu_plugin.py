"""A real node's GPU plugin: faults change what it advertises, bad faults are refused by name, and its
GPUs' health outlives the process (a device plugin restart is a new process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devheal.lab.devices import SimulatedNodeGpus
from devheal.lab.gpuplugin import GpuPlugin


def _plugin(tmp_path: Path) -> GpuPlugin:
    return GpuPlugin(SimulatedNodeGpus.create("gpu-node-001", 2, "H100"), tmp_path, tmp_path / "gpus.json")


async def test_a_hardware_xid_makes_the_gpu_unhealthy_in_what_the_plugin_advertises(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path)
    result = await plugin.inject("gpu-node-001", {"kind": "xid", "gpu": 1, "code": 79})
    assert result["allocatable"] == 1
    assert [d.healthy for d in plugin.server.devices] == [True, False]
    await plugin.inject("gpu-node-001", {"kind": "recover", "gpu": 1})
    assert [d.healthy for d in plugin.server.devices] == [True, True]


async def test_an_application_xid_is_counted_but_the_gpu_stays_healthy(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path)
    result = await plugin.inject("gpu-node-001", {"kind": "xid", "gpu": 0, "code": 13})
    assert result["devices"][0]["xids"][0]["code"] == 13
    assert all(d.healthy for d in plugin.server.devices)


async def test_the_next_plugin_process_starts_with_the_health_the_last_one_saved(tmp_path: Path) -> None:
    await _plugin(tmp_path).inject("gpu-node-001", {"kind": "xid", "gpu": 0, "code": 48})
    again = _plugin(tmp_path)
    assert [d.healthy for d in again.server.devices] == [False, True]
    assert again.snapshot()["devices"][0]["reason"].startswith("XID 48")


def test_the_plugin_writes_its_gpus_state_when_it_starts(tmp_path: Path) -> None:
    # The node's agent pod reads this file (devheal.lab.install), before any fault too.
    _plugin(tmp_path)
    saved = json.loads((tmp_path / "gpus.json").read_text())
    assert saved["node"] == "gpu-node-001" and [d["health"] for d in saved["devices"]] == ["Healthy", "Healthy"]


@pytest.mark.parametrize(
    ("node", "body", "error", "message"),
    [
        ("gpu-node-009", {"kind": "xid", "gpu": 0, "code": 79}, KeyError, "serves node gpu-node-001"),
        ("gpu-node-001", {"kind": "degrade", "gpu": 0}, ValueError, "not supported on a real node"),
        ("gpu-node-001", {"kind": "xid", "gpu": "0", "code": 79}, ValueError, "gpu must be a GPU index"),
        ("gpu-node-001", {"kind": "xid", "gpu": 0, "code": 0}, ValueError, "positive XID"),
        ("gpu-node-001", {"kind": "xid", "gpu": 5, "code": 79}, IndexError, "no GPU index 5"),
    ],
)
async def test_bad_faults_are_refused_saying_what_was_wrong(
    tmp_path: Path, node: str, body: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await _plugin(tmp_path).inject(node, body)
