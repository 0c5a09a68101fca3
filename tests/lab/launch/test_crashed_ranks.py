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

Either way the gang resumes from its last checkpoint. So it does when a person deletes a rank's pod (what an
on-call engineer does to a rank on a bad GPU nothing flagged): the Job recreates that pod, the peers' runs fail
on the lost rank and are held, and the gang restarts in place around the new pod.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.rank_processes import RankProcesses

from .torch_gang import CHECKPOINT_EVERY, RANKS, torch_gang

pytest.importorskip("torch", reason="the train extra (scripts/bootstrap installs it)")

HOLD = ("--hold-failed", "60", "--device-error-exit-codes", "79")


async def crash_rank_1(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path, signum: int, policy: dict[str, Any]
) -> tuple[dict[str, Any], dict[int, dict[str, Any]], dict[int, dict[str, Any]], RankProcesses]:
    """Run the gang until it checkpointed, end rank 1's training process with ``signum``, and wait until every rank
    steps again in a new process. The RankFailed record, the running pods before and after, and the processes."""
    async with torch_gang(lab, kube, namespace, tmp_path, policy, HOLD) as gang:
        before = await gang.running_pods()
        assert sorted(before) == list(range(RANKS))
        crashed, crashed_at = gang.signal_rank(1, signum)

        def failed(rs: list[dict]) -> list[dict]:
            # The restart (a replaced rank's node's suspect taint, decided from the same finding, is a record of
            # its own).
            return [
                r for r in rs if r["spec"]["finding"]["kind"] == "RankFailed" and r["spec"]["action"] == "RestartGang"
            ]

        records = await gang.harness.wait_remediation(
            lambda rs: bool(failed(rs)), "a RankFailed remediation", timeout=60
        )
        (record,) = failed(records)
        assert record["spec"]["action"] == "RestartGang", json.dumps(record)
        first = f"rank {namespace}/{before[1]['metadata']['name']} failed first"
        assert first in record["spec"]["finding"]["evidence"], record["spec"]["finding"]
        await gang.wait_stepping(
            started_after=crashed,
            past=crashed_at - CHECKPOINT_EVERY,
            timeout=180,
            what="every rank stepping again in a new process",
        )
        print(
            f"\nmeasured: every rank stepping again {gang.stepping_again_after(crashed):.1f}s after rank 1's "
            f"training process got signal {signum}; "
            f"record {record['metadata']['name']}: {record['spec']['finding']['evidence']}"
        )
        resumes = gang.resumed_steps(crashed)
        assert resumes and min(resumes) % CHECKPOINT_EVERY == 1 and min(resumes) > 1, resumes  # from a checkpoint
        return record, before, await gang.running_pods(), gang.processes


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


async def test_a_ranks_pod_deleted_by_a_person_is_recreated_and_the_others_restart_in_place(
    lab: Lab, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    """What an on-call engineer does to a rank on a bad GPU that nothing flagged: delete its pod. The Job recreates
    that pod; its peers' runs fail and are held, and the gang restarts in place around the new rank."""
    async with torch_gang(lab, kube, namespace, tmp_path, {}, HOLD) as gang:
        before = await gang.running_pods()
        assert sorted(before) == list(range(RANKS))
        deleted_at, step = time.time(), max(gang.steps_by_rank().values())
        await kube.delete(api_path("v1", "pods", namespace=namespace, name=before[1]["metadata"]["name"]))

        def restarts(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for r in rs if r["spec"]["action"] == "RestartGang"]

        await gang.harness.wait_remediation(lambda rs: bool(restarts(rs)), "a gang restart", timeout=60)
        await gang.wait_stepping(
            started_after=deleted_at,
            past=step - CHECKPOINT_EVERY,
            timeout=180,
            what="every rank stepping again in a new process",
        )
        after = await gang.running_pods()
        records = await gang.harness.remediations()
        print(
            f"\nmeasured: every rank stepping again {gang.stepping_again_after(deleted_at):.1f}s after rank 1's pod "
            f"was deleted; restarts: {[r['spec']['finding'] for r in restarts(records)]}"
        )
        (restart,) = restarts(records)
        # The peers' held runs name the restart; the deleted rank is gone already, so no rank is replaced.
        assert restart["spec"]["finding"]["kind"] == "RankFailed", restart["spec"]["finding"]
        assert restart["spec"]["finding"].get("podUID", "") == "", restart["spec"]["finding"]
        assert after[1]["metadata"]["uid"] != before[1]["metadata"]["uid"], "rank 1's pod recreated"
        for rank in (0, 2, 3):
            assert after[rank]["metadata"]["uid"] == before[rank]["metadata"]["uid"], f"rank {rank}'s pod was recreated"
        resumes = gang.resumed_steps(deleted_at)
        assert resumes and min(resumes) % CHECKPOINT_EVERY == 1 and min(resumes) > 1, resumes  # from a checkpoint
