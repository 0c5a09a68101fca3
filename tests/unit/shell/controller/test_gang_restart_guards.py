"""A gang restart ends: a rank a PodDisruptionBudget keeps is tried again with backoff, then the restart
fails naming it; a malformed restart generation (on a member or on the record) fails it at once.

The in-memory API and a real ``ClusterCache``, as in ``test_gang_restart``; passes are driven
at the round's pace for gang restarts (``Pacing.gang_restart``), on virtual time.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from devheal.controller.actuators import Actuators
from devheal.controller.gangs import (
    EVICTION_TRIES,
    REMEDIATION_GENERATION,
    REMEDIATION_SIZE,
    REMEDIATION_STARTED,
)
from devheal.controller.records import REMEDIATIONS
from devheal.engine.rounds import Pacing
from devheal.kube.client import KubeClient
from devheal.model.cluster import RESTART_GENERATION_ANNOTATION
from devheal.model.plan import Action, Phase
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_gang_restart import (
    PODS,
    actuators,
    evicted,
    gang,
    generation,
    generation_writes,
    rank,
    restart,
    synced,
)
from tests.unit.shell.controller.test_loop import (
    NODES,
    POLICIES,
    events,
    gpu_node,
    has_pod,
    inference_pod,
    records,
    remediation_policy,
    running,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")

FOREVER = 10**6
Obj = dict[str, Any]
PDB = "Cannot evict pod as it would violate the pod's disruption budget."


def evictions(api: MemApi, pod: str = "rank-1") -> list[float]:
    """When the eviction of ``pod`` was asked for (loop time): the dry runs that ask whether it may go (a refused
    one is a refused eviction), and the eviction itself once it may."""
    return [c.at for c in api.calls("create", f"{PODS}/{pod}/eviction")]


async def passes(acting: Actuators, action: Action, seconds: float, pace: float = Pacing().gang_restart) -> Phase:
    """Carry the restart on every ``pace`` seconds (the round's, by default) for ``seconds``, or until it
    ends; its last phase."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        outcome = await acting.execute(action)
        if outcome.phase is not Phase.IN_PROGRESS or loop.time() >= end:
            return outcome.phase
        await asyncio.sleep(pace)


# ---- a PodDisruptionBudget refuses a rank's eviction --------------------------------------------------


async def test_a_refused_rank_is_tried_with_backoff_then_the_restart_fails_naming_it(
    api: MemApi, kube: KubeClient
) -> None:
    gang(api, broken=1)
    api.fail_next(429, verb="create", path=f"{PODS}/rank-1/eviction", times=FOREVER, message=PDB)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        action = restart()
        assert await passes(acting, action, 600, pace=1.0) is Phase.FAILED
        tries = evictions(api)
        await asyncio.sleep(60)
        assert await acting.execute(action) and evictions(api) == tries  # ended: nothing more is tried
    assert len(tries) == EVICTION_TRIES
    # 1 s doubling, capped at 60 s.
    gaps = [round(b - a) for a, b in itertools.pairwise(tries)]
    assert gaps == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    record = api.get(f"{REMEDIATIONS}/{action.name}")
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Failed", "DisruptionBudget")
    message = record["status"]["message"]
    assert f"eviction of rank ml/rank-1 refused {EVICTION_TRIES} time(s) (a PodDisruptionBudget)" in message
    assert PDB in message and f"gave up after {EVICTION_TRIES} tries" in message
    # The others were not restarted for a rank that cannot be replaced, and no node was vacated.
    assert generation_writes(api) == [] and acting.gangs.vacancies == []
    # Tries changed the record's message, not its reason: one Event for the refusals, one for the end.
    assert [e["count"] for e in events(api, "DevhealRestartGang")] == [1]
    assert [e["count"] for e in events(api, "DevhealRestartGangFailed")] == [1]


async def test_a_refused_rank_past_the_restart_timeout_fails_it(api: MemApi, kube: KubeClient) -> None:
    gang(api, broken=1)
    api.fail_next(429, verb="create", path=f"{PODS}/rank-1/eviction", times=FOREVER, message=PDB)
    async with synced(kube) as cache:
        acting = actuators(kube, cache, timeout=30)
        action = restart()
        assert await passes(acting, action, 600) is Phase.FAILED
    assert [round(t) for t in evictions(api)] == [0, 1, 3, 7, 15]  # the next try would be at 31 s
    record = api.get(f"{REMEDIATIONS}/{action.name}")
    assert record["status"]["reason"] == "DisruptionBudget"
    assert "rank ml/rank-1 refused 5 time(s)" in record["status"]["message"]
    assert "gave up after the restart's limit of 30s" in record["status"]["message"]


async def test_a_budget_that_lets_the_eviction_through_later_lets_the_restart_go_on(
    api: MemApi, kube: KubeClient
) -> None:
    gang(api, broken=1)
    api.fail_next(429, verb="create", path=f"{PODS}/rank-1/eviction", times=3, message=PDB)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        action = restart()
        await passes(acting, action, 10)
    # Three dry runs refused, backing off; the fourth passes and the eviction itself follows in the same pass.
    assert [round(t) for t in evictions(api)] == [0, 1, 3, 7, 7]
    assert evicted(api) == ["rank-1"]
    assert (generation(api, "rank-0"), generation(api, "rank-2")) == ("1", "1")
    assert [v.node for v in acting.gangs.vacancies] == ["n1"]  # once, for the eviction that went through
    record = api.get(f"{REMEDIATIONS}/{action.name}")
    assert (record["status"]["phase"], record["status"]["reason"]) == ("InProgress", "WaitingForReplacement")


# ---- malformed restart generations ---------------------------------------------------------------------

BAD = {
    "arabic-indic digit": "٣",
    "fullwidth digits": "１２",
    "thousands of digits": "7" * 5000,
    "negative": "-3",
    "empty": "",
    "blank inside": "1 2",
    "float": "1.0",
}


@pytest.mark.parametrize("value", list(BAD.values()), ids=list(BAD))
async def test_a_member_with_a_malformed_generation_fails_the_restart_naming_it(
    api: MemApi, kube: KubeClient, value: str
) -> None:
    rank(api, 0, notes={RESTART_GENERATION_ANNOTATION: value})
    rank(api, 1, unhealthy=True)
    rank(api, 2)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        action = restart()
        outcome = await acting.execute(action)
        again = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "InvalidGeneration")
    assert (again.phase, again.reason) == (Phase.FAILED, "InvalidGeneration")  # ended, not tried again
    assert f"pod ml/rank-0: annotation {RESTART_GENERATION_ANNOTATION} is " in outcome.message
    assert "expected a whole number of ASCII digits from 0 to 9223372036854775807" in outcome.message
    assert len(outcome.message) < 400  # the value is shown cut short
    assert evicted(api) == [] and generation_writes(api) == []
    annotations = api.get(f"{REMEDIATIONS}/{action.name}")["metadata"].get("annotations") or {}
    assert REMEDIATION_GENERATION not in annotations


async def test_a_member_at_the_largest_generation_fails_the_restart(api: MemApi, kube: KubeClient) -> None:
    gang(api, broken=1, notes={RESTART_GENERATION_ANNOTATION: str(2**63 - 1)})
    async with synced(kube) as cache:
        outcome = await actuators(kube, cache).execute(restart())
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "InvalidGeneration")
    assert f"pod ml/rank-0: annotation {RESTART_GENERATION_ANNOTATION} is 9223372036854775807" in outcome.message
    assert "no next one" in outcome.message
    assert evicted(api) == [] and generation_writes(api) == []


RECORD_BAD = [
    *((REMEDIATION_GENERATION, v) for v in [*BAD.values(), "0"]),
    *((REMEDIATION_SIZE, v) for v in BAD.values()),
    # "1.0" is a start (Unix seconds): not among the bad ones here.
    *((REMEDIATION_STARTED, v) for v in [*BAD.values(), "nan", "inf", "1e999", "١٧٠٠٠٠٠٠٠٠"] if v != "1.0"),
]


@pytest.mark.parametrize(("key", "value"), RECORD_BAD, ids=[f"{k.rsplit('-', 1)[1]}={v[:12]!r}" for k, v in RECORD_BAD])
async def test_a_record_with_a_malformed_restart_annotation_fails_naming_it(
    api: MemApi, kube: KubeClient, key: str, value: str
) -> None:
    gang(api, broken=1)
    async with synced(kube) as cache:
        acting = actuators(kube, cache)
        action = restart()
        await acting.records.intent(action)
        notes = {REMEDIATION_GENERATION: "1", REMEDIATION_SIZE: "3", REMEDIATION_STARTED: "1893456000.0", key: value}
        api.patch(f"{REMEDIATIONS}/{action.name}", {"metadata": {"annotations": notes}})
        outcome = await acting.execute(action)
        again = await acting.execute(action)
    assert (outcome.phase, outcome.reason) == (Phase.FAILED, "InvalidGeneration")
    assert (again.phase, again.reason) == (Phase.FAILED, "InvalidGeneration")
    assert f"Remediation {action.name}: annotation {key} is " in outcome.message
    assert ", expected " in outcome.message and len(outcome.message) < 400
    assert evicted(api) == [] and generation_writes(api) == []


async def test_the_controller_tries_a_rank_a_budget_keeps_a_bounded_number_of_times(
    api: MemApi, kube: KubeClient
) -> None:
    for i in range(3):
        api.create(NODES, gpu_node(f"n{i}"))
    api.create(POLICIES, remediation_policy(actions={"gang": "RestartGang"}))
    for i in range(3):
        pod = inference_pod(f"rank-{i}", device=f"GPU-{i}", health="Unhealthy" if i == 1 else "Healthy", node=f"n{i}")
        pod["metadata"]["labels"] = {"devheal.io/gang": "train"}
        pod["metadata"].pop("ownerReferences")
        api.create(PODS, pod)
    api.fail_next(429, verb="create", path=f"{PODS}/rank-1/eviction", times=FOREVER, message=PDB)
    async with running(kube) as run:
        await until(lambda: failed(api), "the restart to end", timeout=600)
        tries = len(evictions(api))
    assert run.rounds >= 200  # about 4 minutes of rounds, the restart carried on every 0.2 s
    assert tries == EVICTION_TRIES
    [record] = failed(api)
    assert (record["spec"]["action"], record["status"]["reason"]) == ("RestartGang", "DisruptionBudget")
    assert "rank ml/rank-1" in record["status"]["message"]
    assert not api.calls("patch", f"{PODS}/rank-0") and has_pod(api, "rank-1")


def failed(api: MemApi) -> list[Obj]:
    return [r for r in records(api) if (r.get("status") or {}).get("phase") == "Failed"]
