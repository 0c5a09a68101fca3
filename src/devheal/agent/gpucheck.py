"""``python -m devheal.agent.gpucheck``: try the agent on a real GPU machine, without Kubernetes.

Prints the NVML inventory, then each device's readings and health as the agent's
classification sees them, then runs the agent's per-node work (sample, classify, build
the NodeDevices status, update the metrics; the pod-resources API too when the
kubelet's socket is there) for ``--seconds`` at ``--poll-interval`` and reports what it
cost: CPU seconds and percent of one core, resident memory. ``scripts/gpu-check`` sets up
a virtual environment and runs this. Without a GPU or driver it says so and exits 2. With
``--fail-unless-healthy`` it exits 3 when a GPU is not Healthy at the end: a post-repair
validation pod (a policy's ``node.validation``, docs/policy.md) can run it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import psutil
from prometheus_client import CollectorRegistry

from devheal.agent.classification import ClassificationError, load_classification
from devheal.agent.health import DeviceHealthTracker
from devheal.agent.metrics import AgentMetrics
from devheal.agent.nvml import NvmlBackend
from devheal.agent.status import Availability, build_status
from devheal.agent.telemetry import CLOCK_REASON_NAMES, DeviceReading, TelemetryUnavailable
from devheal.model.cluster import DeviceHealth
from devheal.model.recovery_action import RecoveryActionReading

KUBELET_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
NO_GPU_EXIT = 2
NOT_HEALTHY_EXIT = 3
"""``--fail-unless-healthy``: a GPU is not Healthy at the end of the check."""


def _recovery(r: DeviceReading) -> str:
    if r.recovery_action is None:
        return "recovery action: not reported"
    return f"recovery action: {RecoveryActionReading(r.recovery_action).describe()}"


def _describe_reading(r: DeviceReading) -> str:
    if r.lost:
        return "LOST (NVML_ERROR_GPU_IS_LOST)"
    if r.reset_required:
        return f"RESET REQUIRED (NVML_ERROR_RESET_REQUIRED), {_recovery(r)}"
    parts = [_recovery(r)]
    if r.temperature_c is not None:
        parts.append(f"{r.temperature_c:.0f} C")
    if r.power_w is not None:
        parts.append(f"{r.power_w:.0f} W")
    if r.clock_event_reasons is not None:
        active = [name for bit, name in CLOCK_REASON_NAMES.items() if r.clock_event_reasons & bit]
        parts.append("clocks: " + (",".join(active) or "no event"))
    if r.pcie is not None:
        parts.append(f"PCIe gen{r.pcie.generation}/{r.pcie.max_generation} x{r.pcie.width}/{r.pcie.max_width}")
        if r.pcie.replays is not None:
            parts.append(f"replays {r.pcie.replays}")
    if r.ecc is not None:
        parts.append(f"ECC vol sbe/dbe {r.ecc.volatile_single_bit}/{r.ecc.volatile_double_bit}")
        parts.append(f"agg {r.ecc.aggregate_single_bit}/{r.ecc.aggregate_double_bit}")
    if r.remapped_rows is not None:
        rows = r.remapped_rows
        parts.append(
            f"remapped rows corr/unc {rows.correctable}/{rows.uncorrectable}"
            + (" PENDING" if rows.pending else "")
            + (" FAILURE" if rows.failure else "")
        )
    if r.retired_pages is not None:
        pages = r.retired_pages
        parts.append(
            f"retired pages sbe/dbe {pages.single_bit}/{pages.double_bit}" + (" PENDING" if pages.pending else "")
        )
    if r.nvlink is not None:
        parts.append(f"NVLink errors {r.nvlink.total}")
    if r.errors:
        parts.append("errors: " + "; ".join(r.errors))
    return ", ".join(parts)


async def _measure(
    backend: NvmlBackend,
    trackers: dict[str, DeviceHealthTracker],
    seconds: float,
    poll: float,
    socket: Path | None,
) -> dict[str, Any]:
    """Run the agent's per-node round (everything but the API writes) for ``seconds``; return its cost."""
    proc = psutil.Process()
    inventory = backend.inventory()
    metrics = AgentMetrics(CollectorRegistry())
    pods = None
    if socket is not None:
        try:
            from devheal.agent.podmap import PodMap
        except ImportError as exc:  # the generated gRPC bindings are missing
            print(f"gpu-check: not reading pod-resources: {exc}", file=sys.stderr)
        else:
            pods = PodMap(socket)
    telemetry = Availability(True, "Sampling", "nvml")
    no_pods = Availability(False, "NotChecked", "no pod-resources socket")
    conditions: list[dict[str, Any]] = []
    xids: list[dict[str, Any]] = []
    rounds = 0
    round_seconds: list[float] = []
    cpu0 = proc.cpu_times()
    wall0 = time.monotonic()
    rss_peak = proc.memory_info().rss
    deadline = wall0 + seconds
    next_round = wall0
    try:
        while time.monotonic() < deadline:
            started = time.monotonic()
            now = time.time()
            sample = await asyncio.to_thread(backend.sample, now)
            for event in sample.events:
                xids.append({"uuid": event.uuid, "code": event.code, "at": event.at})
                if event.uuid in trackers:
                    trackers[event.uuid].observe_xids([event])
            readings = {r.uuid: r for r in sample.readings}
            for uuid, tracker in trackers.items():
                if uuid in readings:
                    tracker.observe_reading(readings[uuid], now)
            assessments = {uuid: t.assess(now) for uuid, t in trackers.items()}
            if pods is not None:
                await pods.refresh(now)
            holders, resources = pods.snapshot() if pods is not None else ({}, {})
            status = build_status(
                inventory,
                assessments,
                holders,
                resources,
                telemetry,
                pods.availability if pods is not None else no_pods,
                conditions,
                now,
                recovery_actions={u: r.recovery_action for u, r in readings.items() if r.recovery_action is not None},
            )
            conditions = status["conditions"]
            for info in inventory:
                a = assessments[info.uuid]
                t = trackers[info.uuid]
                metrics.observe("gpucheck", info, readings.get(info.uuid), a.health, t.xid_counts, t.incidents_opened)
            rounds += 1
            round_seconds.append(time.monotonic() - started)
            rss_peak = max(rss_peak, proc.memory_info().rss)
            next_round += poll
            await asyncio.sleep(max(0.0, next_round - time.monotonic()))
    finally:
        if pods is not None:
            await pods.close()
    cpu1 = proc.cpu_times()
    wall = time.monotonic() - wall0
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "seconds": round(wall, 2),
        "rounds": rounds,
        "poll_interval": poll,
        "cpu_seconds": round(cpu, 3),
        "cpu_percent_of_one_core": round(100.0 * cpu / wall, 3) if wall else 0.0,
        "rss_mib": round(proc.memory_info().rss / 2**20, 1),
        "rss_peak_mib": round(rss_peak / 2**20, 1),
        "round_ms_median": round(1000 * sorted(round_seconds)[len(round_seconds) // 2], 2) if round_seconds else 0.0,
        "round_ms_max": round(1000 * max(round_seconds), 2) if round_seconds else 0.0,
        "pod_resources": pods.availability.message if pods is not None else "not checked (no socket)",
        "xids_seen": xids,
    }


def run(args: argparse.Namespace, nvml: Any = None, out: TextIO = sys.stdout) -> int:
    try:
        table = load_classification(args.classification)
    except ClassificationError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 1
    backend = NvmlBackend(nvml)
    try:
        backend.start()
    except TelemetryUnavailable as exc:
        print(
            f"gpu-check: no usable NVIDIA GPU on {platform.node()}: {exc}\n"
            "gpu-check: run this on a machine with an NVIDIA GPU and driver (nvidia-smi should work).",
            file=sys.stderr,
        )
        return NO_GPU_EXIT
    report: dict[str, Any] = {"host": platform.node(), "python": platform.python_version()}
    try:
        inventory = backend.inventory()
        report["driver"] = backend.driver_version()
        print(f"NVML: driver {report['driver']}, {len(inventory)} GPU(s) on {report['host']}", file=out)
        for info in inventory:
            print(f"  GPU {info.index}: {info.uuid}  {info.model}  PCI {info.pci_bus_id}", file=out)
        report["inventory"] = [_info(info) for info in inventory]
        trackers = {info.uuid: DeviceHealthTracker(info.uuid, table) for info in inventory}
        now = time.time()
        sample = backend.sample(now)
        for reading in sample.readings:
            if reading.uuid in trackers:
                trackers[reading.uuid].observe_reading(reading, now)
        print(
            "\nHealth (default classification" + (f" + {args.classification}" if args.classification else "") + "):",
            file=out,
        )
        report["devices"] = []
        health = {}
        for info, reading in zip(inventory, sample.readings, strict=True):
            assessment = trackers[info.uuid].assess(now)
            health[info.index] = assessment.health
            print(f"  GPU {info.index}: {assessment.health.value:<9} {_describe_reading(reading)}", file=out)
            for reason in assessment.reasons:
                if reason.health is not DeviceHealth.HEALTHY:
                    print(f"      {reason.health.value}: {reason.message}", file=out)
            report["devices"].append(
                {
                    "index": info.index,
                    "uuid": info.uuid,
                    "health": assessment.health.value,
                    "remedy": assessment.remedy.value,
                    "reasons": [r.message for r in assessment.reasons],
                    "reading": _describe_reading(reading),
                    "recoveryAction": None
                    if reading.recovery_action is None
                    else RecoveryActionReading(reading.recovery_action).to_status(),
                }
            )
        if args.seconds > 0:
            socket = args.pod_resources_socket if args.pod_resources_socket.exists() else None
            print(
                f"\nMeasuring the agent's overhead for {args.seconds:g}s at a {args.poll_interval:g}s poll"
                + (f" (with pod-resources at {socket})" if socket else "")
                + " ...",
                file=out,
                flush=True,
            )
            cost = asyncio.run(_measure(backend, trackers, args.seconds, args.poll_interval, socket))
            report["overhead"] = cost
            print(
                f"  {cost['rounds']} rounds in {cost['seconds']}s: CPU {cost['cpu_seconds']}s = "
                f"{cost['cpu_percent_of_one_core']}% of one core; RSS {cost['rss_mib']} MiB "
                f"(peak {cost['rss_peak_mib']}); round median {cost['round_ms_median']} ms, "
                f"max {cost['round_ms_max']} ms",
                file=out,
            )
            if cost["xids_seen"]:
                print(f"  XIDs during the run: {[x['code'] for x in cost['xids_seen']]}", file=out)
            end = time.time()
            print("\nHealth after the run:", file=out)
            for info in inventory:
                a = trackers[info.uuid].assess(end)
                health[info.index] = a.health
                print(f"  GPU {info.index}: {a.health.value}" + (f" ({a.worst.message})" if a.worst else ""), file=out)
    finally:
        backend.close()
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}", file=out)
    failing = [f"GPU {index}: {state.value}" for index, state in health.items() if state is not DeviceHealth.HEALTHY]
    if args.fail_unless_healthy and failing:
        print(f"gpu-check: not every GPU is Healthy ({'; '.join(failing)})", file=sys.stderr)
        return NOT_HEALTHY_EXIT
    return 0


def _info(info: Any) -> dict[str, Any]:
    return {"index": info.index, "uuid": info.uuid, "model": info.model, "pci_bus_id": info.pci_bus_id}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to measure the overhead (0: skip)")
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--classification", type=Path, default=None, help="classification override file")
    parser.add_argument("--pod-resources-socket", type=Path, default=KUBELET_SOCKET)
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    parser.add_argument(
        "--fail-unless-healthy",
        action="store_true",
        help=f"exit {NOT_HEALTHY_EXIT} when a GPU is not Healthy at the end (a post-repair validation pod)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
