"""A real PyTorch gang (CPU, gloo) under ``devheal launch``: a hung rank is named, replaced, and the gang resumes.

Four ranks of ``devheal.lab.torch_training`` (DDP, its all-reduces marked by a communication hook, each step
reported before the backward pass as docs/stragglers.md asks) run here as the containers of an indexed Job's pods
(``devheal.lab.rank_processes``). Rank 1's training process hangs in its next step's compute
(``devheal.lab.torch_training``'s SIGUSR2: its training thread blocks before that step's all-reduce): its
peers report the step it never finished and wait inside the all-reduce. The controller finds
the gang stalled, names rank 1, restarts the gang in place and replaces rank 1; every rank
steps again from the last checkpoint, the other three in their own pods.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from devheal.kube.client import KubeClient
from devheal.lab import network_cut
from devheal.lab.cluster import Lab
from devheal.lab.rank_processes import launcher_port
from devheal.model.steps import STEPS_ANNOTATION

from .torch_gang import CHECKPOINT_EVERY, one_rank_per_node, read_events, torch_gang

pytest.importorskip("torch", reason="the train extra (scripts/bootstrap installs it)")


async def test_a_hung_ddp_rank_is_named_replaced_and_the_gang_resumes_from_its_checkpoint(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    async with torch_gang(lab, kube, namespace, tmp_path, {"stragglers": {"stall": {"after": "8s"}}}) as gang:
        before = await gang.running_pods()
        # Each launcher publishes the collectives its run entered and left (the communication hook marks each
        # gradient bucket's all-reduce).
        published = [json.loads(p["metadata"]["annotations"][STEPS_ANNOTATION]) for p in before.values()]
        assert all(r.get("collectives", 0) > 0 and r.get("exits", 0) > 0 for r in published), published
        # It hangs in its next step's compute, before the all-reduce.
        stopped, stopped_at = gang.signal_rank(1, signal.SIGUSR2)

        record = await gang.harness.stall_restart(timeout=60)
        assert record["spec"]["finding"]["podUID"] == before[1]["metadata"]["uid"], json.dumps(record)
        await gang.wait_stepping(
            started_after=stopped,
            past=stopped_at,
            timeout=180,
            what="every rank stepping past the stall in a new process",
        )
        resumes = [step for step in gang.resumed_steps(stopped) if step > 0]
        assert resumes and min(resumes) % CHECKPOINT_EVERY == 1, resumes  # from a checkpoint, not from scratch
        now = await gang.running_pods()
        assert now[1]["metadata"]["uid"] != before[1]["metadata"]["uid"]
        for rank in (0, 2, 3):
            assert now[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"


async def test_a_ddp_rank_cut_off_from_its_peers_is_named_by_its_launchers_store_probes(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """Rank 1's node loses its network (``devheal.lab.network_cut``: what its user sends, and its launcher's probes,
    dropped; its launcher's API traffic passes, as a pod's control traffic would). Every rank then waits inside the
    all-reduce, so the step reports name nobody; rank 1's launcher fails to reach the rendezvous store, and the stall
    names it long before ``stall.after``: one restart in place replaces it, the other ranks keep their pods."""
    policy = {"stragglers": {"stall": {"after": "90s", "unreachableAfter": "8s"}}}
    async with torch_gang(lab, kube, namespace, tmp_path, policy, edit_job=one_rank_per_node, node_users=True) as gang:
        before = await gang.running_pods()
        uid = network_cut.node_user(before[1]["spec"]["nodeName"])
        training = max(e["pid"] for e in read_events(gang.events) if e["event"] == "start" and e["rank"] == 1)
        past = max(gang.steps_by_rank().values())
        cut_at = time.time()
        network_cut.cut(uid, allow_ports=(launcher_port(training),))
        try:
            record = await gang.harness.stall_restart(timeout=80)
            found = time.time() - cut_at
            finding = record["spec"]["finding"]
            assert finding["podUID"] == before[1]["metadata"]["uid"], json.dumps(record)
            assert "cannot reach its gang's rendezvous store" in finding["evidence"], finding["evidence"]
            assert found < 80, f"named {found:.0f}s after the cut, not before stall.after (90s)"
            await gang.wait_stepping(
                started_after=cut_at, past=past, timeout=180, what="every rank stepping past the cut in a new process"
            )
        finally:
            network_cut.restore(uid)
        now = await gang.running_pods()
        assert now[1]["metadata"]["uid"] != before[1]["metadata"]["uid"]
        for rank in (0, 2, 3):
            assert now[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank} was recreated"
