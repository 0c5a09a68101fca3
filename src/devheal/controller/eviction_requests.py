"""Cooperative eviction (KEP-4563, gate ``EvictionRequestAPI``, alpha in 1.37): a pod that names eviction
responders is asked to go through an ``EvictionRequest``, and its responders are given a bounded time.

A pod names its responders in ``spec.evictionResponders`` (``[{name, priority}]``, set at its
creation): a training job's own controller, say, that checkpoints before it lets the pod go.
The API server serves ``EvictionRequest`` in ``lifecycle.k8s.io/v1alpha1`` where the gate and
that API version are on (``served``, asked once). devheal then, instead of calling the
Eviction API at once (``Deschedule``):

1. creates ``EvictionRequest`` ``devheal-<pod UID>`` in the pod's namespace, requester
   ``devheal.io/controller``, intent ``Eviction``, target the pod by name and UID;
2. waits, pass by pass, until the pod is terminating or gone (its responder let it go), the
   request says ``TargetEvicted``, or ``RESPONDER_WAIT`` has passed since the request was
   created, or the request says ``Failed`` (no responder managed it);
3. in the last two cases evicts the pod through the Eviction API as it would have at once.

The request is deleted once the pod is terminating (deleting one is a withdrawal; the pod is
going anyway). The Remediation's steps say which way was used (``eviction-request`` then
``evicted-by-responder``, or ``evict``).

Found on kube-apiserver and kube-controller-manager v1.37.2 (docs/lab.md): the API is
served, but no evictionrequest-controller ships with 1.37.2, so nothing turns an
``EvictionRequest`` into an ``Eviction`` and no responder is ever made ``Active``. A
responder that watches ``EvictionRequest`` objects itself (as the lab test's does) is
answered; on a stock 1.37.2 cluster the wait ends at ``RESPONDER_WAIT`` and the pod is
evicted as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.times import parse_time

LIFECYCLE_API = "lifecycle.k8s.io/v1alpha1"
EVICTION_REQUESTS = "evictionrequests"
REQUESTER = "devheal.io/controller"
MANAGED_BY = "app.kubernetes.io/managed-by"
RESPONDER_WAIT = 300.0
"""Seconds the pod's responders get, from the request's creation, before devheal evicts it itself."""


def responders(pod: Obj) -> list[str]:
    """The names in the pod's ``spec.evictionResponders``, highest priority first."""
    named = [
        (r["priority"] if isinstance(r.get("priority"), int) else 0, str(r["name"]))
        for r in (pod.get("spec") or {}).get("evictionResponders") or []
        if isinstance(r, dict) and r.get("name")
    ]
    return [name for _, name in sorted(named, key=lambda r: -r[0])]


def request_name(uid: str) -> str:
    return f"devheal-{uid}"


def eviction_request(namespace: str, name: str, uid: str) -> Obj:
    return {
        "apiVersion": LIFECYCLE_API,
        "kind": "EvictionRequest",
        "metadata": {"name": request_name(uid), "namespace": namespace, "labels": {MANAGED_BY: "devheal"}},
        "spec": {"target": {"pod": {"name": name, "uid": uid}}, "requester": REQUESTER, "intent": "Eviction"},
    }


def condition(request: Obj, kind: str) -> bool:
    return any(
        isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
        for c in (request.get("status") or {}).get("conditions") or []
    )


class EvictionRequests:
    """Asks pods' responders through ``EvictionRequest`` objects, where the API server serves them."""

    def __init__(self, client: KubeClient, clock: Callable[[], float]) -> None:
        self.client = client
        self.clock = clock
        self._served: bool | None = None

    async def served(self) -> bool:
        """Whether the API server serves ``evictionrequests`` (asked once; an error counts as no)."""
        if self._served is None:
            try:
                found = await self.client.get(f"/apis/{LIFECYCLE_API}")
                self._served = any(r.get("name") == EVICTION_REQUESTS for r in found.get("resources") or [])
            except errors.KubeError:
                self._served = False
        return self._served

    def path(self, namespace: str, uid: str | None = None) -> str:
        return api_path(LIFECYCLE_API, EVICTION_REQUESTS, namespace=namespace, name=request_name(uid) if uid else None)

    async def current(self, namespace: str, uid: str) -> Obj | None:
        try:
            return await self.client.get(self.path(namespace, uid))
        except errors.NotFound:
            return None

    async def ask(self, namespace: str, name: str, uid: str) -> Obj:
        """Create the request (an existing one of devheal's for this pod is kept: asked before)."""
        try:
            return await self.client.create(self.path(namespace), eviction_request(namespace, name, uid))
        except errors.AlreadyExists:
            return await self.client.get(self.path(namespace, uid))

    def waited(self, request: Obj) -> float:
        """Seconds since the request was created (0 when its creation time cannot be read)."""
        created = parse_time((request.get("metadata") or {}).get("creationTimestamp"))
        return 0.0 if created is None else max(0.0, self.clock() - created)

    async def withdraw(self, namespace: str, uid: str) -> None:
        """Delete the request (a withdrawal): the pod is going, or devheal evicts it itself now."""
        with contextlib.suppress(errors.NotFound):
            await self.client.delete(self.path(namespace, uid))
