"""Kill points: the controller killed right after each of its API writes, then started again.

For Deschedule, FailPod, Taint, Cordon, RemediateNode and RestartGang, a first run does the
whole remediation and counts its writes; then, for each k, a fresh cluster gets a controller
that dies right after its k-th write lands (``MemApi.cut_off``: the write is stored, its
answer never comes, nothing after it lands) and a new controller process that starts from
what the API holds. Every kill point must end with the remediation done exactly once: one
record, done (RemediateNode: waiting for the node, its object created once), no second
disruption. Then, with the world changed between the kill and the restart (the node
recovered, the breaker opened, the policy paused), a record left Pending or InProgress
leads to nothing a new decision in that world would not do, and says why (every action
kind in both states: tests/unit/engine/test_rounds.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devheal.controller.loop import Controller, ControllerOptions
from devheal.kube.client import api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION
from tests.shell.fixtures import connect, unix_clock, wall_clock
from tests.shell.memapi import MemApi
from tests.shell.store import Event, Ref
from tests.shell.waiting import until

from .test_loop import NODES, PODS, POLICIES, failed_report, gpu_node, inference_pod, remediation_policy

pytestmark = pytest.mark.asyncio(loop_scope="function")

REPORTS = api_path(GROUP_VERSION, "nodedevices")
WRITES = frozenset({"create", "update", "patch", "delete"})
Obj = dict[str, Any]


def records(api: MemApi) -> list[Obj]:
    return [obj for key, obj in api.store.objects.items() if key[1] == "remediations"]


def phase(record: Obj) -> str:
    return str((record.get("status") or {}).get("phase") or "")


def deletions(api: MemApi, name: str) -> list[str]:
    """UIDs of the pods named ``name`` that were deleted, in order."""
    return [
        e.obj["metadata"]["uid"] for e in api.store.log if e.type == "DELETED" and e.key[1:] == ("pods", "ml", name)
    ]


@dataclass(frozen=True)
class Scenario:
    seed: Callable[[MemApi], None]
    done: Callable[[MemApi], bool]
    """The remediation ended well (its record Succeeded and its effect is there)."""
    once: Callable[[MemApi], None]
    """Asserts nothing was done twice."""


def the_record_succeeded(api: MemApi, action: str) -> bool:
    found = [r for r in records(api) if r["spec"]["action"] == action]
    return len(found) == 1 and phase(found[0]) == "Succeeded"


def one_record(api: MemApi) -> None:
    assert len(records(api)) == 1, [r["metadata"]["name"] for r in records(api)]


# ---- Deschedule: an inference pod on a failed GPU --------------------------------------------------


def deschedule_seed(api: MemApi) -> None:
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy())
    api.create(PODS, inference_pod("infer-0"))


def deschedule_once(api: MemApi) -> None:
    one_record(api)
    assert len(deletions(api, "infer-0")) == 1


DESCHEDULE = Scenario(
    deschedule_seed,
    lambda api: the_record_succeeded(api, "Deschedule") and bool(deletions(api, "infer-0")),
    deschedule_once,
)


# ---- FailPod: a Job's pod on a failed GPU ------------------------------------------------------------


def job_pod() -> Obj:
    pod = inference_pod("job-0")
    pod["metadata"]["labels"] = {"batch.kubernetes.io/job-name": "job"}
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "job", "controller": True}
    ]
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def fail_pod_seed(api: MemApi) -> None:
    api.create(NODES, gpu_node())
    api.create(POLICIES, remediation_policy())
    api.create(PODS, job_pod())


def pod_failed(api: MemApi) -> bool:
    return api.get(f"{PODS}/job-0")["status"].get("phase") == "Failed"


def fail_pod_once(api: MemApi) -> None:
    one_record(api)
    failed = [
        e for e in api.store.log if e.key[1:] == ("pods", "ml", "job-0") and e.obj["status"].get("phase") == "Failed"
    ]
    assert failed, "the pod was failed"
    assert not deletions(api, "job-0"), "a Job's pod is failed, not deleted"


FAIL_POD = Scenario(fail_pod_seed, lambda api: the_record_succeeded(api, "FailPod") and pod_failed(api), fail_pod_once)


# ---- Taint: a node whose agent reports every GPU failed ----------------------------------------------


def taint_seed(api: MemApi) -> None:
    api.create(NODES, gpu_node(gpus=2))
    api.create(POLICIES, remediation_policy(node={"taint": True}, budgets={"maxUnhealthyNodes": "100%"}))
    api.create(REPORTS, failed_report())


def devheal_taints(api: MemApi) -> list[Obj]:
    return [t for t in api.get(f"{NODES}/n1")["spec"].get("taints") or [] if t["key"].startswith("devheal.io/")]


def taint_once(api: MemApi) -> None:
    one_record(api)
    assert len(devheal_taints(api)) == 1


TAINT = Scenario(taint_seed, lambda api: the_record_succeeded(api, "Taint") and bool(devheal_taints(api)), taint_once)


# ---- Cordon: the same node under a policy that cordons instead of tainting ---------------------------------


def cordon_seed(api: MemApi) -> None:
    api.create(NODES, gpu_node(gpus=2))
    api.create(
        POLICIES, remediation_policy(node={"taint": False, "cordon": True}, budgets={"maxUnhealthyNodes": "100%"})
    )
    api.create(REPORTS, failed_report())


def cordoned(api: MemApi) -> bool:
    return bool(api.get(f"{NODES}/n1")["spec"].get("unschedulable"))


def cordon_once(api: MemApi) -> None:
    one_record(api)
    assert cordoned(api) and not devheal_taints(api)


CORDON = Scenario(cordon_seed, lambda api: the_record_succeeded(api, "Cordon") and cordoned(api), cordon_once)


# ---- RemediateNode: an idle node whose GPUs all failed, through an external remediation template ---------

TEMPLATES = api_path("remediation.example.com/v1", "rebootremediationtemplates", namespace="ops")
REBOOTS = api_path("remediation.example.com/v1", "rebootremediations", namespace="ops")


def remediate_seed(api: MemApi) -> None:
    api.create(NODES, gpu_node(gpus=2))
    template = {"apiVersion": "remediation.example.com/v1", "kind": "RebootRemediationTemplate"}
    node = {"taint": False, "remediateAfter": "0s", "template": {**template, "namespace": "ops", "name": "reboot"}}
    api.create(POLICIES, remediation_policy(node=node, budgets={"maxUnhealthyNodes": "100%"}))
    api.create(REPORTS, failed_report())
    api.create(TEMPLATES, {"metadata": {"name": "reboot"}, "spec": {"template": {"spec": {"strategy": "soft"}}}})


def reboots(api: MemApi) -> list[str]:
    """Reboot objects stored, by name, every time one was created."""
    return [e.key[3] for e in api.store.log if e.type == "ADDED" and e.key[1] == "rebootremediations"]


def remediation_requested(api: MemApi) -> bool:
    found = [r for r in records(api) if r["spec"]["action"] == "RemediateNode"]
    steps = [s.get("name") for r in found for s in (r.get("status") or {}).get("steps") or []]
    return len(found) == 1 and "remediation-created" in steps and reboots(api) == ["n1"]


def remediate_once(api: MemApi) -> None:
    one_record(api)
    assert reboots(api) == ["n1"], "one remediation object, created once"
    assert phase(records(api)[0]) == "InProgress", "it waits for the node to come back"


REMEDIATE = Scenario(remediate_seed, remediation_requested, remediate_once)


# ---- RestartGang: one broken rank of three -----------------------------------------------------------


def rank(i: int, *, unhealthy: bool = False, generation: str = "") -> Obj:
    pod = inference_pod(f"rank-{i}", device=f"GPU-{i}", health="Unhealthy" if unhealthy else "Healthy", node=f"n{i}")
    pod["metadata"]["labels"] = {"devheal.io/gang": "train"}
    pod["metadata"].pop("ownerReferences")
    if generation:
        pod["metadata"]["annotations"] = {RESTART_GENERATION_ANNOTATION: generation}
    return pod


def gang_seed(api: MemApi) -> None:
    for i in range(3):
        api.create(NODES, gpu_node(f"n{i}"))
    api.create(POLICIES, remediation_policy(actions={"gang": "RestartGang"}))
    for i in range(3):
        api.create(PODS, rank(i, unhealthy=i == 1))

    def recreate(event: Event) -> None:
        # The gang's owner (a StatefulSet, say) recreates a deleted rank: healthy, on its node.
        if event.type == "DELETED" and event.key[1:] == ("pods", "ml", "rank-1"):
            asyncio.get_running_loop().call_soon(api.create, PODS, rank(1))

    api.store.listeners.append(recreate)


def generations(api: MemApi) -> list[str]:
    pods = [api.store.objects.get(Ref.parse(f"{PODS}/rank-{i}").key) for i in range(3)]
    return [
        ((p or {}).get("metadata", {}).get("annotations") or {}).get(RESTART_GENERATION_ANNOTATION, "") for p in pods
    ]


def gang_once(api: MemApi) -> None:
    one_record(api)
    assert len(deletions(api, "rank-1")) == 1, "only the broken rank was replaced, once"
    assert not deletions(api, "rank-0") and not deletions(api, "rank-2")
    assert generations(api) == ["1", "1", "1"], "one restart: every rank at generation 1"


GANG = Scenario(gang_seed, lambda api: the_record_succeeded(api, "RestartGang"), gang_once)


# ---- the matrix -----------------------------------------------------------------------------------------


async def run_controller(api: MemApi, directory: Path, user: str, until_done: Callable[[], bool]) -> None:
    """Run a controller as ``user`` until ``until_done()`` or until the API cut it off (then kill it)."""
    client = await connect(api, directory, user)
    options = ControllerOptions(leader_elect=False, identity=user, lease_namespace="devheal", lease_name="c")
    controller = Controller(client, options, clock=unix_clock)
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        await until(lambda: until_done() or api.is_cut_off(user), f"{user} to finish or be cut off", timeout=600)
        if not api.is_cut_off(user):
            await asyncio.sleep(30)  # nothing more happens after it is done
            stop.set()
            await task
    finally:
        if not task.done():
            task.cancel()  # SIGKILL: nothing it does from here reaches the API
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await client.close()


def writes_of(api: MemApi, user: str) -> int:
    return sum(1 for c in api.calls(user=user) if c.verb in WRITES)


@pytest.mark.parametrize(
    "scenario",
    [DESCHEDULE, FAIL_POD, TAINT, CORDON, REMEDIATE, GANG],
    ids=["Deschedule", "FailPod", "Taint", "Cordon", "RemediateNode", "RestartGang"],
)
async def test_a_controller_killed_after_any_write_leaves_the_remediation_done_exactly_once(
    scenario: Scenario, tmp_path: Path
) -> None:
    async with MemApi(now=wall_clock) as api:
        scenario.seed(api)
        await run_controller(api, tmp_path, "whole", lambda: scenario.done(api))
        scenario.once(api)
        total = writes_of(api, "whole")
    assert total >= 3, "the remediation takes several writes"
    for k in range(1, total + 1):
        async with MemApi(now=wall_clock) as api:
            scenario.seed(api)
            api.cut_off("first", after_writes=k)
            await run_controller(api, tmp_path, "first", lambda: scenario.done(api))
            await run_controller(api, tmp_path, "second", lambda: scenario.done(api))
            assert scenario.done(api), f"killed after write {k} of {total}: not done after the restart"
            scenario.once(api)


# ---- kill points with the world changed before the restart ---------------------------------------------------
# The first process dies right after a write that leaves its record Pending (created, no step taken) or
# InProgress (a step taken); before the second starts, the world changes. The second does nothing a new decision
# in the changed world would not do, and the record says why.


def record_created(call: Any) -> bool:
    return call.verb == "create" and "/remediations" in call.path


def first_step_taken(call: Any) -> bool:
    """A disruptive step: a pod deleted or evicted, a remediation object created."""
    return (call.verb == "delete" and "/pods/" in call.path) or (
        call.verb == "create" and ("/eviction" in call.path or "/rebootremediations" in call.path)
    )


def kill_point(api: MemApi, user: str, at: Callable[[Any], bool]) -> int:
    writes = [c for c in api.calls(user=user) if c.verb in WRITES]
    return next(i + 1 for i, c in enumerate(writes) if at(c))


def left_pending(api: MemApi) -> bool:
    return len(records(api)) == 1 and phase(records(api)[0]) == ""


def left_in_progress(api: MemApi) -> bool:
    stepped = bool(reboots(api)) or bool(deletions(api, "rank-1"))
    return len(records(api)) == 1 and phase(records(api)[0]) == "InProgress" and stepped


def recover(api: MemApi) -> None:
    """The node's agent reports every GPU healthy again."""
    report = api.get(f"{REPORTS}/n1")
    devices = [{**d, "health": "Healthy", "reasons": []} for d in report["status"]["devices"]]
    api.patch(f"{REPORTS}/n1/status", {"status": {"devices": devices}})


def pause(api: MemApi) -> None:
    api.patch(f"{POLICIES}/p", {"spec": {"paused": True}})


def open_breaker(api: MemApi) -> None:
    condition = {
        "type": "CircuitBreakerOpen",
        "status": "True",
        "reason": "FaultStorm",
        "message": "circuit breaker open: a fault storm",
        "lastTransitionTime": api.get(f"{POLICIES}/p")["metadata"]["creationTimestamp"],
    }
    api.patch(f"{POLICIES}/p/status", {"status": {"conditions": [condition]}})


def the_status(api: MemApi) -> Obj:
    [record] = records(api)
    return dict(record.get("status") or {})


@dataclass(frozen=True)
class Changed:
    scenario: Scenario
    kill_at: Callable[[Any], bool]
    """The write the first process dies right after (as the whole run wrote it)."""
    left: Callable[[MemApi], bool]
    """The state that kill leaves: the record Pending, or in progress with its first step taken."""
    change: Callable[[MemApi], None]
    ended: Callable[[Obj], bool]
    """The record, as the restarted controller leaves it."""
    untouched: Callable[[MemApi], None]
    """Asserts nothing disruptive happened after the kill."""


def no_reboot(api: MemApi) -> None:
    assert reboots(api) == []


def no_eviction(api: MemApi) -> None:
    assert deletions(api, "infer-0") == []


def no_taint(api: MemApi) -> None:
    assert devheal_taints(api) == []


def gang_not_replaced(api: MemApi) -> None:
    assert deletions(api, "rank-1") == [] and generations(api) == ["", "", ""]


def gang_held(api: MemApi) -> None:
    assert len(deletions(api, "rank-1")) == 1, "the step taken before the kill, not again"


def reboot_removed(api: MemApi) -> None:
    assert reboots(api) == ["n1"]
    assert not [o for key, o in api.store.objects.items() if key[1] == "rebootremediations"]


def declined(status: Obj) -> bool:
    return status.get("phase") == "Blocked" and status.get("reason") == "NoLongerWanted"


CHANGED = {
    "Pending RemediateNode, node recovered": Changed(
        REMEDIATE, record_created, left_pending, recover, declined, no_reboot
    ),
    "Pending Taint, node recovered": Changed(TAINT, record_created, left_pending, recover, declined, no_taint),
    "Pending Deschedule, policy paused": Changed(
        DESCHEDULE,
        record_created,
        left_pending,
        pause,
        lambda s: (s.get("phase"), s.get("reason")) == ("Blocked", "Paused"),
        no_eviction,
    ),
    "Pending Deschedule, breaker opened": Changed(
        DESCHEDULE,
        record_created,
        left_pending,
        open_breaker,
        lambda s: (s.get("phase"), s.get("reason")) == ("Blocked", "CircuitBreaker"),
        no_eviction,
    ),
    "Pending RestartGang, breaker opened": Changed(
        GANG,
        record_created,
        left_pending,
        open_breaker,
        lambda s: (s.get("phase"), s.get("reason")) == ("Blocked", "CircuitBreaker"),
        gang_not_replaced,
    ),
    "InProgress RestartGang, breaker opened": Changed(
        GANG,
        first_step_taken,
        left_in_progress,
        open_breaker,
        lambda s: (s.get("phase"), s.get("reason")) == ("InProgress", "CircuitBreaker"),
        gang_held,
    ),
    "InProgress RemediateNode, node recovered": Changed(
        REMEDIATE,
        first_step_taken,
        left_in_progress,
        recover,
        lambda s: (s.get("phase"), s.get("reason")) == ("Succeeded", "NodeRecovered"),
        reboot_removed,
    ),
}


@pytest.mark.parametrize("case", list(CHANGED.values()), ids=list(CHANGED))
async def test_a_restarted_controller_re_checks_the_changed_world_before_a_resumed_records_next_step(
    case: Changed, tmp_path: Path
) -> None:
    async with MemApi(now=wall_clock) as api:
        case.scenario.seed(api)
        await run_controller(api, tmp_path, "whole", lambda: case.scenario.done(api))
        near = kill_point(api, "whole", case.kill_at)
    # Writes of other objects (a policy's status, Events) may come in another order: the kill point is the one
    # that leaves the state wanted.
    for k in sorted(range(max(1, near - 3), near + 6), key=lambda k: abs(k - near)):
        async with MemApi(now=wall_clock) as api:
            case.scenario.seed(api)
            api.cut_off("first", after_writes=k)
            await run_controller(api, tmp_path, "first", lambda: False)
            if not case.left(api):
                continue
            case.change(api)
            await run_controller(api, tmp_path, "second", lambda: case.ended(the_status(api)))
            status = the_status(api)
            assert case.ended(status), status
            assert status.get("message"), "the record says why"
            case.untouched(api)
            return
    pytest.fail(f"no run was killed right after the write (near write {near})")
