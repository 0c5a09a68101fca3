"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.

The holder renews ``renewTime`` every ``retry_period``; a candidate takes the lease over
when the holder has not renewed it for ``lease_duration``. Updates carry the lease's
resourceVersion, so two candidates can never both win. A leader that cannot renew
within ``renew_deadline`` gives up leadership (stops acting) and becomes a candidate.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.times import format_time, parse_time

log = logging.getLogger(__name__)


def _micro(moment: datetime.datetime) -> str:
    """A Lease's ``MicroTime``."""
    return format_time(moment.timestamp(), micro=True)


@dataclass
class LeaderElector:
    client: KubeClient
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    on_change: Callable[[bool], None] = lambda leading: None
    leading: bool = False
    _last_renew: float = 0.0
    now: Callable[[], datetime.datetime] = field(default=lambda: datetime.datetime.now(datetime.UTC))

    @property
    def path(self) -> str:
        return api_path("coordination.k8s.io/v1", "leases", namespace=self.namespace, name=self.name)

    def _spec(self, acquire: str, transitions: int) -> Obj:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": acquire,
            "renewTime": _micro(self.now()),
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease = await self.client.get(self.path)
        except errors.NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(_micro(self.now()), 0),
            }
            try:
                await self.client.create(api_path("coordination.k8s.io/v1", "leases", namespace=self.namespace), body)
                return True
            except errors.AlreadyExists:
                return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        expired = renewed is None or self.now().timestamp() - renewed > duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.identity else _micro(self.now())
        lease["spec"] = self._spec(str(acquire), transitions)
        try:
            await self.client.replace(self.path, lease)  # carries resourceVersion: one winner
        except errors.Conflict:
            return False
        return True

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info(
                "%s %s leadership of lease %s/%s",
                self.identity,
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
            )
            self.on_change(leading)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=self.renew_deadline)
            except (errors.KubeError, TimeoutError) as exc:
                # The API server did not answer: a leader keeps leading until its renew deadline.
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                if loop.time() - self._last_renew > self.renew_deadline:
                    self._set(False)
            else:
                if ok:
                    self._last_renew = loop.time()
                self._set(ok)
            await asyncio.sleep(self.retry_period)

    async def release(self) -> None:
        """On graceful shutdown: let another replica take over at once."""
        if not self.leading:
            return
        try:
            lease = await self.client.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["renewTime"] = _micro(self.now() - datetime.timedelta(seconds=3600))
                await self.client.replace(self.path, lease)
        except errors.KubeError as exc:
            log.warning("could not release lease: %s", exc)
        self._set(False)
