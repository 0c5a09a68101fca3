"""A real PyTorch gang (CPU, gloo) under ``devheal launch``: a hung rank is named, replaced, and the gang resumes.

Four ranks of ``devheal.lab.torch_training`` (DDP, one all-reduce per step, reported before the
backward pass as docs/stragglers.md asks) run here as the containers of an indexed Job's pods
(``devheal.lab.rank_processes``). Rank 1's training process hangs in its next step's compute
(``devheal.lab.torch_training``'s SIGUSR2: it stops itself before that step's all-reduce): its
peers report the step it never finished and wait in the all-reduce. The controller finds
the gang stalled, names rank 1, restarts the gang in place and replaces rank 1; every rank
steps again from the last checkpoint, the other three in their own pods.
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
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


async def test_a_hung_ddp_rank_is_named_replaced_and_the_gang_resumes_from_its_checkpoint(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    await install_crds(kube)
    harness = ControllerHarness(lab, kube, namespace, tmp_path)
    events = tmp_path / "events.jsonl"
    checkpoints = tmp_path / "checkpoints"
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
            str(checkpoints),
            "--checkpoint-every",
            "10",
            "--events",
            str(events),
        ],
        launcher_args=("--gang-label", "job-name", "--grace", "3", "--steps-publish-interval", "1"),
        logs=tmp_path,
    )
    task: asyncio.Task[None] | None = None
    try:
        await harness.policy(
            {
                "selector": {"namespaces": [namespace]},
                "actions": {"gang": "RestartGang"},
                "stragglers": {"stall": {"after": "8s"}},
                "budgets": {"workloadDisruptionInterval": "0s", "circuitBreaker": {"maxFaultyNodesPercent": 100}},
            }
        )
        await kube.create(api_path("batch/v1", "jobs", namespace=namespace), job)
        task = asyncio.ensure_future(processes.run())

        def steps_by_rank(pids: set[int] | None = None) -> dict[int, int]:
            steps: dict[int, int] = {}
            for e in read_events(events) if events.exists() else []:
                if e["event"] == "step" and (pids is None or e["pid"] in pids):
                    steps[e["rank"]] = max(steps.get(e["rank"], -1), e["step"])
            return steps

        async def stepping() -> dict[int, int]:
            return steps_by_rank()

        await wait_until(
            stepping,
            lambda s: len(s) == RANKS and min(s.values()) >= 15,
            timeout=240,
            what="every rank past its first checkpoint",
            interval=0.5,
        )
        harness.start()
        await asyncio.sleep(4)  # a few publications of this run's step times
        before = {
            int(p["metadata"]["labels"][INDEX]): p
            for p in await pods_of(kube, namespace, "job-name=llm")
            if get_path(p, "status", "phase") == "Running"
        }
        victim = processes.rank(1)
        assert victim is not None
        training = max(e["pid"] for e in read_events(events) if e["event"] == "start" and e["rank"] == 1)
        os.kill(training, signal.SIGUSR2)  # it hangs in its next step's compute, before the all-reduce
        stopped = time.time()
        stopped_at = max(steps_by_rank().values())

        def stalls(rs: list[dict]) -> list[dict]:
            # The restart (its node's suspect taint, decided first from the same finding, is a record of its own).
            return [
                r for r in rs if r["spec"]["finding"]["kind"] == "GangStalled" and r["spec"]["action"] == "RestartGang"
            ]

        records = await harness.wait_remediation(lambda rs: bool(stalls(rs)), "a GangStalled remediation", timeout=60)
        (record,) = stalls(records)
        assert record["spec"]["action"] == "RestartGang", json.dumps(record)
        assert record["spec"]["finding"]["podUID"] == before[1]["metadata"]["uid"], record["spec"]["finding"]

        async def resumed() -> dict[int, int]:
            return steps_by_rank({e["pid"] for e in read_events(events) if e["event"] == "start" and e["t"] > stopped})

        after = await wait_until(
            resumed,
            lambda s: len(s) == RANKS and min(s.values()) > stopped_at,
            timeout=180,
            what="every rank stepping past the stall in a new process",
            interval=0.5,
        )
        assert min(after.values()) > stopped_at
        resumes = [e["step"] for e in read_events(events) if e["event"] == "resumed" and e["step"] > 0]
        assert resumes and min(resumes) % 10 == 1, resumes  # from a checkpoint, not from scratch
        now = {
            int(p["metadata"]["labels"][INDEX]): p
            for p in await pods_of(kube, namespace, "job-name=llm")
            if get_path(p, "status", "phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }
        assert now[1]["metadata"]["uid"] != before[1]["metadata"]["uid"]
        for rank in (0, 2, 3):
            assert now[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
    finally:
        for e in read_events(events) if events.exists() else []:
            if e["event"] == "start":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(e["pid"], signal.SIGCONT)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await harness.cleanup()
