"""Which pod holds which device, from the kubelet's pod-resources v1 API on its unix socket.

``List`` gives every pod's devices (every few seconds, and at once when a device's
health changes), ``GetAllocatableResources``
which devices the kubelet can hand out and under which resource name (refreshed less
often), and ``Get`` confirms one pod at once when one of its devices changes health,
so a NodeDevices report never names a pod that has just gone. Device ids are matched
to the telemetry's GPU UUIDs (the NVIDIA device plugin uses the UUID as device id).

When the socket is missing or the kubelet does not answer, the map keeps its last
known content, reports itself unavailable (the condition says why) and retries with
exponential backoff; the agent keeps publishing device health without pods meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from devheal.agent.status import Availability, PodRef
from devheal.kubelet.podresources import PodResourcesClient, PodResourcesError

log = logging.getLogger("devheal.agent.podmap")


class PodMap:
    """The device -> pod map of one node, kept fresh from its kubelet's pod-resources socket."""

    def __init__(
        self,
        socket_path: Path,
        *,
        timeout: float = 2.0,
        list_every: float = 5.0,
        allocatable_every: float = 30.0,
        min_backoff: float = 1.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.socket_path = Path(socket_path)
        self._timeout = timeout
        self._list_every = list_every
        self._listed_at = float("-inf")
        self._allocatable_every = allocatable_every
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._client: PodResourcesClient | None = None
        self.holders: dict[str, PodRef] = {}
        self.resources: dict[str, str] = {}
        self.allocatable: frozenset[str] = frozenset()
        self._allocatable_at = float("-inf")
        self._retry_at = float("-inf")
        self._backoff = min_backoff
        self.availability = Availability(False, "Starting", f"pod-resources API at {self.socket_path} not read yet")

    async def __aenter__(self) -> PodMap:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _open(self) -> PodResourcesClient:
        if self._client is None:
            self._client = await PodResourcesClient(self.socket_path, timeout=self._timeout).__aenter__()
        return self._client

    async def refresh(self, now: float, *, force: bool = False) -> bool:
        """List the pods again when due (``force``: now, unless backing off); returns whether holders changed."""
        if now < self._retry_at or (not force and now - self._listed_at < self._list_every):
            return False
        try:
            client = await self._open()
            pods = await client.list_pods()
            if now - self._allocatable_at >= self._allocatable_every or not self.allocatable:
                allocatable = await client.allocatable()
                self.allocatable = frozenset(i for d in allocatable for i in d.device_ids)
                for devices in allocatable:
                    for device_id in devices.device_ids:
                        self.resources[device_id] = devices.resource_name
                self._allocatable_at = now
        except PodResourcesError as exc:
            self._failed(now, str(exc))
            return False
        holders: dict[str, PodRef] = {}
        for pod in pods:
            for container in pod.containers:
                for devices in container.devices:
                    for device_id in devices.device_ids:
                        holders[device_id] = PodRef(pod.namespace, pod.name, container.name)
                        self.resources[device_id] = devices.resource_name
        if not self.availability.ok:
            log.info("pod-resources API at %s answers", self.socket_path)
        self.availability = Availability(
            True, "Listing", f"pod-resources API at {self.socket_path}: {len(pods)} pods", since=now
        )
        if self.availability.ok and self._backoff != self._min_backoff:
            self._backoff = self._min_backoff
        self._retry_at = float("-inf")
        self._listed_at = now
        changed = holders != self.holders
        self.holders = holders
        return changed

    async def update_for(self, device_ids: set[str], now: float) -> None:
        """Make the holders of ``device_ids`` current, now: their health changed and is about to be published.

        A device with a known holder is confirmed with ``Get`` on that one pod; a device
        without one, or one whose holder no longer has it, needs a fresh ``List``.
        """
        if not self.availability.ok:
            await self.refresh(now, force=True)
            return
        unknown = {d for d in device_ids if d not in self.holders}
        for ref in {self.holders[d] for d in device_ids if d in self.holders}:
            try:
                client = await self._open()
                pod = await client.get_pod(ref.namespace, ref.name)
            except PodResourcesError as exc:
                self._failed(now, str(exc))
                return
            held = set() if pod is None else {i for c in pod.containers for d in c.devices for i in d.device_ids}
            for device_id, holder in list(self.holders.items()):
                if holder == ref and device_id not in held:
                    del self.holders[device_id]
                    unknown.add(device_id)
        if unknown:
            await self.refresh(now, force=True)

    def _failed(self, now: float, message: str) -> None:
        if self.availability.ok or self.availability.reason == "Starting":
            log.warning("%s; retrying with backoff, device health is published without pods meanwhile", message)
        since = self.availability.since if not self.availability.ok and self.availability.since else now
        self.availability = Availability(False, "PodResourcesUnavailable", message, since=since)
        self._retry_at = now + self._backoff
        self._backoff = min(self._max_backoff, self._backoff * 2)

    def snapshot(self) -> tuple[Mapping[str, PodRef], Mapping[str, str]]:
        return dict(self.holders), dict(self.resources)
