"""`lab up` / `lab down` as processes: nothing left behind, clear errors when a start fails."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest

from devheal.lab import cluster
from devheal.lab.cluster import Lab, LabError, LabSpec, pid_alive, port_in_use


def test_up_then_down_leaves_no_process_and_no_listening_port() -> None:
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-lc-", dir="/tmp")))
    state = lab.up(LabSpec(nodes=1, gpus_per_node=2))
    try:
        status = lab.status()
        assert all(c["healthy"] for c in status["components"].values()), status
        with pytest.raises(LabError, match="already running"):
            lab.up(LabSpec(nodes=1))
    finally:
        stopped = lab.down()
    assert sorted(stopped) == sorted(cluster.COMPONENTS)
    assert not any(pid_alive(pid) for pid in state.pids.values())
    assert not any(port_in_use(port) for port in state.ports.values())
    assert lab.state() is None
    assert lab.down() == []


def test_a_taken_port_fails_up_with_the_components_log_and_stops_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    ports = iter([taken] + [cluster.free_port() for _ in range(10)])
    monkeypatch.setattr(cluster, "free_port", lambda: next(ports))
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-lc-", dir="/tmp")))
    try:
        with pytest.raises(LabError, match=r"etcd .*port it needs is taken") as info:
            lab.up(LabSpec(nodes=1), timeout=30)
        assert "address already in use" in str(info.value)
        assert lab.state() is None
    finally:
        blocker.close()
