"""The controller's cluster view: reflectors for every input, projected small, indexed.

Indexes are kept on every change: node -> pods, (node, device id) -> pod, the pods detection and placement look
at (signalled, troubled, gated), gangs' members, and the nodes holding devheal's spare taint; so a round's
``view()`` costs nothing per node or pod, and a round told what changed costs what changed. A node's
``gap_since`` (allocatable GPUs below capacity since when) is carried across updates
here, because only the cache sees the transition. Any change sets ``changed``; the
controller's loop waits on it and reads a consistent ``view()``. Each reflector runs
supervised (``devheal.kube.supervision``): one that crashes lists afresh after a backoff.

An object of any kind that cannot be read (its projection raises, whatever the exception) is never
decided on from an older copy (``devheal.kube.informer``); what is safest differs by kind:

- a pod is kept only as what is sure of it, that it exists on its node (``pod_identity``: no device,
  no signal, so nothing is decided about it, and its node is not taken for empty);
- a node's ``NodeDevices`` becomes a report that says nothing (``report_unknown``, stale from the
  start): the node is neither failed nor clean, as with a silent agent, so no mark is lifted and no
  external remediation ended on its word;
- a node leaves the view (no finding, no action on it) and is *unknown* the same way, through such a
  report in ``view()``;
- a Remediation, a ResourceSlice or a DeviceTaintRule leaves the cache; a policy that cannot be parsed
  is left out of ``policies()`` (its Valid condition says why).
 Each distinct error of an unreadable object is logged once, counted in
``devheal_unreadable_objects_total`` and queued in ``unreadable`` for the leader's Warning Event
(``devheal.controller.bad_objects``).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from devheal.controller import metrics, pod_groups
from devheal.controller.dra_cache import DraCache
from devheal.controller.projections import (
    ProjectionError,
    project_node,
    project_node_devices,
    project_pod,
    project_remediation,
)
from devheal.engine import spares
from devheal.engine.workloads import classify
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.kube.informer import Reflector, Unreadable
from devheal.kube.supervision import Supervisor
from devheal.model import node_devices
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import ClusterView, Node, NodeDevicesReport, Pod, WorkloadClass
from devheal.model.gpu_resources import DEFAULT as DEFAULT_GPUS
from devheal.model.gpu_resources import GpuResources
from devheal.model.plan import InFlight, Phase, TargetKind
from devheal.model.pod_groups import POD_GROUP_API, POD_GROUP_KIND, POD_GROUPS, PodGroup
from devheal.model.policy import ActionKind, Policy, PolicyError, parse_policy

log = logging.getLogger(__name__)

POLICY_KIND = "RemediationPolicy"


def pod_identity(obj: Obj) -> Pod:
    """What is sure of a pod whose newest version cannot be read: that it exists, and where. No labels, device,
    container or condition (none of them can be trusted), so no finding, action or gang comes of it; it still
    occupies its node (placement and spares do not take the node for empty) and a drain still sees it."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise TypeError("metadata is not an object")  # not even its identity: the pod leaves the cache
    spec = obj.get("spec")
    status = obj.get("status")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    phase = status.get("phase") if isinstance(status, dict) else None
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    return Pod(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        node=node if isinstance(node, str) else "",
        phase=phase if phase in ("Pending", "Running", "Succeeded", "Failed") else "Unknown",
        labels={},
        restart_policy="Always",
        workload=classify(namespace, name, {}, None, "Always"),
        deleting=bool(meta.get("deletionTimestamp")),
    )


MAX_UNREPORTED = 10_000
"""The most unreadable objects waiting for their Event: outside input is never held unbounded."""


def report_unknown(obj: Obj) -> NodeDevicesReport:
    """A ``NodeDevices`` that cannot be read: a report of its node that says nothing, stale from the start."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise TypeError("metadata.name is not a string")  # whose report it is cannot be known either
    return NodeDevicesReport(node=meta["name"], devices=(), updated=0.0, uid=str(meta.get("uid") or ""))


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def record_unknown(obj: Obj, now: float) -> InFlight:
    """A Remediation that cannot be read, as a record still at work: it keeps its decision from being taken
    again (by its name) and holds every budget its action could (the kind its ``devheal.io/action`` label names,
    else the most disruptive), from ``now`` until a readable version arrives. Pending and with no decision to
    resume, no round carries it on or ends it, and retention never deletes it."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise TypeError("metadata.name is not a string")  # not even its name: it leaves the cache
    labels, spec = _object(meta.get("labels")), _object(obj.get("spec"))
    target = _object(spec.get("target"))
    action = next((k for k in ActionKind if k.value == labels.get("devheal.io/action")), ActionKind.REMEDIATE_NODE)
    target_kind = next((k for k in TargetKind if k.value == labels.get("devheal.io/target-kind")), TargetKind.NODE)
    node = _text(target.get("node"))
    name = _text(target.get("name")) or node
    return InFlight(
        meta["name"],
        action,
        target_kind,
        name,
        node,
        Phase.PENDING,
        now,
        policy=_text(spec.get("policy")),
    )


GC_THRESHOLDS = (50_000, 20, 100)
"""The cyclic garbage collector's thresholds in the controller's process (CPython's are 700, 10, 10)."""


def collect_garbage_less_often() -> None:
    """Run the cyclic garbage collector less often, for the whole process.

    Syncing a large cache decodes millions of short-lived containers (JSON, freed by reference
    counting, not by the collector); with CPython's thresholds every 700 of them start a
    collection, and the survivors of each page push full collections over the whole cache: about
    a third of the controller's CPU while it syncs 50,000 pods (``bench.controller_memory``). The
    controller makes little cyclic garbage; it is still collected, later.
    """
    gc.set_threshold(*GC_THRESHOLDS)


class ClusterCache:
    def __init__(
        self, client: KubeClient, clock: Any = time.time, *, dra: bool = False, gpu: GpuResources = DEFAULT_GPUS
    ) -> None:
        """``dra``: also watch ResourceSlices and devheal's DeviceTaintRules (``controller.dra_cache``); ``gpu``:
        the extended resources that are GPUs (``model.gpu_resources``)."""
        self.client = client
        self.clock = clock
        self.changed = asyncio.Event()
        self.pods_by_node: dict[str, frozenset[str]] = {}
        """Node -> the keys of its pods (never an empty set): a node's set is replaced, never changed, so a view
        shares it."""
        self.pod_by_device: dict[tuple[str, str], str] = {}
        self.signalled: set[str] = set()
        """Keys of the pods detection has to look at (``Pod.signalled``): a round walks these, not every pod."""
        self.gangs: dict[str, set[str]] = {}
        """Per gang (workload key), its active members' keys: step-time judging walks these, not every pod."""
        self.troubled: set[str] = set()
        """Keys of the pods that may give an infrastructure finding (``Pod.troubled``)."""
        self.gated: set[str] = set()
        """Keys of the active pods waiting at devheal's placement gate (``Pod.gated``): placement walks these."""
        self.spare_nodes: set[str] = set()
        """Names of the nodes holding devheal's spare taint (``engine.spares.reserved``)."""
        self.policy_errors: dict[str, str] = {}
        self.unreadable: dict[tuple[str, str], Unreadable] = {}
        """(kind, key) -> an unreadable object whose error is not yet reported by Event (the leader takes them)."""
        self._policies_reported: dict[str, str] = {}
        """Policy name -> the parse error last reported for it."""
        self.nodes: Reflector[Node] = Reflector(
            client, api_path("v1", "nodes"), functools.partial(project_node, gpu=gpu), [self._on_node], kind="Node"
        )
        self.pods: Reflector[Pod] = Reflector(
            client,
            api_path("v1", "pods"),
            functools.partial(project_pod, gpu=gpu),
            [self._on_pod],
            kind="Pod",
            fallback=pod_identity,
        )
        self.reports: Reflector[NodeDevicesReport] = Reflector(
            client,
            api_path(GROUP_VERSION, node_devices.PLURAL),
            project_node_devices,
            [self._on_any],
            kind=node_devices.KIND,
            fallback=report_unknown,
        )
        self.policy_objects: Reflector[dict[str, Any]] = Reflector(
            client, api_path(GROUP_VERSION, "remediationpolicies"), lambda o: o, [self._on_any], kind=POLICY_KIND
        )
        self.remediations: Reflector[InFlight] = Reflector(
            client,
            api_path(GROUP_VERSION, "remediations"),
            project_remediation,
            [self._on_any],
            kind="Remediation",
            fallback=lambda obj: record_unknown(obj, self.clock()),
        )
        self.pod_groups: Reflector[PodGroup] = Reflector(
            client,
            api_path(POD_GROUP_API, POD_GROUPS),
            pod_groups.project_pod_group,
            [self._on_any],
            kind=POD_GROUP_KIND,
        )
        """Kubernetes' PodGroups, watched only where the API server serves them (``_watch_pod_groups``)."""
        self.reflectors: list[Reflector[Any]] = [
            self.nodes,
            self.pods,
            self.reports,
            self.policy_objects,
            self.remediations,
            self.pod_groups,
        ]
        self.dra = DraCache(client, self.changed.set) if dra else None
        if self.dra is not None:
            self.reflectors += self.dra.reflectors
        for reflector in self.reflectors:
            reflector.expected = (ProjectionError,)
            reflector.on_invalid.append(self._on_unreadable)
        self.loops = Supervisor("cache")
        """The reflectors' loops: ``loops.problems()`` names one that is down."""

    # ---- handlers ----------------------------------------------------------------------------

    def _on_any(self, key: str, old: object, new: object) -> None:
        self.changed.set()

    def _on_unreadable(self, item: Unreadable) -> None:
        """Once per distinct error of an unreadable object: counted, and queued for the leader's Event."""
        metrics.UNREADABLE_OBJECTS.labels(kind=item.kind).inc()
        if len(self.unreadable) < MAX_UNREPORTED:
            self.unreadable[(item.kind, item.key)] = item
        self.changed.set()

    def _on_node(self, key: str, old: Node | None, new: Node | None) -> None:
        if new is not None and spares.reserved(new):
            self.spare_nodes.add(key)
        else:
            self.spare_nodes.discard(key)
        if new is not None:
            gap_since: float | None = None
            if new.gpu_gap > 0:
                gap_since = old.gap_since if old is not None and old.gap_since is not None else self.clock()
            # No GPU allocatable (a device plugin gone): since when, for devicePluginDownAfter.
            no_gpus_since: float | None = None
            if new.gpu_allocatable == 0:
                no_gpus_since = old.no_gpus_since if old is not None and old.no_gpus_since is not None else self.clock()
            if gap_since != new.gap_since or no_gpus_since != new.no_gpus_since:
                # The store holds the projection; carry the transition times into it.
                self.nodes.store[key] = replace(new, gap_since=gap_since, no_gpus_since=no_gpus_since)
        self.changed.set()

    def _on_pod(self, key: str, old: Pod | None, new: Pod | None) -> None:
        if old is not None and old.workload.cls is WorkloadClass.GANG:
            members = self.gangs.get(old.workload.key)
            if members is not None:
                members.discard(key)
                if not members:
                    del self.gangs[old.workload.key]
        if new is not None and new.active and new.workload.cls is WorkloadClass.GANG:
            self.gangs.setdefault(new.workload.key, set()).add(key)
        if new is not None and new.signalled:
            self.signalled.add(key)
        else:
            self.signalled.discard(key)
        if new is not None and new.troubled:
            self.troubled.add(key)
        else:
            self.troubled.discard(key)
        if new is not None and new.gated and new.active:
            self.gated.add(key)
        else:
            self.gated.discard(key)
        old_node = old.node if old is not None else ""
        new_node = new.node if new is not None else ""
        if old_node != new_node:
            self._leaves(old_node, key)
            self._arrives(new_node, key)
        if old is not None:
            for dev in old.devices:
                if self.pod_by_device.get((old.node, dev.device_id)) == key:
                    del self.pod_by_device[(old.node, dev.device_id)]
        if new is not None and new.node and new.active:
            for dev in new.devices:
                self.pod_by_device[(new.node, dev.device_id)] = key
        self.changed.set()

    def _leaves(self, node: str, key: str) -> None:
        keys = self.pods_by_node.get(node)
        if keys is not None and key in keys:
            if len(keys) == 1:
                del self.pods_by_node[node]
            else:
                self.pods_by_node[node] = keys - {key}

    def _arrives(self, node: str, key: str) -> None:
        if node:
            self.pods_by_node[node] = self.pods_by_node.get(node, frozenset()) | {key}

    # ---- reading -----------------------------------------------------------------------------

    def view(self) -> ClusterView:
        """The cache as a round reads it: its stores and indexes themselves, not copies (a round runs between two
        events, and reads only); the small pod indexes are copied."""
        reports: Mapping[str, NodeDevicesReport] = self.reports.store
        if self.nodes.invalid:
            # A node that cannot be read is unknown: neither failed nor clean (``report_unknown``).
            unknown = {key: NodeDevicesReport(node=key, devices=(), updated=0.0) for key in self.nodes.invalid}
            reports = ChainMap(unknown, self.reports.store)
        return ClusterView(
            nodes=self.nodes.store,
            pods=self.pods.store,
            reports=reports,
            pods_by_node=self.pods_by_node,
            pod_by_device=self.pod_by_device,
            signalled=frozenset(self.signalled),
            gangs=self.gangs,
            troubled=frozenset(self.troubled),
            gated=frozenset(self.gated),
            spare_nodes=frozenset(self.spare_nodes),
            dra_devices=self.dra.devices if self.dra is not None else {},
            quarantined=self.dra.quarantined if self.dra is not None else {},
            pod_groups=self.pod_groups.store,
        )

    def policies(self) -> list[Policy]:
        """Valid policies sorted by name; invalid ones are left out and noted in ``policy_errors`` (their Valid
        condition says why), and each invalid version is reported once like any unreadable object."""
        parsed = []
        errors: dict[str, str] = {}
        for name, obj in sorted(self.policy_objects.store.items()):
            try:
                parsed.append(parse_policy(obj))
            except Exception as exc:  # whatever the parser raises, this policy alone is out
                errors[name] = str(exc) if isinstance(exc, PolicyError) else f"unexpected {type(exc).__name__}: {exc}"
                self._policy_unreadable(name, obj, errors[name], exc)
        self.policy_errors = errors
        self._policies_reported = {n: v for n, v in self._policies_reported.items() if n in errors}
        return parsed

    def _policy_unreadable(self, name: str, obj: dict[str, Any], error: str, exc: Exception) -> None:
        message = f"{POLICY_KIND} {name} cannot be read ({error[:1000]}); it is left out of every decision"
        if self._policies_reported.get(name) == message:
            return  # once per distinct error (the Valid condition, written meanwhile, makes a new version)
        self._policies_reported[name] = message
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        version = str(meta.get("resourceVersion") or "")
        log.warning("%s (resourceVersion %s)", message, version or "?", exc_info=not isinstance(exc, PolicyError))
        uid = str(meta.get("uid") or "")
        self._on_unreadable(Unreadable(POLICY_KIND, name, name, "", uid, version, GROUP_VERSION, message))

    def still_unreadable(self, item: Unreadable) -> bool:
        """Whether the object still cannot be read for the reason ``item`` gives (not fixed or deleted since)."""
        if item.kind == POLICY_KIND:
            return self._policies_reported.get(item.key) == item.message
        current = next((r.invalid.get(item.key) for r in self.reflectors if r.kind == item.kind), None)
        return current is not None and current.message == item.message

    def in_flight(self) -> list[InFlight]:
        return list(self.remediations.store.values())

    def sizes(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes.store),
            "pods": len(self.pods.store),
            "nodedevices": len(self.reports.store),
            "policies": len(self.policy_objects.store),
            "remediations": len(self.remediations.store),
        }

    async def run(self) -> None:
        """Run every reflector, each supervised: one that crashes is started again (it lists afresh)."""
        async with self.loops:
            for reflector in self.reflectors:
                run = self._watch_pod_groups if reflector is self.pod_groups else reflector.run
                self.loops.start(f"reflector {reflector.path}", run)
            await self.loops.wait()

    async def _watch_pod_groups(self) -> None:
        """Watch PodGroups where the API server serves them; elsewhere (an older cluster, the Workload API off)
        there are none to list: synced at once, and gangs are found by their labels and owners alone."""
        if not await pod_groups.served(self.client):
            log.info("the API server serves no %s %s: gangs come from labels and owners", POD_GROUP_API, POD_GROUPS)
            self.pod_groups.synced.set()
            return
        await self.pod_groups.run()

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def readiness(self) -> str | None:
        """A readiness check: every reflector listed once, none down (None), else what is missing."""
        waiting = [r.path for r in self.reflectors if not r.synced.is_set()]
        problems = ([f"not synced yet: {', '.join(waiting)}"] if waiting else []) + self.loops.problems()
        return "; ".join(problems) if problems else None

    async def wait_synced(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
