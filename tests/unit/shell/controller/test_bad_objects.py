"""One bad object never stops the loop: an object of any watched kind that cannot be read, whatever its reader
raises, is left out (never decided on from an older copy), told on the object once per distinct error (a Warning Event,
a log line, devheal_unreadable_objects_total), and the controller goes on deciding for everything else.

The real Controller against the in-memory API on virtual time. Each kind is fed one hostile object whose reader
raises an exception nobody planned for (the reader is wrapped for that object alone, so the test keeps testing
the class however the parsers improve), next to an ordinary pod on a failed GPU; then the odd inputs the review
found in the wild. A round that raises is logged, counted, backed off and tried again; /readyz says so.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devheal.controller import cache as cache_module
from devheal.controller import dra_cache as dra_cache_module
from devheal.controller import projections
from devheal.controller.bad_objects import UNREADABLE_EVENT
from devheal.controller.loop import ROUND_FAILURES_UNREADY
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP_VERSION
from devheal.model.dra import MANAGED_BY, MANAGED_BY_LABEL, RESOURCE_API
from devheal.model.plan import Phase
from devheal.model.steps import STEPS_ANNOTATION
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_loop import (
    NODES,
    PODS,
    POLICIES,
    REMEDIATIONS,
    events,
    evictions,
    gone,
    gpu_node,
    has_pod,
    inference_pod,
    records,
    remediation_policy,
    running,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")

REPORTS = api_path(GROUP_VERSION, "nodedevices")
SLICES = api_path(RESOURCE_API, "resourceslices")
RULES = api_path(RESOURCE_API, "devicetaintrules")
Obj = dict[str, Any]


class Hostile(ZeroDivisionError):
    """What no reader expects: it stands for any bug a parser may still have."""


def hostile_pod() -> Obj:
    pod = inference_pod("odd-0", device="GPU-5", health="Healthy")
    pod["metadata"]["annotations"] = {STEPS_ANNOTATION: '{"count": 1, "window": 1, "p50": 0.5, "last": null}'}
    return pod


def remediation() -> Obj:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Remediation",
        "metadata": {"name": "odd-record"},
        "spec": {
            "action": "Cordon",
            "target": {"kind": "Node", "name": "n2", "node": "n2"},
            "finding": {"kind": "NodeDevicesFailed", "since": "2030-01-01T00:00:00Z"},
            "policy": "p",
        },
        "status": {"phase": "Succeeded", "startedAt": "2030-01-01T00:00:00Z"},
    }


def node_devices() -> Obj:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "NodeDevices",
        "metadata": {"name": "n2"},
        "spec": {"nodeName": "n2"},
        "status": {"devices": [{"id": "GPU-0", "index": 0, "health": "Healthy"}]},
    }


def resource_slice() -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": "n2-gpu"},
        "spec": {
            "driver": "gpu.devheal.io",
            "pool": {"name": "n2", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "n2",
            "devices": [{"name": "gpu-0"}],
        },
    }


def device_taint_rule() -> Obj:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": "devheal-odd",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {"devheal.io/device": "gpu.devheal.io/n2/gpu-0"},
        },
        "spec": {
            "deviceSelector": {"driver": "gpu.devheal.io", "pool": "n2", "device": "gpu-0"},
            "taint": {"key": "devheal.io/device-failure", "effect": "NoSchedule"},
        },
    }


def odd_policy() -> Obj:
    policy = remediation_policy()
    policy["metadata"]["name"] = "odd-policy"
    policy["spec"]["selector"] = {"namespaces": ["elsewhere"]}
    return policy


# kind -> (collection, the object, its key in the cache, the module and reader to wrap, Event namespace)
KINDS: dict[str, tuple[str, Callable[[], Obj], str, Any, str]] = {
    "Pod": (PODS, hostile_pod, "ml/odd-0", (cache_module, "project_pod"), "ml"),
    "annotation": (PODS, hostile_pod, "ml/odd-0", (projections, "parse_step_report"), "ml"),
    "Node": (NODES, lambda: gpu_node("n2"), "n2", (cache_module, "project_node"), "default"),
    "NodeDevices": (REPORTS, node_devices, "n2", (cache_module, "project_node_devices"), "default"),
    "Remediation": (REMEDIATIONS, remediation, "odd-record", (cache_module, "project_remediation"), "default"),
    "RemediationPolicy": (POLICIES, odd_policy, "odd-policy", (cache_module, "parse_policy"), "default"),
    "ResourceSlice": (SLICES, resource_slice, "n2-gpu", (dra_cache_module, "project_resource_slice"), "default"),
    "DeviceTaintRule": (
        RULES,
        device_taint_rule,
        "devheal-odd",
        (dra_cache_module, "project_device_taint_rule"),
        "default",
    ),
}


def unreadable(kind: str) -> float:
    return REGISTRY.get_sample_value("devheal_unreadable_objects_total", {"kind": kind}) or 0.0


def round_failures() -> float:
    return REGISTRY.get_sample_value("devheal_round_failures_total") or 0.0


def timed_rounds() -> float:
    return REGISTRY.get_sample_value("devheal_round_seconds_count") or 0.0


def told_about(api: MemApi, name: str) -> list[Obj]:
    return [e for e in events(api, UNREADABLE_EVENT) if e["involvedObject"]["name"] == name]


def wrap_for(monkeypatch: pytest.MonkeyPatch, target: tuple[Any, str], hostile: Callable[[Any], bool]) -> None:
    """Make the reader raise ``Hostile`` for the objects ``hostile`` picks, and read every other one as before."""
    module, name = target
    real = getattr(module, name)

    def reader(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if hostile(obj):
            raise Hostile("division by zero deep inside the reader")
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(module, name, reader)


def is_hostile(value: Any) -> bool:
    """The hostile version of an object: labelled so (or, for an annotation, its value marked so)."""
    if isinstance(value, str):
        return '"hostile"' in value
    meta = value.get("metadata") if isinstance(value, dict) else None
    return isinstance(meta, dict) and (meta.get("labels") or {}).get("odd") == "hostile"


def make_hostile(kind: str, obj: Obj) -> Obj:
    bad = copy.deepcopy(obj)
    if kind == "annotation":
        bad["metadata"]["annotations"][STEPS_ANNOTATION] = '{"count": 1, "window": 1, "p50": "hostile"}'
    else:
        bad["metadata"].setdefault("labels", {})["odd"] = "hostile"
    return bad


@pytest.mark.parametrize("kind", list(KINDS))
async def test_one_hostile_object_of_each_kind_is_told_and_the_rest_decided(
    api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    collection, build, key, reader, namespace = KINDS[kind]
    wrap_for(monkeypatch, reader, is_hostile)
    api.create(NODES, gpu_node("n1"))
    api.create(POLICIES, remediation_policy())
    api.create(PODS, inference_pod("infer-0", health="Healthy"))
    good = build()
    if kind != "Node":
        api.create(NODES, gpu_node("n2"))
    api.create(collection, good)
    reported_kind = "Pod" if kind == "annotation" else kind
    before = unreadable(reported_kind)
    async with running(kube, dra=True) as run:
        controller = run.controller
        cache = controller.cache
        # A readable version first: the hostile one must replace it, not leave it standing.
        await asyncio.sleep(5)
        name = good["metadata"]["name"]
        path = f"{collection}/{name}"
        api.patch(path, {"metadata": make_hostile(kind, good)["metadata"]})
        reflector = next(r for r in cache.reflectors if r.kind == reported_kind)
        if kind != "RemediationPolicy":
            await until(lambda: key in reflector.invalid, "the hostile version to be seen")
        # Meanwhile an ordinary pod's GPU fails: it is acted on as if nothing else were there.
        api.patch(f"{PODS}/infer-0/status", {"status": inference_pod("infer-0")["status"]})
        await until(gone(api), "the ordinary faulty pod to be evicted")
        await until(lambda: told_about(api, name), "the Event on the hostile object")
        rounds = run.rounds
        await asyncio.sleep(30)
        assert run.rounds >= rounds + 20  # the loop goes on
        told = told_about(api, name)
        stale = dict(cache.pods.store) if kind in ("Pod", "annotation") else {}
        view = cache.view()
        now = controller.clock()
    assert len(evictions(api)) == 1
    assert [r["spec"]["target"]["name"] for r in records(api) if r["spec"]["action"] == "Deschedule"] == ["infer-0"]
    # Told once, on the object, saying what it is and that it is left out.
    [event] = told
    assert (event["type"], event["involvedObject"]["kind"], event["count"]) == ("Warning", reported_kind, 1)
    assert event["metadata"]["namespace"] == namespace
    assert "unexpected Hostile: division by zero deep inside the reader" in event["message"]
    assert "left out of every decision" in event["message"]
    assert unreadable(reported_kind) == before + 1
    assert controller.round_failures.count == 0
    if kind in ("Pod", "annotation"):
        # The pod is known to be on its node, and nothing else: its old device and labels are not kept.
        assert (stale[key].node, stale[key].devices, stale[key].labels) == ("n1", (), {})
    elif kind == "RemediationPolicy":
        [status] = [c for c in api.get(f"{POLICIES}/odd-policy")["status"]["conditions"] if c["type"] == "Valid"]
        assert (status["status"], status["reason"]) == ("False", "InvalidSpec")
        assert "unexpected Hostile" in status["message"]
    elif kind in ("Node", "NodeDevices"):
        # The node is neither failed nor clean, as with a silent agent: nothing lifted or ended on its word.
        assert view.unknown("n2", now)
        if kind == "NodeDevices":
            assert view.reports["n2"].devices == ()  # not its older copy's
        else:
            assert "n2" not in view.nodes
    elif kind == "Remediation":
        # Never its older copy (Succeeded): a record still at work, so its decision is not taken again and it holds
        # the budgets its action could, with nothing to carry on.
        kept = reflector.store[key]
        assert (kept.name, kept.phase, kept.resume, kept.active) == ("odd-record", Phase.PENDING, None, True)
    else:
        assert key not in reflector.store  # never its older copy


# ---- a round that raises -------------------------------------------------------------------------


async def test_a_round_that_raises_is_logged_counted_backed_off_and_tried_again(
    api: MemApi, kube: KubeClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    api.create(NODES, gpu_node("n1"))
    api.create(POLICIES, remediation_policy())
    api.create(REMEDIATIONS, remediation())
    before = round_failures()
    async with running(kube) as run:
        controller = run.controller
        real = controller.rounds.run

        def engine(*args: Any, **kwargs: Any) -> Any:
            if "odd-record" in controller.cache.remediations.store:
                raise Hostile("a bug the odd record trips in the engine")
            return real(*args, **kwargs)

        monkeypatch.setattr(controller.rounds, "run", engine)
        api.create(PODS, inference_pod("infer-0"))
        await until(lambda: round_failures() > before, "the first round that raises")
        timed = timed_rounds()
        await asyncio.sleep(60)
        assert timed_rounds() == timed, "a round that raised is not timed"
        failed = round_failures() - before
        # Backed off (1, 2, 4, 8, 15, 15... seconds), not one failure per tick; the loop is alive and not ready.
        assert 5 <= failed <= 9
        assert controller.round_failures.count == failed >= ROUND_FAILURES_UNREADY
        assert controller.heartbeat.check() is None
        assert "decision round failed" in (controller.round_failures.check() or "")
        assert "Hostile: a bug the odd record trips" in (controller.round_failures.check() or "")
        assert not evictions(api)
        api.delete(f"{REMEDIATIONS}/odd-record")
        await until(gone(api), "the faulty pod to be evicted once rounds succeed again")
        assert controller.round_failures.check() is None
        assert timed_rounds() > timed
        assert (REGISTRY.get_sample_value("devheal_round_seconds_max") or 0.0) > 0.0
    tracebacks = [r for r in caplog.records if r.getMessage().startswith("decision round failed") and r.exc_info]
    assert len(tracebacks) == 1  # the same error again is one line each, without its traceback


# ---- odd inputs found in the wild ------------------------------------------------------------------


def steps_overflow() -> tuple[str, Obj]:
    """A 400-digit p50 (it fits in the annotation's 512 characters) on a pod whose GPU failed too."""
    pod = inference_pod("odd-0", device="GPU-5")
    pod["metadata"]["annotations"] = {STEPS_ANNOTATION: '{"count":1,"window":1,"p50":' + "9" * 400 + ',"last":null}'}
    return PODS, pod


def year_one_record() -> tuple[str, Obj]:
    """A remediation in progress since year 1 (a valid date-time: its offset takes it before 0001-01-01 UTC)."""
    record = remediation()
    record["status"] = {"phase": "InProgress", "startedAt": "0001-01-01T00:00:00+23:59"}
    return REMEDIATIONS, record


def enter_after_only() -> tuple[str, Obj]:
    """A degradation policy with only enterAfter, above leaveAfter's default (no API server defaulting)."""
    policy = odd_policy()
    policy["spec"]["degradation"] = {"enterAfter": "45m"}
    return POLICIES, policy


@pytest.mark.parametrize("odd", [steps_overflow, year_one_record, enter_after_only])
async def test_odd_inputs_from_the_wild_do_not_stop_the_loop(
    api: MemApi, kube: KubeClient, odd: Callable[[], tuple[str, Obj]]
) -> None:
    collection, obj = odd()
    name = obj["metadata"]["name"]
    api.create(NODES, gpu_node("n1"))
    api.create(NODES, gpu_node("n2"))
    api.create(POLICIES, remediation_policy())
    api.create(collection, obj)
    async with running(kube) as run:
        controller = run.controller
        api.create(PODS, inference_pod("infer-0"))
        rounds = run.rounds
        await asyncio.sleep(60)
        assert run.rounds > rounds  # the loop goes round
        assert controller.heartbeat.check() is None
        if controller.round_failures.count:
            # A round the engine cannot finish because of this object: logged, counted, and /readyz says so.
            assert controller.round_failures.check() is not None
        else:
            # Read (and refused where a field is wrong), or told as unreadable: either way the rest is decided.
            assert not has_pod(api)
        unread = any(name in r.invalid for r in controller.cache.reflectors) or name in controller.cache.policy_errors
        if unread:
            await until(lambda: told_about(api, name), "the Event on the odd object")
