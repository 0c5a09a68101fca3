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
from devheal.model.plan import Phase
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
