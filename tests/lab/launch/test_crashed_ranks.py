"""A real PyTorch gang (CPU, gloo) whose rank crashes restarts in place: its launchers hold the failed run.

Four ranks of ``devheal.lab.torch_training`` (DDP) run as the containers of an indexed Job's
pods (``devheal.lab.rank_processes``), each under ``devheal launch --hold-failed 60``. When
one rank's training process dies, its peers' all-reduce fails within milliseconds and every
training process exits; without the hold every pod would fail and the Job recreate them all
after its backoff. With it, each launcher publishes its failed run on its pod
(``devheal.io/launcher-failed``) and waits; the controller finds ``RankFailed`` on the rank
that failed first and restarts the gang in place:

- a rank killed (SIGKILL, code 137: not a device error): no rank is replaced, every rank
  starts again in the same pod;
- a rank exiting 79, one of the policy's ``deviceErrorExitCodes``: that rank's pod is
  replaced, the other three restart in place.

Either way the gang resumes from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.kube.crds import install_crds
from devheal.lab.cluster import Lab
from devheal.lab.rank_processes import RankProcesses, python
from devheal.lab.workloads import get_path, gpu_job, pods_of, wait_until
from tests.lab.controller.conftest import ControllerHarness

pytest.importorskip("torch", reason="the train extra (scripts/bootstrap installs it)")

RANKS = 4
INDEX = "batch.kubernetes.io/job-completion-index"


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def steps_by_rank(events: Path, pids: set[int] | None = None) -> dict[int, int]:
    steps: dict[int, int] = {}
    for e in read_events(events):
        if e["event"] == "step" and (pids is None or e["pid"] in pids):
            steps[e["rank"]] = max(steps.get(e["rank"], -1), e["step"])
    return steps


async def running_pods(kube: KubeClient, namespace: str) -> dict[int, dict[str, Any]]:
    return {
        int(p["metadata"]["labels"][INDEX]): p
        for p in await pods_of(kube, namespace, "job-name=llm")
        if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


async def crash_rank_1(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path, signum: int, policy: dict[str, Any]
) -> tuple[dict[str, Any], dict[int, dict[str, Any]], dict[int, dict[str, Any]], RankProcesses]:
    """Run the gang until it checkpointed, end rank 1's training process with ``signum``, and wait until every rank
    steps again in a new process. The RankFailed record, the running pods before and after, and the processes."""
    await install_crds(kube)
    harness = ControllerHarness(lab, kube, namespace, tmp_path)
    events = tmp_path / "events.jsonl"
    job = gpu_job("llm", ranks=RANKS, indexed=True)
    job["spec"]["backoffLimit"] = 10
    processes = RankProcesses(
        lab,
        kube,
        namespace,
        "llm",
        RANKS,
        command=lambda _index, _node: [
            python(),
            "-m",
            "devheal.lab.torch_training",
            "--shape",
            "ddp",
            "--checkpoint-dir",
            str(tmp_path / "checkpoints"),
            "--checkpoint-every",
            "10",
            "--events",
            str(events),
            "--device-error-exit-code",
            "79",
        ],
        launcher_args=(
            "--gang-label",
            "job-name",
            "--grace",
            "3",
            "--steps-publish-interval",
            "1",
            "--hold-failed",
            "60",
            "--device-error-exit-codes",
            "79",
        ),
        logs=tmp_path,
    )
    task: asyncio.Task[None] | None = None
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
                **policy,
            }
        )
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
        task = asyncio.ensure_future(processes.run())

        async def stepping() -> dict[int, int]:
            return steps_by_rank(events)

        await wait_until(
            stepping,
            lambda s: len(s) == RANKS and min(s.values()) >= 15,
            timeout=240,
            what="every rank past its first checkpoint",
            interval=0.5,
        )
        harness.start()
        await asyncio.sleep(3)  # the controller's cache is synced
        before = await running_pods(kube, namespace)
        assert sorted(before) == list(range(RANKS))
        training = max(e["pid"] for e in read_events(events) if e["event"] == "start" and e["rank"] == 1)
        os.kill(training, signum)
        crashed = time.time()
        crashed_at = max(steps_by_rank(events).values())

        def failed(rs: list[dict]) -> list[dict]:
            return [r for r in rs if r["spec"]["finding"]["kind"] == "RankFailed"]

        records = await harness.wait_remediation(lambda rs: bool(failed(rs)), "a RankFailed remediation", timeout=60)
        (record,) = failed(records)
        assert record["spec"]["action"] == "RestartGang", json.dumps(record)
        first = f"rank {namespace}/{before[1]['metadata']['name']} failed first"
        assert first in record["spec"]["finding"]["evidence"], record["spec"]["finding"]

        async def resumed() -> dict[int, int]:
            starts = {e["pid"] for e in read_events(events) if e["event"] == "start" and e["t"] > crashed}
            return steps_by_rank(events, starts)

        await wait_until(
            resumed,
            lambda s: len(s) == RANKS and min(s.values()) > crashed_at - 10,
            timeout=180,
            what="every rank stepping again in a new process",
            interval=0.5,
        )
        new_pids = {e["pid"] for e in read_events(events) if e["event"] == "start" and e["t"] > crashed}
        first_steps: dict[int, float] = {}
        for e in read_events(events):
            if e["event"] == "step" and e["pid"] in new_pids:
                first_steps.setdefault(e["rank"], e["t"])
        print(
            f"\nmeasured: every rank stepping again {max(first_steps.values()) - crashed:.1f}s after rank 1's "
            f"training process got signal {signum}; "
            f"record {record['metadata']['name']}: {record['spec']['finding']['evidence']}"
        )
        resumes = [e["step"] for e in read_events(events) if e["event"] == "resumed" and e["t"] > crashed]
        assert resumes and min(resumes) % 10 == 1 and min(resumes) > 1, resumes  # from a checkpoint
        return record, before, await running_pods(kube, namespace), processes
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await harness.cleanup()


async def test_a_killed_rank_restarts_the_whole_gang_in_place_in_the_same_pods(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    record, before, after, processes = await crash_rank_1(lab, kube, namespace, tmp_path, signal.SIGKILL, {})
    assert record["spec"]["finding"].get("podUID", "") == "", "no rank replaced"
    assert "code 137 is not a device error" in record["spec"]["finding"]["evidence"]
    for rank in range(RANKS):
        assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank}'s pod was recreated"
    assert processes.exits == [], "no launcher exited: every container kept running"


async def test_a_rank_exiting_with_a_device_error_code_is_replaced_the_others_restart_in_place(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    policy = {"deviceErrorExitCodes": [79]}
    record, before, after, processes = await crash_rank_1(lab, kube, namespace, tmp_path, signal.SIGUSR1, policy)
    assert record["spec"]["finding"]["podUID"] == before[1]["metadata"]["uid"], record["spec"]["finding"]
    assert after[1]["metadata"]["uid"] != before[1]["metadata"]["uid"], "rank 1's pod replaced"
    for rank in (0, 2, 3):
        assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank}'s pod was recreated"
    assert processes.exits == [], "no launcher exited by itself: rank 1's was stopped with its pod"
