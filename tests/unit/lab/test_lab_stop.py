"""`Lab.down` on stand-in processes: dependency order, SIGKILL after the grace, recycled pids left alone."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devheal.lab import cluster
from devheal.lab.cluster import COMPONENTS, STOP_ORDER, Lab, LabError, LabSpec, LabState, pid_alive

COMPONENT = """
import pathlib, signal, sys, time
name, lab_dir, on_term = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
def log(event):
    with (lab_dir / "events").open("a") as events:
        events.write(f"{event} {name}\\n")
def term(*_):
    log("term")
    if on_term == "exit":
        time.sleep(0.05)
        log("exit")
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
(lab_dir / f"{name}.ready").touch()
while True:
    time.sleep(1)
"""
"""A component stand-in: its command line names the lab directory, as every real component's does;
on SIGTERM it logs "term NAME", then a moment later "exit NAME" and exits (with ``ignore``, it keeps running)."""


class StandIns:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, *, ignore_term: tuple[str, ...] = ()) -> LabState:
        for name in COMPONENTS:
            on_term = "ignore" if name in ignore_term else "exit"
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-c", COMPONENT, name, f"{self.lab.dir}/", on_term], start_new_session=True
            )
        deadline = time.monotonic() + 10
        while not all((self.lab.dir / f"{name}.ready").exists() for name in COMPONENTS):
            assert time.monotonic() < deadline, "stand-ins did not start"
            time.sleep(0.01)
        state = LabState(spec=LabSpec(nodes=1), ports={}, pids={n: p.pid for n, p in self.procs.items()})
        self.lab.state_path.write_text(state.to_json())
        return state

    def events(self) -> list[tuple[str, str]]:
        lines = (self.lab.dir / "events").read_text().splitlines()
        return [(event, name) for event, name in (line.split() for line in lines)]

    def terminated(self) -> list[str]:
        return [name for event, name in self.events() if event == "term"]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def stand_ins(tmp_path: Path) -> Iterator[StandIns]:
    # Stopped by a Lab that did not start them, as `devheal lab down` from another shell: it polls /proc.
    fakes = StandIns(Lab(tmp_path))
    try:
        yield fakes
    finally:
        fakes.close()


def test_down_stops_dependants_before_what_they_depend_on(stand_ins: StandIns) -> None:
    state = stand_ins.start()
    assert sorted(stand_ins.lab.down()) == sorted(COMPONENTS)
    events = stand_ins.events()
    assert sorted(stand_ins.terminated()) == sorted(COMPONENTS)
    # Each tier is signalled only after every earlier tier has exited.
    for i, tier in enumerate(STOP_ORDER[1:], start=1):
        earlier = {name for t in STOP_ORDER[:i] for name in t}
        last_exit = max(events.index(("exit", name)) for name in earlier)
        assert all(events.index(("term", name)) > last_exit for name in tier), events
    assert not [name for name, pid in state.pids.items() if pid_alive(pid)]
    assert stand_ins.lab.state() is None
    assert stand_ins.lab.down() == []


def test_a_component_that_ignores_sigterm_is_killed_before_the_next_tier_is_signalled(
    stand_ins: StandIns,
) -> None:
    state = stand_ins.start(ignore_term=("kube-apiserver",))
    started = time.monotonic()
    assert sorted(stand_ins.lab.down(grace=0.3)) == sorted(COMPONENTS)
    assert time.monotonic() - started < 5
    assert stand_ins.procs["kube-apiserver"].wait(timeout=1) == -signal.SIGKILL
    assert stand_ins.terminated()[-2:] == ["kube-apiserver", "etcd"]
    assert not [name for name, pid in state.pids.items() if pid_alive(pid)]


def test_down_skips_components_already_gone(stand_ins: StandIns) -> None:
    stand_ins.start()
    for name in ("etcd", "kwok"):
        stand_ins.procs[name].kill()
        stand_ins.procs[name].wait()
    assert sorted(stand_ins.lab.down()) == ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "nodesim"]
    assert stand_ins.lab.state() is None


def test_a_recycled_pid_is_left_alone(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        lab.state_path.write_text(LabState(spec=LabSpec(nodes=1), ports={}, pids={"etcd": stranger.pid}).to_json())
        assert lab.down() == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_process_that_outlives_sigkill_fails_down_naming_it(
    stand_ins: StandIns, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = stand_ins.start(ignore_term=("kube-apiserver",))
    monkeypatch.setattr(cluster, "KILL_WAIT", 0.3)
    real_signal = cluster._signal_group
    monkeypatch.setattr(cluster, "_signal_group", lambda pid, sig: sig == signal.SIGKILL or real_signal(pid, sig))
    with pytest.raises(LabError, match=rf"could not stop kube-apiserver \(pid {state.pids['kube-apiserver']}\)"):
        stand_ins.lab.down(grace=0.2)
    assert stand_ins.lab.state() is not None, "the state stays, so a second down can finish the job"
    monkeypatch.undo()
    assert stand_ins.lab.down(grace=0.2) == ["kube-apiserver"]
