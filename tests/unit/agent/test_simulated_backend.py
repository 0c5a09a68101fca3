"""The simulated backend: lab device state -> NVML-shaped readings, and the feed that polls the lab."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest

from devheal.agent.classification import load_classification
from devheal.agent.health import DeviceHealthTracker
from devheal.agent.publisher import node_devices_path
from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent
from devheal.agent.simulated import LabDeviceFeed, SimulatedBackend, reading_from_simulated
from devheal.agent.telemetry import CLOCK_HW_SLOWDOWN, TelemetryUnavailable
from devheal.kube.client import KubeClient
from devheal.lab.devices import SimulatedNodeGpus
from devheal.model.cluster import DeviceHealth

from .fake_kube import FakeKube


def sim_device(index: int = 0, **changes: Any) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index:04d}",
        "model": "NVIDIA H100 80GB HBM3",
        "health": "Healthy",
        "reason": "",
        "slowdown": 1.0,
        "xids": [],
        "holder": None,
    }
    dev.update(changes)
    return dev


def unhealthy(code: int) -> dict[str, Any]:
    message = f"XID {code}: something"
    return sim_device(health="Unhealthy", reason=message, xids=[{"code": code, "at": 1.0, "message": message}])


def health_of(dev: dict[str, Any]) -> DeviceHealth:
    tracker = DeviceHealthTracker(dev["uuid"], load_classification())
    tracker.observe_reading(reading_from_simulated(dev), 1.0)
    return tracker.assess(1.0).health


def test_a_healthy_simulated_gpu_reads_like_a_healthy_real_one() -> None:
    r = reading_from_simulated(sim_device())
    assert not r.lost and not r.reset_required
    assert r.clock_event_reasons == 0 and r.pcie is not None and r.ecc is not None and r.remapped_rows is not None
    assert r.temperature_c is not None and r.power_w is not None
    assert health_of(sim_device()) is DeviceHealth.HEALTHY


@pytest.mark.parametrize(
    ("code", "check", "health"),
    [
        (79, lambda r: r.lost and r.ecc is None, DeviceHealth.UNHEALTHY),
        (48, lambda r: r.ecc.volatile_double_bit == 1 and r.ecc.aggregate_double_bit == 1, DeviceHealth.UNHEALTHY),
        (94, lambda r: r.ecc.volatile_double_bit == 1, DeviceHealth.UNHEALTHY),
        (63, lambda r: r.remapped_rows.pending, DeviceHealth.DEGRADED),
        (64, lambda r: r.remapped_rows.failure, DeviceHealth.UNHEALTHY),
        (119, lambda r: r.reset_required, DeviceHealth.UNHEALTHY),
    ],
)
def test_hardware_faults_map_to_the_reading_a_real_gpu_would_give(code: int, check: Any, health: DeviceHealth) -> None:
    dev = unhealthy(code)
    assert check(reading_from_simulated(dev))
    assert health_of(dev) is health


def test_application_xids_and_recovery_leave_no_trace_in_the_reading() -> None:
    recovered = sim_device(xids=[{"code": 79, "at": 1.0, "message": "XID 79"}, {"code": 13, "at": 2.0, "message": ""}])
    r = reading_from_simulated(recovered)
    assert not r.lost and r.ecc is not None and r.ecc.volatile_double_bit == 0


def test_slowdown_is_hw_slowdown() -> None:
    dev = sim_device(health="Degraded", reason="throttled", slowdown=1.3)
    r = reading_from_simulated(dev)
    assert r.clock_event_reasons == CLOCK_HW_SLOWDOWN
    assert health_of(dev) is DeviceHealth.DEGRADED


class FakeSimulator:
    """A stand-in for the node simulator's HTTP API."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {
            name: {"node": name, "devices": [sim_device(i) for i in range(2)]} for name in ("n0", "n1")
        }
        self.requests: list[str] = []
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                sim.requests.append(self.path)
                if self.path == "/v1/nodes":
                    self._send(200, {"updated": time.time(), "nodes": sim.nodes})
                elif self.path.startswith("/v1/nodes/") and self.path[10:] in sim.nodes:
                    self._send(200, sim.nodes[self.path[10:]])
                else:
                    self._send(404, {"error": f"no simulated node {self.path[10:]!r}"})

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def inject_xid(self, node: str, index: int, code: int) -> None:
        dev = self.nodes[node]["devices"][index]
        dev["xids"] = [*dev["xids"], {"code": code, "at": time.time(), "message": f"XID {code}: injected"}]
        if code not in (13, 31, 43, 45, 68):
            dev["health"], dev["reason"] = "Unhealthy", f"XID {code}: injected"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sim() -> Iterator[FakeSimulator]:
    server = FakeSimulator()
    try:
        yield server
    finally:
        server.close()


def test_one_node_polls_its_own_path_and_sees_only_new_xids(sim: FakeSimulator) -> None:
    sim.nodes["n0"]["devices"][1]["xids"] = [{"code": 48, "at": 1.0, "message": "old"}]
    feed = LabDeviceFeed(sim.url, interval=3600)
    backend = SimulatedBackend(feed, "n0")
    feed.poll_once()
    backend.start()
    try:
        assert [(d.index, d.uuid) for d in backend.inventory()] == [(0, "GPU-0000"), (1, "GPU-0001")]
        assert backend.sample(time.time()).events == (), "history from before the start is not replayed"
        woke = threading.Event()
        backend.set_wakeup(woke.set)
        sim.inject_xid("n0", 1, 79)
        sim.inject_xid("n0", 1, 13)
        feed.poll_once()
        assert woke.is_set()
        sample = backend.sample(time.time())
        assert [(e.uuid, e.code) for e in sample.events] == [("GPU-0001", 79), ("GPU-0001", 13)]
        assert sample.events[0].message == "XID 79: injected"
        assert sample.readings[1].lost
        feed.poll_once()
        assert backend.sample(time.time()).events == ()
        assert set(sim.requests) == {"/v1/nodes/n0"}
    finally:
        backend.close()
        feed.stop()


def test_many_nodes_share_one_request_per_poll(sim: FakeSimulator) -> None:
    feed = LabDeviceFeed(sim.url, interval=0.05)
    backends = [SimulatedBackend(feed, "n0"), SimulatedBackend(feed, "n1")]
    try:
        for b in backends:
            b.start()
        sim.inject_xid("n1", 0, 94)
        deadline = time.monotonic() + 2
        events: list[Any] = []
        while not events and time.monotonic() < deadline:
            events = list(backends[1].sample(time.time()).events)
            time.sleep(0.02)
        assert [(e.uuid, e.code) for e in events] == [("GPU-0000", 94)]
        assert backends[0].sample(time.time()).events == ()
        assert set(sim.requests) == {"/v1/nodes"}
    finally:
        feed.stop()


def test_unknown_node_and_unreachable_lab_are_telemetry_unavailable(sim: FakeSimulator) -> None:
    feed = LabDeviceFeed(sim.url, interval=3600)
    with pytest.raises(TelemetryUnavailable, match="no simulated node 'nope'") as info:
        SimulatedBackend(feed, "nope").start()
    assert info.value.reason == "LabUnreachable" or info.value.reason == "LabNodeUnknown"
    feed.stop()
    sim.close()
    dead = LabDeviceFeed(sim.url, interval=3600, timeout=0.5)
    with pytest.raises(TelemetryUnavailable, match="cannot reach the lab's node simulator"):
        SimulatedBackend(dead, "n0").start()
    dead.stop()


def test_stale_state_is_unavailable(sim: FakeSimulator) -> None:
    feed = LabDeviceFeed(sim.url, interval=3600)
    backend = SimulatedBackend(feed, "n0", stale_after=0.05)
    feed.poll_once()
    backend.start()
    time.sleep(0.1)
    with pytest.raises(TelemetryUnavailable, match="no fresh device state"):
        backend.sample(time.time())
    feed.stop()


def test_bad_control_url() -> None:
    with pytest.raises(ValueError, match="must be http://host:port"):
        LabDeviceFeed("localhost:1234")


def test_with_the_state_file_the_feed_reads_only_after_a_change(sim: FakeSimulator, tmp_path: Path) -> None:
    state = tmp_path / "devices.json"
    feed = LabDeviceFeed(sim.url, interval=0.02, state_file=state, refresh_every=3600)
    backend = SimulatedBackend(feed, "n0")
    try:
        backend.start()
        time.sleep(0.2)
        assert len(sim.requests) == 1, "no change, no request"
        sim.inject_xid("n0", 0, 79)
        state.write_text("{}")  # the simulator rewrites its state file on every change
        deadline = time.monotonic() + 2
        events: list[Any] = []
        while not events and time.monotonic() < deadline:
            events = list(backend.sample(time.time()).events)
            time.sleep(0.01)
        assert [e.code for e in events] == [79]
        # The write may be seen as one change or two (truncate, then write): one or two reads,
        # the second possibly after the event was seen; let both happen before counting.
        time.sleep(0.2)
        reads = len(sim.requests)
        assert reads in (2, 3)
        time.sleep(0.2)
        assert len(sim.requests) == reads, "no further change, no further request"
    finally:
        feed.stop()


def _write_node_state(path: Path, gpus: SimulatedNodeGpus) -> None:
    """As a real lab node's device plugin writes its gpus.json: a new file replaces the old."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(gpus.to_json(time.time())))
    partial.replace(path)


def test_without_a_url_the_feed_reads_one_nodes_state_file(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    gpus = SimulatedNodeGpus.create("real-0", 2, "NVIDIA H100 80GB HBM3")
    _write_node_state(state, gpus)
    feed = LabDeviceFeed(None, interval=0.02, state_file=state)
    backend = SimulatedBackend(feed, "real-0")
    try:
        backend.start()
        assert [d.index for d in backend.inventory()] == [0, 1]
        gpus.inject_xid(1, 79, time.time())
        _write_node_state(state, gpus)
        deadline = time.monotonic() + 2
        events: list[Any] = []
        while not events and time.monotonic() < deadline:
            events = list(backend.sample(time.time()).events)
            time.sleep(0.01)
        assert [(e.uuid, e.code) for e in events] == [(gpus.devices[1].uuid, 79)]
        assert backend.sample(time.time()).readings[1].lost
    finally:
        feed.stop()


def test_a_state_file_of_another_node_or_none_is_telemetry_unavailable(tmp_path: Path) -> None:
    state = tmp_path / "gpus.json"
    _write_node_state(state, SimulatedNodeGpus.create("real-0", 1, "NVIDIA H100 80GB HBM3"))
    feed = LabDeviceFeed(None, interval=3600, state_file=state)
    with pytest.raises(TelemetryUnavailable, match="holds the GPUs of node 'real-0', not 'real-1'"):
        SimulatedBackend(feed, "real-1").start()
    feed.stop()
    missing = LabDeviceFeed(None, interval=3600, state_file=tmp_path / "none.json")
    with pytest.raises(TelemetryUnavailable, match="cannot read the lab node's GPU state"):
        SimulatedBackend(missing, "real-0").start()
    missing.stop()
    with pytest.raises(ValueError, match="needs a control URL or a node's state file"):
        LabDeviceFeed(None)


# ---- NVML's recovery action, as the lab sets it -----------------------------------------------------------------


def lab_gpus() -> SimulatedNodeGpus:
    return SimulatedNodeGpus.create("n0", 2, "NVIDIA H100 80GB HBM3")


def test_the_recovery_action_the_lab_sets_is_what_nvml_would_report() -> None:
    gpus = lab_gpus()
    assert reading_from_simulated(gpus.to_json(1.0)["devices"][0]).recovery_action is None, "not set: not reported"
    gpus.inject_xid(0, 119, 1.0)
    gpus.set_recovery_action(0, "GPUReset")
    r = reading_from_simulated(gpus.to_json(1.0)["devices"][0])
    assert r.reset_required and r.recovery_action == 1, "a GPU that requires a reset still says what it needs"
    gpus.set_recovery_action(0, "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT")
    assert reading_from_simulated(gpus.to_json(1.0)["devices"][0]).recovery_action == 2
    gpus.recover(0)
    assert reading_from_simulated(gpus.to_json(1.0)["devices"][0]).recovery_action == 0, "NONE after the reset"


def test_a_lost_simulated_gpu_reports_no_recovery_action() -> None:
    gpus = lab_gpus()
    gpus.inject_xid(1, 79, 1.0)
    gpus.set_recovery_action(1, 2)
    r = reading_from_simulated(gpus.to_json(1.0)["devices"][1])
    assert r.lost and r.recovery_action is None


async def test_the_agent_publishes_the_recovery_action_the_lab_set(sim: FakeSimulator, tmp_path: Path) -> None:
    gpus = lab_gpus()
    sim.nodes["n0"] = gpus.to_json(1.0)
    feed = LabDeviceFeed(sim.url, interval=3600)
    kube = FakeKube()
    options = AgentOptions(node="n0", pod_resources_socket=tmp_path / "missing.sock", poll_interval=0.2)
    agent = NodeAgent(cast(KubeClient, kube), SimulatedBackend(feed, "n0"), options, ClassificationSource(None))
    try:
        feed.poll_once()
        await agent.step(100.0)
        devices = kube.objects[node_devices_path("n0")]["status"]["devices"]
        assert all("recoveryAction" not in d for d in devices)
        gpus.inject_xid(1, 48, 101.0)
        gpus.set_recovery_action(1, "DrainAndReset")
        sim.nodes["n0"] = gpus.to_json(101.0)
        woke = threading.Event()
        agent.backend.set_wakeup(woke.set)
        feed.poll_once()
        assert woke.is_set(), "a changed action wakes the agent"
        await agent.step(101.0)
        devices = kube.objects[node_devices_path("n0")]["status"]["devices"]
        assert devices[1]["recoveryAction"] == {"action": "DrainAndReset", "value": 4}
        assert devices[1]["health"] == "Unhealthy"
    finally:
        agent.backend.close()
        feed.stop()
        await agent.pods.close()
