"""Node agents' claims the cluster contradicts, surfaced once each.

The engine ignores a pod a node's ``NodeDevices`` names for a device the cluster does not
place with that pod (``devheal.engine.findings.report_mismatches``): one node's agent
must not get pods on other nodes evicted. It ignores too a failed DRA device that a
node's report or a pod's status names but that no ResourceSlice publishes on that node
(``devheal.engine.dra.rejected_claims``): one node must not quarantine another's devices.
Each such claim is surfaced once while it lasts, not every round: a Warning Event on the
object that makes it (the ``NodeDevices``, or the pod), a log line, and
``devheal_agent_reports_rejected_total{node,reason}``. A claim that goes away and comes
back is surfaced again.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from devheal.controller import metrics
from devheal.controller.events import EventRecorder
from devheal.engine.dra import RejectedDeviceClaim, rejected_claims
from devheal.engine.findings import ReportMismatch, report_mismatches
from devheal.model import node_devices
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import ClusterView

log = logging.getLogger("devheal.controller.agent_reports")

REJECTED_EVENT = "DevhealReportRejected"
"""The Event reason on a NodeDevices object one of whose claims was ignored."""


Rejected = ReportMismatch | RejectedDeviceClaim


class ReportAudit:
    """Remembers the claims already surfaced; ``check`` returns the Event writes for new ones."""

    def __init__(self, events: EventRecorder) -> None:
        self.events = events
        self.surfaced: set[tuple[str, str, str, str]] = set()

    def check(self, view: ClusterView, now: float) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """(work-queue key, Event write) for each rejected claim not surfaced yet; counts and logs them."""
        current: list[Rejected] = [*report_mismatches(view, now), *rejected_claims(view, now)]
        out: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        for mismatch in current:
            if mismatch.key in self.surfaced:
                continue
            log.warning("%s (%s)", mismatch.message, mismatch.reason)
            metrics.AGENT_REPORTS_REJECTED.labels(node=mismatch.node, reason=mismatch.reason.value).inc()
            out.append(("report-rejected/" + "/".join(mismatch.key), functools.partial(self._event, mismatch)))
        self.surfaced = {m.key for m in current}
        return out

    async def _event(self, mismatch: Rejected) -> None:
        if isinstance(mismatch, RejectedDeviceClaim) and mismatch.source_kind == "Pod":
            namespace, _, name = mismatch.source.partition("/")
            involved = {
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": mismatch.source_uid,
                "apiVersion": "v1",
            }
        else:
            uid = mismatch.report_uid if isinstance(mismatch, ReportMismatch) else mismatch.source_uid
            involved = {"kind": node_devices.KIND, "name": mismatch.node, "uid": uid, "apiVersion": GROUP_VERSION}
        await self.events.record(involved, REJECTED_EVENT, mismatch.message, "Warning")
