"""The controller's local copies of its decisions, while the watch has not caught up with their records.

A decision that a rail once blocked has a Blocked record; when a later round acts on it, the watch still
holds the Blocked copy until the record's new status arrives. Until then the round must see the action
under way (it counts against the gang budget, the concurrency budget, the workload interval and the node
budgets), not the Blocked record: otherwise each round in between may take another gang restart or another
node. Found by the watch-lag property test (tests/unit/engine/test_rails_under_watch_lag.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from devheal.kube.client import KubeClient
from devheal.model.plan import Action, Finding, FindingKind, FindingSource, Phase, TargetKind
from devheal.model.policy import ActionKind
from tests.shell.fixtures import unix_clock
from tests.shell.memapi import MemApi
from tests.shell.waiting import until
from tests.unit.shell.controller.test_loop import REMEDIATIONS, running
from tests.unit.shell.controller.test_records import add_record

virtual_time = pytest.mark.asyncio(loop_scope="function")


@virtual_time
async def test_a_blocked_record_acted_on_reads_under_way_until_its_new_status_arrives(
    api: MemApi, kube: KubeClient
) -> None:
    name = "taint-n1-5"
    add_record(api, name, "Blocked", unix_clock() - 60)
    async with running(kube) as run:
        controller = run.controller
        await until(lambda: name in controller.cache.remediations.store, "the Blocked record in the cache")
        blocked = controller.cache.remediations.store[name]
        assert blocked.phase is Phase.BLOCKED
        # A round acted on it (``start`` keeps a local copy); the watch has not delivered the new status yet.
        controller._local[name] = replace(blocked, phase=Phase.IN_PROGRESS)
        current = controller.in_flight(controller.cache.view())
        assert current.get(name) is not None and current.get(name).phase is Phase.IN_PROGRESS  # type: ignore[union-attr]
        assert [r.phase for r in current if r.name == name] == [Phase.IN_PROGRESS]
        # The new status arrives: the watch's copy is current again, the local copy goes.
        api.patch(f"{REMEDIATIONS}/{name}/status", {"status": {"phase": "InProgress"}})
        await until(
            lambda: controller.cache.remediations.store[name].phase is Phase.IN_PROGRESS, "the new status in the cache"
        )
        current = controller.in_flight(controller.cache.view())
        assert name not in controller._local
        assert [r.phase for r in current if r.name == name] == [Phase.IN_PROGRESS]


@virtual_time
async def test_a_round_reads_its_records_once_and_again_after_each_of_its_decisions(
    api: MemApi, kube: KubeClient
) -> None:
    add_record(api, "notify-n1-3", "InProgress", unix_clock() - 60)
    async with running(kube) as run:
        controller = run.controller
        await until(lambda: "notify-n1-3" in controller.cache.remediations.store, "the record in the cache")
        view = controller.cache.view()
        finding = Finding(FindingKind.NODE_DEVICES_FAILED, "n1", (FindingSource.NODE_CAPACITY,), "gone", unix_clock())
        decision = Action(ActionKind.NOTIFY, TargetKind.NODE, "n1", "n1", finding, "p", epoch=4)
        controller._in_round = True  # (as ``reconcile_once`` runs a round; nothing awaits within one)
        try:
            first = controller.in_flight(view)
            assert controller.in_flight(view) is first  # built once while nothing changed
            controller.start(decision, resumed=False)
            after = controller.in_flight(view)
            assert after is not first and after.get(decision.name) is not None
            assert [r.phase for r in after if r.name == decision.name] == [Phase.IN_PROGRESS]
        finally:
            controller._in_round = False
            controller._round_records = None
        # Outside a round every call reads the records as they are.
        controller._local.pop(decision.name, None)
        assert controller.in_flight(view).get(decision.name) is None
