"""Remediation records on the in-memory API: a Blocked decision is never carried out, ended records are
deleted past their retention (active ones never), long names fit in labels, and a node's episode number
lives on the node.

The controller runs whole (cache, rounds, work queue, actuators) on virtual time, as in test_loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.controller.loop import RETENTION_EVERY, RETENTION_PER_ROUND
from devheal.controller.projections import project_node, project_remediation
from devheal.controller.records import Records, remediation_body
from devheal.kube.client import KubeClient
from devheal.model.cluster import LIFTS_ANNOTATION, Workload, WorkloadClass
from devheal.model.plan import (
    DECISION_ANNOTATION,
    Action,
    Decision,
    Finding,
    FindingKind,
    FindingSource,
    Phase,
    TargetKind,
)
from devheal.model.policy import ActionKind
from devheal.model.times import format_time
from devheal.model.values import LABEL_VALUE_MAX
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_loop import (
    NODES,
    PODS,
    POLICIES,
    REMEDIATIONS,
    gpu_node,
    inference_pod,
    records,
    remediation_policy,
    running,
    status_writes,
)

virtual_time = pytest.mark.asyncio(loop_scope="function")

Obj = dict[str, Any]
LONG = "n" * 200


def failed_gpus(node: Obj) -> Obj:
    """The node's device plugin shows every GPU gone (allocatable 0): a node finding after capacityGapAfter."""
    node["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
    return node


def node_action(kind: ActionKind, node: str = "n1", policy: str = "p") -> Action:
    finding = Finding(FindingKind.NODE_DEVICES_FAILED, node, (FindingSource.NODE_CAPACITY,), "8 GPUs gone", 0.0)
    return Action(kind, TargetKind.NODE, node, node, finding, policy, target_uid=f"uid-{node}")


def tainted(api: MemApi, node: str = "n1") -> bool:
    spec = api.get(f"{NODES}/{node}").get("spec") or {}
    return any(t.get("key") == "devheal.io/device-failure" for t in spec.get("taints") or [])


# ---- 4. Blocked means not done ------------------------------------------------------------------


def test_a_record_created_blocked_reads_blocked_and_is_never_resumed_until_its_status_says_otherwise() -> None:
    action = node_action(ActionKind.TAINT)
    body = remediation_body(action, Decision.BLOCKED)
    assert body["metadata"]["annotations"] == {DECISION_ANNOTATION: "Blocked"}
    body["metadata"]["creationTimestamp"] = format_time(100.0)
    record = project_remediation(body)
    assert (record.phase, record.resume, record.active) == (Phase.BLOCKED, None, False)
    # A later decision to act on it (the rail let it pass) writes a phase: that is carried on.
    acting = project_remediation({**body, "status": {"phase": "InProgress"}})
    assert (acting.phase, acting.resume) == (Phase.IN_PROGRESS, action)


def test_a_record_without_a_phase_is_resumed_only_when_created_to_act() -> None:
    action = node_action(ActionKind.TAINT)
    created = project_remediation(remediation_body(action))
    assert (created.phase, created.resume) == (Phase.PENDING, action)
    unknown = remediation_body(action)
    del unknown["metadata"]["annotations"]  # written by a version that did not say what it decided
    record = project_remediation(unknown)
    assert (record.phase, record.resume) == (Phase.PENDING, None)


@virtual_time
async def test_a_blocked_decision_whose_status_never_came_is_not_carried_out_after_a_restart(
    api: MemApi, kube: KubeClient
) -> None:
    """The record is created, its Blocked status is refused, the controller stops; a new one over the same
    API finds a record without a phase: it reads Blocked (from the create request) and nothing is done."""
    api.create(NODES, failed_gpus(gpu_node()))
    api.create(POLICIES, remediation_policy(node={"taint": True}, budgets={"maxUnhealthyNodes": 0}))
    api.fail_next(500, verb="patch", path=REMEDIATIONS, times=10**6)
    async with running(kube):
        await until(lambda: records(api), "the blocked decision's record", timeout=600)
        await asyncio.sleep(10)
    [record] = records(api)
    assert "status" not in record or not record["status"].get("phase")
    assert record["metadata"]["annotations"][DECISION_ANNOTATION] == "Blocked"
    api.faults.clear()
    async with running(kube) as run:  # a new process: nothing in memory, only the record
        # The node's finding comes back after capacityGapAfter (2m) of this process's own watching.
        await until(lambda: tainted(api) or (records(api)[0].get("status") or {}).get("phase"), "a phase", timeout=600)
        await asyncio.sleep(60)
    assert run.rounds >= 60
    assert not tainted(api), "a Blocked decision was carried out"
    [record] = records(api)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Blocked", "MaxUnhealthyNodes")
    assert len(status_writes(api, record)) >= 1


# ---- 5. label values ----------------------------------------------------------------------------


@virtual_time
async def test_a_200_character_node_and_policy_name_still_make_a_record(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, {**gpu_node(LONG), "metadata": {"name": LONG}})
    acting = Actuators(kube, lambda: {}, clock=unix_clock)
    outcome = await acting.execute(node_action(ActionKind.TAINT, LONG, "p" * 200))
    assert outcome.phase is Phase.SUCCEEDED
    [record] = records(api)
    labels = record["metadata"]["labels"]
    assert all(len(v) <= LABEL_VALUE_MAX for v in labels.values())
    assert labels["devheal.io/node"].startswith("n" * 20) and labels["devheal.io/node"] != LONG
    assert (record["spec"]["target"]["name"], record["spec"]["policy"]) == (LONG, "p" * 200)
    # A node's uid is a UUID (the CRD keeps 64 characters of it); node_action's "uid-<name>" would be 204.
    action = dataclasses.replace(node_action(ActionKind.TAINT, LONG, "p" * 200), target_uid="uid-long-node")
    assert project_remediation(remediation_body(action)).resume == action


# ---- 1. a node's episode lives on the node ------------------------------------------------------


@virtual_time
async def test_lift_numbers_the_next_episode_on_the_node(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, gpu_node())
    acting = Actuators(kube, lambda: {}, clock=unix_clock)
    for n in (1, 2):
        await acting.execute(node_action(ActionKind.TAINT))
        lift = node_action(ActionKind.LIFT)
        lifted = Action(lift.kind, lift.target_kind, lift.target, lift.node, lift.finding, lift.policy, epoch=n)
        assert (await acting.execute(lifted)).phase is Phase.SUCCEEDED
        node = api.get(f"{NODES}/n1")
        assert node["metadata"]["annotations"][LIFTS_ANNOTATION] == str(n)
        assert project_node(node).lifts == n
        assert not tainted(api)
        # The next taint is a new decision: its name comes from the node's count.
        api.delete(f"{REMEDIATIONS}/{node_action(ActionKind.TAINT).name}")
    # A lift with nothing to lift (already done, a resumed record) does not count again.
    await acting.execute(node_action(ActionKind.LIFT))
    assert api.get(f"{NODES}/n1")["metadata"]["annotations"][LIFTS_ANNOTATION] == "2"


# ---- 2. retention -------------------------------------------------------------------------------


def add_record(api: MemApi, name: str, phase: str, ended: float, *, node: str = "n1", policy: str = "p") -> None:
    """A Remediation of a node as the controller writes them (created, then its status), ended (or started)
    at ``ended``."""
    finding = Finding(FindingKind.NODE_DEVICES_FAILED, node, (FindingSource.NODE_CAPACITY,), "gone", ended)
    # A Notify: no decision reads an ended one beyond its name (a Taint that succeeded is read for a day), so
    # only the retention rules keep it.
    action = Action(ActionKind.NOTIFY, TargetKind.NODE, node, node, finding, policy, epoch=int(name.split("-")[-1]))
    body = remediation_body(action, Decision.BLOCKED if phase == "Blocked" else Decision.ACT)
    body["metadata"]["name"] = name
    api.create(REMEDIATIONS, body)
    status = {"phase": phase, "startedAt": format_time(ended)}
    if phase == "Blocked":
        status = {"phase": phase, "observedAt": format_time(ended)}
    elif phase not in ("Pending", "InProgress"):
        status["completedAt"] = format_time(ended)
    api.patch(f"{REMEDIATIONS}/{name}/status", {"status": status})


def seed_records(api: MemApi, now: float) -> None:
    day = 24 * 3600.0
    for i in range(30):  # ended, an hour apart: the 20 newest are within the count, none past the TTL
        add_record(api, f"recent-{i}", "Succeeded", now - (30 - i) * 3600)
    add_record(api, "old-failed-0", "Failed", now - 8 * day, node="n2")
    add_record(api, "old-blocked-0", "Blocked", now - 9 * day, node="n2")
    add_record(api, "old-active-0", "InProgress", now - 30 * day, node="n3")
    add_record(api, "old-pending-0", "Pending", now - 30 * day, node="n4")


@virtual_time
async def test_ended_records_past_their_retention_are_deleted_and_active_ones_stay(
    api: MemApi, kube: KubeClient
) -> None:
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy())
    seed_records(api, unix_clock())
    async with running(kube):
        await until(lambda: len(records(api)) == 22, "retention to delete the old records", timeout=120)
        await asyncio.sleep(3 * RETENTION_EVERY)
    kept = {r["metadata"]["name"] for r in records(api)}
    assert kept == {f"recent-{i}" for i in range(10, 30)} | {"old-active-0", "old-pending-0"}
    deletes = api.calls("delete", REMEDIATIONS)
    assert len(deletes) == 12  # each once


@virtual_time
async def test_retention_follows_the_policy_and_is_paced(api: MemApi, kube: KubeClient) -> None:
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy(records={"ttlAfterFinished": "1h", "maxEndedPerTarget": 1000}))
    now = unix_clock()
    for i in range(RETENTION_PER_ROUND + 50):
        add_record(api, f"r-{i}", "Succeeded", now - 7200 - i, node=f"n{i}")
    add_record(api, "fresh-0", "Succeeded", now - 60)
    async with running(kube):
        await until(lambda: len(api.calls("delete", REMEDIATIONS)) >= RETENTION_PER_ROUND, "the first look")
        await asyncio.sleep(RETENTION_EVERY / 2)
        assert len(api.calls("delete", REMEDIATIONS)) == RETENTION_PER_ROUND  # one look's worth
        # Oldest first: the first look took the oldest ones.
        assert {r["metadata"]["name"] for r in records(api)} >= {f"r-{i}" for i in range(50)}
        await until(lambda: len(records(api)) == 1, "the next look")
    assert [r["metadata"]["name"] for r in records(api)] == ["fresh-0"]


@virtual_time
async def test_a_record_taken_up_again_before_its_deletion_stays(api: MemApi, kube: KubeClient) -> None:
    """The deletion reads the record back and is conditional on that version: one active again stays."""
    now = unix_clock()
    add_record(api, "taken-1", "Blocked", now - 30 * 24 * 3600)
    api.patch(f"{REMEDIATIONS}/taken-1/status", {"status": {"phase": "InProgress"}})
    await Records(kube, unix_clock).delete_ended("taken-1")
    assert [r["metadata"]["name"] for r in records(api)] == ["taken-1"]
    api.patch(f"{REMEDIATIONS}/taken-1/status", {"status": {"phase": "Succeeded", "completedAt": format_time(now)}})
    # Chosen as it was (Blocked a month ago): its new outcome stays.
    await Records(kube, unix_clock).delete_ended("taken-1", now - 30 * 24 * 3600)
    assert [r["metadata"]["name"] for r in records(api)] == ["taken-1"]
    await Records(kube, unix_clock).delete_ended("taken-1", now)
    await Records(kube, unix_clock).delete_ended("taken-1")  # gone already: nothing to do
    assert records(api) == []


def test_a_gang_records_the_rank_that_named_it() -> None:
    """Gang restarts are named by the gang's generation and the failing rank, kept in the spec to rebuild it."""
    rank = Finding(
        FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "XID 79", 0.0, pod="ml/w-0", pod_uid="uid-w0"
    )
    gang = Workload("ml", "JobSet", "train", WorkloadClass.GANG)
    action = Action(ActionKind.RESTART_GANG, TargetKind.GANG, gang.key, "n1", rank, "p", workload=gang, epoch=3)
    body = remediation_body(action)
    assert body["spec"]["finding"]["podUID"] == "uid-w0"
    assert project_remediation(body).resume == action
    other_rank = Finding(
        FindingKind.DEVICE_FAILED, "n2", (FindingSource.POD_STATUS,), "XID 79", 0.0, pod="ml/w-1", pod_uid="uid-w1"
    )
    assert Action(**{**_fields(action), "finding": other_rank}).name != action.name


def test_a_finding_several_signals_agree_on_is_recorded_joined_and_read_back_as_those_signals() -> None:
    signals = (FindingSource.POD_STATUS, FindingSource.NODE_DEVICES, FindingSource.NODE_CAPACITY)
    finding = Finding(FindingKind.NODE_DEVICES_FAILED, "n1", signals, "8 of 8 GPUs failed", 0.0)
    action = node_action(ActionKind.TAINT)
    action = dataclasses.replace(action, finding=finding)
    body = remediation_body(action)
    assert body["spec"]["finding"]["source"] == "pod-status,nodedevices,node-capacity"
    resumed = project_remediation(body).resume
    assert resumed == action and resumed.finding.sources == signals


def test_a_record_that_names_no_signal_reads_back_with_none() -> None:
    """Written by hand, or by a version that kept no source: the decision is still the one the record names."""
    action = node_action(ActionKind.TAINT)
    body = remediation_body(action)
    del body["spec"]["finding"]["source"]
    resumed = project_remediation(body).resume
    assert resumed is not None and resumed.finding.sources == () and resumed.name == action.name


def _fields(action: Action) -> dict[str, Any]:
    return {f: getattr(action, f) for f in action.__dataclass_fields__}


@virtual_time
async def test_a_round_walks_only_current_records_and_still_finds_an_old_decision_by_name(
    api: MemApi, kube: KubeClient
) -> None:
    """Hundreds of old records: the round walks through only those a decision still reads (none here); an old
    record of the very decision the round would make is still found by name, so nothing is done twice."""
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy(records={"ttlAfterFinished": "10000h", "maxEndedPerTarget": 1000}))
    pod = api.create(PODS, inference_pod("infer-0"))
    now = unix_clock()
    for i in range(300):
        add_record(api, f"old-{i}", "Succeeded", now - 30 * 24 * 3600 - i, node=f"n{i}")
    add_record(api, "recent-0", "Succeeded", now - 600, node="n2")
    finding = Finding(FindingKind.DEVICE_FAILED, "n1", (FindingSource.POD_STATUS,), "XID 79", now - 90 * 24 * 3600)
    workload = Workload("ml", "ReplicaSet", "infer-7c9", WorkloadClass.INFERENCE)
    decided = Action(
        ActionKind.DESCHEDULE,
        TargetKind.POD,
        "ml/infer-0",
        "n1",
        finding,
        "p",
        workload=workload,
        target_uid=pod["metadata"]["uid"],
    )
    body = remediation_body(decided)
    api.create(REMEDIATIONS, body)
    api.patch(
        f"{REMEDIATIONS}/{decided.name}/status",
        {
            "status": {
                "phase": "Succeeded",
                "startedAt": format_time(finding.since),
                "completedAt": format_time(now - 90 * 24 * 3600),
            }
        },
    )
    async with running(kube) as run:
        await asyncio.sleep(30)
        current = run.controller.in_flight(run.controller.cache.view())
    assert run.rounds >= 30
    # No decision reads an ended Notify beyond its name, however recent (``RecordReads.still_read``).
    assert [r.name for r in current] == []
    assert current.get(decided.name) is not None and current.get("old-7") is not None
    assert current.get("recent-0") is not None
    assert not api.calls("create", f"{PODS}/infer-0/eviction")  # decided 90 days ago: never again
    assert len(api.calls("create", REMEDIATIONS)) == 0
