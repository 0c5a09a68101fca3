"""A real PyTorch gang (CPU, gloo) with a rank on a node that goes down: the node's condition names the rank.

Four ranks of ``devheal.lab.torch_training`` (DDP) run as the containers of an indexed Job's pods
(``devheal.lab.rank_processes``), one rank per node. Rank 1's node goes down: its launcher and
training process stop (SIGSTOP: nothing of the rank runs or reports any more) and the node stops
heartbeating (``Faults.node_down``: kwok stops renewing its Lease and the node simulator leaves its
pods alone). The other ranks wait for it inside an all-reduce. The real controller manager's node
lifecycle marks the node ``Ready=Unknown`` 50 s after its last heartbeat and taints it unreachable.
The policy's stall limit is longer than that, so when the controller finds the gang stalled the
node is NotReady and ``devheal.engine.lost_nodes`` names rank 1 from it (the step reports of a
DDP rank stopped between steps do not always tell). The gang restarts in place, rank 1 only is
replaced, away from the unreachable node, and every rank steps again from the last checkpoint.

The Job replaces a terminating pod (``podReplacementPolicy: TerminatingOrFailed``, so no
``podFailurePolicy``): the evicted rank's pod stays terminating while its node is down, and a
Job that waits for it to fail would wait for the node (docs/gangs.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.workloads import wait_until
from tests.lab.conftest import RecordingFaults
from tests.lab.controller.conftest import stall_restarts

from .torch_gang import CHECKPOINT_EVERY, RANKS, one_rank_per_node, torch_gang

pytest.importorskip("torch", reason="the train extra (scripts/bootstrap installs it)")

STALL_AFTER = 75
"""Seconds: longer than the node's grace period (50 s from its last heartbeat, the fault's own write, as the
controller manager sees it within its 5 s node monitor period) and one more monitor period, with room to spare:
the node is NotReady when the stall is judged."""
UNREACHABLE = "node.kubernetes.io/unreachable"


def one_rank_per_node_replacing_terminating_pods(job: dict[str, Any]) -> None:
    spec = job["spec"]
    del spec["podFailurePolicy"]  # a Job with one only replaces a pod once it failed: a down node never says so
    spec["podReplacementPolicy"] = "TerminatingOrFailed"
    one_rank_per_node(job)


async def test_a_rank_on_a_node_gone_down_is_named_by_its_notready_condition_and_replaced(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path, faults: RecordingFaults
) -> None:
    policy = {"stragglers": {"stall": {"after": f"{STALL_AFTER}s"}}}
    async with torch_gang(
        lab, kube, namespace, tmp_path, policy, edit_job=one_rank_per_node_replacing_terminating_pods
    ) as gang:
        before = await gang.running_pods()
        assert sorted(before) == list(range(RANKS))
        node = before[1]["spec"]["nodeName"]
        assert [r for r in before if before[r]["spec"]["nodeName"] == node] == [1], "one rank per node"
        lost = f"{namespace}/{before[1]['metadata']['name']}"

        async def node_state() -> tuple[str, list[str]]:
            obj = await kube.get(api_path("v1", "nodes", name=node))
            ready = next(c["status"] for c in obj["status"]["conditions"] if c["type"] == "Ready")
            return ready, [f"{t['key']}:{t['effect']}" for t in obj["spec"].get("taints") or []]

        try:
            down, down_at, stopped = gang.freeze_rank(1)
            assert len(stopped) == 2, f"rank 1's launcher and training process stopped: {stopped}"
            await asyncio.to_thread(faults.node_down, node)

            # The controller manager's node lifecycle, after its grace period; the gang's stall limit is not up yet.
            await wait_until(
                node_state, lambda s: s[0] == "Unknown", timeout=120, what=f"{node} Ready=Unknown", interval=0.5
            )
            unknown = time.time() - down
            assert stall_restarts(await gang.harness.remediations()) == [], "judged before the node was NotReady"

            record = await gang.harness.stall_restart(timeout=120)
            remediated = time.time() - down
            finding = record["spec"]["finding"]
            assert finding["podUID"] == before[1]["metadata"]["uid"], json.dumps(record)
            assert "node-lifecycle" in finding["source"].split(","), finding
            assert f"rank {lost}'s node {node} is NotReady" in finding["evidence"], finding

            await gang.wait_stepping(
                started_after=down,
                past=down_at,
                timeout=180,
                what="every rank stepping past the stall in a new process",
            )
            stepping = gang.stepping_again_after(down)
            resumes = [step for step in gang.resumed_steps(down) if step > 0]
            assert resumes and min(resumes) % CHECKPOINT_EVERY == 1, resumes  # from a checkpoint, not from scratch
            after = await gang.running_pods()
            assert after[1]["metadata"]["uid"] != before[1]["metadata"]["uid"], "rank 1's pod replaced"
            assert after[1]["spec"]["nodeName"] != node, "its replacement runs elsewhere"
            for rank in (0, 2, 3):
                assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
            ready, taints = await node_state()
            assert ready == "Unknown" and f"{UNREACHABLE}:NoSchedule" in taints, (ready, taints)
            print(
                f"\nmeasured: {node} Ready=Unknown {unknown:.1f}s after it went down; the GangStalled remediation "
                f"{remediated:.1f}s after; every rank stepping again {stepping:.1f}s after; "
                f"record {record['metadata']['name']}: {finding['evidence']}"
            )
        finally:
            # The lab is shared: the node heartbeats again, Ready and untainted, before the next test.
            await asyncio.to_thread(faults.node_up, node)
            await wait_until(
                node_state,
                lambda s: s[0] == "True" and not any(t.startswith(UNREACHABLE) for t in s[1]),
                timeout=90,
                what=f"{node} Ready again and its unreachable taints gone",
                interval=0.5,
            )
