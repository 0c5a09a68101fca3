"""`lab up` / `lab down` as processes: nothing left behind, clear errors when a start fails."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest

from devheal.lab import cluster
from devheal.lab.cluster import Lab, LabError, LabSpec, LabState, pid_alive, port_in_use


def _new_lab() -> Lab:
    return Lab(Path(tempfile.mkdtemp(prefix="devheal-lc-", dir="/tmp")))


def _assert_all_gone(lab: Lab, state: LabState) -> None:
    assert not [c for c, pid in state.pids.items() if pid_alive(pid)], "processes left behind"
    assert not [name for name, port in state.ports.items() if port_in_use(port)], "ports still listening"
    assert lab.state() is None


def _wait_gone(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} survived SIGKILL"
        time.sleep(0.01)


def test_up_and_down_three_times_leaves_no_process_and_no_listening_port() -> None:
    lab = _new_lab()
    for cycle in range(3):
        state = lab.up(LabSpec(nodes=1, gpus_per_node=2))
        try:
            status = lab.status()
            assert all(c["healthy"] for c in status["components"].values()), (cycle, status)
            if cycle == 0:
                with pytest.raises(LabError, match="already running"):
                    lab.up(LabSpec(nodes=1))
        finally:
            # Odd cycles stop the lab as `devheal lab down` from another shell does: from a Lab
            # that did not start the processes, so it polls /proc instead of reaping them.
            stopped = (Lab(lab.dir) if cycle % 2 else lab).down()
        assert sorted(stopped) == sorted(cluster.COMPONENTS), cycle
        _assert_all_gone(lab, state)
        assert lab.down() == []


def test_down_succeeds_when_components_were_already_killed() -> None:
    lab = _new_lab()
    state = lab.up(LabSpec(nodes=1, gpus_per_node=2))
    try:
        # etcd gone under a running kube-apiserver: the API server must still stop.
        for component in ("etcd", "kube-scheduler"):
            os.killpg(state.pids[component], signal.SIGKILL)
            _wait_gone(state.pids[component])
    finally:
        # Without etcd the API server does not finish draining in 2 s: down must SIGKILL it and wait.
        stopped = Lab(lab.dir).down(grace=2.0)
    assert sorted(stopped) == ["kube-apiserver", "kube-controller-manager", "kwok", "nodesim"]
    _assert_all_gone(lab, state)
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
    lab = _new_lab()
    try:
        with pytest.raises(LabError, match=r"etcd .*port it needs is taken") as info:
            lab.up(LabSpec(nodes=1), timeout=30)
        assert "address already in use" in str(info.value)
        assert lab.state() is None
    finally:
        blocker.close()
