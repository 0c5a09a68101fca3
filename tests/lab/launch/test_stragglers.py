"""A degraded GPU slows its rank; the launcher's published step times show it; the controller replaces the rank.

The whole path: ``faults.degrade`` slows the pod holding the GPU (the trainer reads the
simulator's device state), the rank's launcher publishes its step times on its pod
(``devheal.io/steps``), the controller's cache reads them, the round finds the rank a
``Straggler`` and, with ``stragglers.action: ReplaceAtCheckpoint``, restarts the gang in place
right after a checkpoint the ranks reported (``report_checkpoint``), replacing that rank, whose Job
recreates it, away from the node devheal tainted
``devheal.io/device-degraded:PreferNoSchedule``. And a hung gang (every training process
stopped) is found from the same reports, and the rank that stalled first replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import time

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab
from devheal.lab.slowdown import DEVICES_ENV, POD_ENV
from devheal.lab.workloads import get_path, gpu_job, pods_of, wait_until
from devheal.model.degradation_policy import DEGRADED_TAINT_KEY
from devheal.model.steps import STEPS_ANNOTATION, parse_step_report
from devheal.model.times import parse_time
from tests.lab.conftest import RecordingFaults
from tests.lab.controller.conftest import ControllerHarness

from .conftest import GangHarness

INDEX = "batch.kubernetes.io/job-completion-index"
CHECKPOINT_ENV = "TRAINER_CHECKPOINT_EVERY"
"""Steps between the checkpoints ``trainer.py`` reports (unset: none)."""


async def running_ranks(kube: KubeClient, namespace: str, app: str) -> dict[str, dict]:
    """The gang's running ranks, not being deleted, by their completion index."""
    pods = await pods_of(kube, namespace, f"app={app}")
    return {
        p["metadata"]["labels"][INDEX]: p
        for p in pods
        if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def published_windows(kube: KubeClient, namespace: str, app: str) -> list[int]:
    """How many steps each of the gang's pods' published step times cover (0: none published)."""
    pods = await pods_of(kube, namespace, f"app={app}")
    found = [parse_step_report(get_path(p, "metadata", "annotations", STEPS_ANNOTATION))[0] for p in pods]
    return [r.window if r is not None else 0 for r in found]


async def test_a_rank_on_a_degraded_gpu_is_found_slow_and_replaced(
    lab: Lab, kube: KubeClient, namespace: str, gang: GangHarness, faults: RecordingFaults
) -> None:
    await install_crds(kube)
    harness = ControllerHarness(lab, kube, namespace, gang.tmp)
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "node": {"taint": False},
                "stragglers": {"action": "ReplaceAtCheckpoint", "sustainedReports": 2},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), gpu_job("llm", ranks=4, indexed=True))

        ranks = functools.partial(running_ranks, kube, namespace, "llm")

        before = await wait_until(ranks, lambda r: len(r) == 4, timeout=60, what="4 running ranks")
        for rank, pod in before.items():
            name = pod["metadata"]["name"]
            env = {DEVICES_ENV: str(lab.devices_path), POD_ENV: f"{namespace}/{name}"}
            if rank == "0":  # rank 0 alone saves, every 10 s (200 steps of 50 ms), as a DDP job does
                env[CHECKPOINT_ENV] = "200"
            gang.launch(name, "--gang-label", "job-name", "--steps-publish-interval", "1", env=env)

        async def reports() -> dict[str, object]:
            pods = await pods_of(kube, namespace, "app=llm")
            return {
                p["metadata"]["name"]: parse_step_report(get_path(p, "metadata", "annotations", STEPS_ANNOTATION))[0]
                for p in pods
            }

        names = [p["metadata"]["name"] for p in before.values()]
        published = await wait_until(
            reports,
            lambda r: all(getattr(r.get(n), "window", 0) >= 10 for n in names),
            timeout=60,
            what="every rank's step times published",
        )
        healthy_p50 = max(getattr(published[n], "p50", 0.0) for n in names)
        assert 0.04 < healthy_p50 < 0.5, published
        harness.start()
        await asyncio.sleep(3)
        assert [r for r in await harness.remediations() if r["spec"]["finding"]["kind"] == "Straggler"] == []

        slow = before["2"]
        node, index = await asyncio.to_thread(faults.gpu_of, slow)
        await asyncio.to_thread(faults.degrade, node, index, 2.0)

        def restarts(rs: list[dict]) -> list[dict]:
            wanted = ("Straggler", "RestartGang")
            return [r for r in rs if (r["spec"]["finding"]["kind"], r["spec"]["action"]) == wanted]

        def taken(rs: list[dict]) -> list[dict]:
            return [r for r in restarts(rs) if (r.get("status") or {}).get("startedAt")]

        # Until the checkpoint the restart is recorded Blocked (NextCheckpoint); the record taken up is that one.
        records = await harness.wait_remediation(lambda rs: bool(taken(rs)), "a Straggler RestartGang", timeout=60)
        (record,) = restarts(records)
        assert record["spec"]["target"]["kind"] == "Gang", json.dumps(record)
        assert slow["metadata"]["name"] in record["spec"]["finding"]["evidence"]
        # Not at once: once rank 0 reported its first checkpoint after the rank was found (times in whole seconds;
        # at once, the restart would start 2-3 s after the finding, within 10 s of checkpoints).
        found = parse_time(record["spec"]["finding"]["since"])
        started = parse_time(record["status"]["startedAt"])
        assert found is not None and started is not None, record
        saved = [
            float(line.split()[1])
            for line in gang.launched[before["0"]["metadata"]["name"]].starts_file.read_text().splitlines()
            if line.startswith("checkpoint ")
        ]
        first = min((t for t in saved if t >= found - 1), default=None)
        assert first is not None and first - 1 <= started <= first + 10, (found, started, saved)
        if started - found >= 5:  # it waited rounds for the checkpoint: the wait was recorded, its Event stays
            events, _ = await kube.list_all(api_path("v1", "events", namespace=namespace))
            waits = [e for e in events if e.get("reason") == "DevhealBlocked" and "next checkpoint" in e["message"]]
            assert waits and slow["metadata"]["name"] in waits[0]["message"], [e.get("message") for e in events]
        after = await wait_until(
            ranks,
            lambda r: "2" in r and r["2"]["metadata"]["uid"] != slow["metadata"]["uid"],
            timeout=60,
            what="the slow rank replaced",
        )
        for rank in ("0", "1", "3"):
            assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
        # Its node is steered away from (PreferNoSchedule), so the replacement went elsewhere.
        taints = (await kube.get(api_path("v1", "nodes", name=node)))["spec"].get("taints") or []
        assert {"key": DEGRADED_TAINT_KEY, "value": "true", "effect": "PreferNoSchedule"} in taints, taints
        replacement = await wait_until(
            ranks, lambda r: bool(r.get("2", {}).get("spec", {}).get("nodeName")), timeout=30, what="placed"
        )
        assert replacement["2"]["spec"]["nodeName"] != node
    finally:
        gang.stop_all()
        await harness.cleanup()
        if "node" in locals():
            obj = await kube.get(api_path("v1", "nodes", name=node))
            taints = obj["spec"].get("taints") or []
            if any(t["key"] == DEGRADED_TAINT_KEY for t in taints):
                obj["spec"]["taints"] = [t for t in taints if t["key"] != DEGRADED_TAINT_KEY]
                await kube.replace(api_path("v1", "nodes", name=node), obj)


async def test_a_rank_steadily_slow_under_the_per_report_floor_is_found_by_its_average(
    lab: Lab, kube: KubeClient, namespace: str, gang: GangHarness, faults: RecordingFaults
) -> None:
    """stragglers.steady through the real API server and real launchers: the per-report floor out of reach (+50 %),
    rank 1's GPU 1.2x slow; only its average over steady.over (15 s here) finds it, no earlier than that after the
    controller first judged it, and no healthy rank is found."""
    await install_crds(kube)
    harness = ControllerHarness(lab, kube, namespace, gang.tmp)
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "node": {"taint": False},
                "stragglers": {
                    "action": "Notify",
                    "minSlowdownPercent": 50,
                    "steady": {"minSlowdownPercent": 5, "over": "15s"},
                },
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), gpu_job("gray", ranks=4, indexed=True))

        ranks = functools.partial(running_ranks, kube, namespace, "gray")

        before = await wait_until(ranks, lambda r: len(r) == 4, timeout=60, what="4 running ranks")
        for pod in before.values():
            name = pod["metadata"]["name"]
            env = {DEVICES_ENV: str(lab.devices_path), POD_ENV: f"{namespace}/{name}"}
            gang.launch(name, "--gang-label", "job-name", "--steps-publish-interval", "1", env=env)

        windows = functools.partial(published_windows, kube, namespace, "gray")

        await wait_until(windows, lambda w: len(w) == 4 and min(w) >= 10, timeout=60, what="step times published")
        slow = before["1"]
        node, index = await asyncio.to_thread(faults.gpu_of, slow)
        await asyncio.to_thread(faults.degrade, node, index, 1.2)
        started = time.time()  # the controller's clock: the same machine's
        harness.start()

        def stragglers(rs: list[dict]) -> list[dict]:
            return [r for r in rs if r["spec"]["finding"]["kind"] == "Straggler"]

        records = await harness.wait_remediation(lambda rs: bool(stragglers(rs)), "a Straggler", timeout=90)
        (record,) = stragglers(records)
        finding = record["spec"]["finding"]
        assert (record["spec"]["action"], record["spec"]["target"]["name"]) == ("Notify", slow["metadata"]["name"])
        assert "steadily slow" in finding["evidence"] and "over the last 15s" in finding["evidence"], finding
        found, created = parse_time(finding["since"]), parse_time(record["metadata"]["creationTimestamp"])
        assert found is not None and created is not None
        # Not before steady.over of judging (times in whole seconds), and recorded when found.
        assert found >= started + 15 - 1 and created - found <= 5, (started, finding, record["metadata"])
        await asyncio.sleep(3)  # the healthy ranks' averages stay near 1
        assert [r["spec"]["target"]["name"] for r in stragglers(await harness.remediations())] == [
            slow["metadata"]["name"]
        ]
    finally:
        gang.stop_all()
        await harness.cleanup()


async def test_a_hung_gang_is_found_within_seconds_and_the_rank_that_stalled_first_replaced(
    lab: Lab, kube: KubeClient, namespace: str, gang: GangHarness
) -> None:
    """Every rank's training process stops (SIGSTOP: a hung collective), rank 2's half a second before the
    others: its launcher's last published step is the oldest. Within stall.after the controller finds the gang
    stalled and restarts it in place, replacing rank 2; the others keep their pods."""
    await install_crds(kube)
    harness = ControllerHarness(lab, kube, namespace, gang.tmp)
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "stragglers": {"stall": {"after": "5s"}},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), gpu_job("hung", ranks=4, indexed=True))

        ranks = functools.partial(running_ranks, kube, namespace, "hung")

        before = await wait_until(ranks, lambda r: len(r) == 4, timeout=60, what="4 running ranks")
        launched = {
            rank: gang.launch(pod["metadata"]["name"], "--gang-label", "job-name", "--steps-publish-interval", "1")
            for rank, pod in before.items()
        }

        windows = functools.partial(published_windows, kube, namespace, "hung")

        await wait_until(windows, lambda w: len(w) == 4 and min(w) >= 10, timeout=60, what="step times published")
        harness.start()
        await asyncio.sleep(3)
        assert [r for r in await harness.remediations() if r["spec"]["finding"]["kind"] == "GangStalled"] == []

        def freeze(rank: str) -> None:
            os.kill(launched[rank].starts()[-1].pid, signal.SIGSTOP)

        freeze("2")
        await asyncio.sleep(0.5)
        for rank in ("0", "1", "3"):
            freeze(rank)

        record = await harness.stall_restart(timeout=60)
        assert record["spec"]["action"] == "RestartGang", json.dumps(record)
        first = f"{namespace}/{before['2']['metadata']['name']}"
        assert f"rank {first} stalled first" in record["spec"]["finding"]["evidence"], record["spec"]["finding"]
        after = await wait_until(
            ranks,
            lambda r: "2" in r and r["2"]["metadata"]["uid"] != before["2"]["metadata"]["uid"],
            timeout=60,
            what="the rank that stalled first replaced",
        )
        for rank in ("0", "1", "3"):
            assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
        steered = [
            r["spec"]["target"]["name"]
            for r in await harness.remediations()
            if r["spec"]["action"] == "TaintDegraded" and r["spec"]["finding"]["kind"] == "GangStalled"
        ]
        assert steered == [before["2"]["spec"]["nodeName"]], "its node steered away from, and no other"
    finally:
        for launched_pod in gang.launched.values():
            for start in launched_pod.starts():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(start.pid, signal.SIGCONT)
        gang.stop_all()
        await harness.cleanup()
