"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.

Two replicas must never act at once, whatever their wall clocks say. So no replica
compares the holder's ``renewTime`` with its own wall clock; each judges the lease by
its local monotonic clock (the event loop's):

- A candidate remembers the lease as it last saw it (holder, ``renewTime``,
  ``leaseTransitions``, resourceVersion) and when, on its monotonic clock, that last
  changed. The lease has expired once it has not changed for ``leaseDurationSeconds``
  since; only then may the candidate take it over. Updates carry the resourceVersion,
  so two candidates can never both win.
- The leader renews every ``retry_period``. A renew that fails (an error, a Conflict, no
  answer) does not end leadership: the leader keeps leading and tries again, until
  ``renew_deadline`` has passed since its last successful renew (timed from when that
  renew was sent, so never later than the moment the server stored it). Then it stops
  acting (``on_change(False)``) at once, even while a request is still hanging.
- ``renew_deadline < lease_duration``: the deposed leader stops at least
  ``lease_duration - renew_deadline`` seconds before any candidate can see the lease
  expire, since a candidate's expiry clock starts no earlier than the server stored
  that renew.

A leader that finds another holder in the lease stops at once. A graceful ``release``
stops acting first, then empties the holder, so another replica takes over at its next
try instead of waiting for the lease to expire.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.model.times import format_time

log = logging.getLogger(__name__)

Observed = tuple[str, str, int, str]
"""What a candidate compares between reads: (holderIdentity, renewTime, leaseTransitions, resourceVersion)."""


def _micro(moment: datetime.datetime) -> str:
    """A Lease's ``MicroTime``."""
    return format_time(moment.timestamp(), micro=True)


def _observed(lease: Obj) -> Observed:
    spec = lease.get("spec") or {}
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        int(spec.get("leaseTransitions") or 0),
        str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def _monotonic() -> float:
    return asyncio.get_running_loop().time()


@dataclass
class LeaderElector:
    client: KubeClient
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    """Seconds a candidate waits, after it last saw the lease change, before taking it over."""
    renew_deadline: float = 10.0
    """Seconds after its last successful renew at which a leader stops acting; below ``lease_duration``."""
    retry_period: float = 2.0
    """Seconds between tries (renews of a leader, take-over attempts of a candidate)."""
    on_change: Callable[[bool], None] = lambda leading: None
    leading: bool = False
    now: Callable[[], datetime.datetime] = field(default=lambda: datetime.datetime.now(datetime.UTC))
    """The wall clock, only for the lease's informational ``acquireTime`` and ``renewTime``."""
    _observed: Observed | None = field(default=None, init=False, repr=False)
    _observed_at: float = field(default=0.0, init=False, repr=False)
    """Monotonic time at which the lease was last seen to change."""
    _renewed_at: float = field(default=0.0, init=False, repr=False)
    """Monotonic time at which the last successful write of the lease was sent."""
    _deadline: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"retry period {self.retry_period:g}s, renew deadline {self.renew_deadline:g}s, "
                f"lease duration {self.lease_duration:g}s: a leader must stop acting before its lease "
                "can expire for the other replicas, and must be able to retry a renew before it stops"
            )

    @property
    def path(self) -> str:
        return api_path("coordination.k8s.io/v1", "leases", namespace=self.namespace, name=self.name)

    def _spec(self, acquire: str, transitions: int) -> Obj:
        return {
            "holderIdentity": self.identity,
            # Rounded up: a candidate must never wait less than this leader's renew deadline.
            "leaseDurationSeconds": math.ceil(self.lease_duration),
            "acquireTime": acquire,
            "renewTime": _micro(self.now()),
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: Obj) -> None:
        seen = _observed(lease)
        if seen != self._observed:
            self._observed = seen
            self._observed_at = _monotonic()

    def _expired(self, lease: Obj) -> bool:
        """Whether the lease has not changed for its duration, on this replica's monotonic clock."""
        duration = float((lease.get("spec") or {}).get("leaseDurationSeconds") or self.lease_duration)
        return _monotonic() - self._observed_at > duration

    async def try_acquire_or_renew(self) -> bool:
        """One try: True when this replica now holds the lease (created, renewed or taken over).

        False when another replica holds a lease that has not expired (a leader then stops at
        once) or when the write lost a race (Conflict, AlreadyExists)."""
        try:
            lease = await self.client.get(self.path)
        except errors.NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(_micro(self.now()), 0),
            }
            sent = _monotonic()
            try:
                created = await self.client.create(
                    api_path("coordination.k8s.io/v1", "leases", namespace=self.namespace), body
                )
            except errors.AlreadyExists:
                return False
            self._written(created, sent)
            return True
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity:
            self._set(False)  # whoever holds it now may be acting: stop before anything else
            if not self._expired(lease):
                return False
        ours = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        acquire = spec.get("acquireTime") if ours else _micro(self.now())
        lease["spec"] = {**spec, **self._spec(str(acquire), transitions)}
        sent = _monotonic()
        try:
            written = await self.client.replace(self.path, lease)  # carries resourceVersion: one winner
        except errors.Conflict:
            return False
        self._written(written, sent)
        return True

    def _written(self, lease: Obj, sent: float) -> None:
        """Our write was stored: the server stored it no earlier than ``sent``."""
        self._observed = _observed(lease)
        self._observed_at = sent
        self._renewed_at = sent

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

    def _arm_deadline(self) -> None:
        """Stop leading once ``renew_deadline`` has passed since the last successful renew."""
        self._disarm_deadline()
        self._deadline = asyncio.get_running_loop().call_at(self._renewed_at + self.renew_deadline, self._deadline_hit)

    def _disarm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_hit(self) -> None:
        self._deadline = None
        if self.leading:
            log.warning(
                "lease %s/%s not renewed for %gs (renew deadline): stepping down",
                self.namespace,
                self.name,
                self.renew_deadline,
            )
            self._set(False)

    async def run(self) -> None:
        """Try every ``retry_period`` until cancelled; when it ends, this replica no longer leads."""
        try:
            while True:
                started = _monotonic()
                # A leader's try may last until its deadline; a candidate's, one renew deadline.
                limit = self._renewed_at + self.renew_deadline - started if self.leading else self.renew_deadline
                try:
                    ok = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(limit, 0.0))
                except (errors.KubeError, TimeoutError) as exc:
                    # No answer: a leader keeps leading until its renew deadline (the timer ends it).
                    log.warning("lease %s/%s: %s", self.namespace, self.name, exc or type(exc).__name__)
                else:
                    if ok and _monotonic() < self._renewed_at + self.renew_deadline:
                        self._arm_deadline()
                        self._set(True)
                    # Not ok: lost a race or another holder (which already stopped us); a Conflict on
                    # our own renew leaves us leading until the deadline, as any failed renew does.
                await asyncio.sleep(self.retry_period)
        finally:
            # Nobody renews any more: this replica must not act on (release hands the lease over).
            self._disarm_deadline()
            self._set(False)

    async def release(self) -> None:
        """On graceful shutdown: stop acting, then let another replica take over at once."""
        self._disarm_deadline()
        self._set(False)
        try:
            lease = await self.client.get(self.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") == self.identity:
                spec["holderIdentity"] = ""
                spec["renewTime"] = _micro(self.now())
                lease["spec"] = spec
                await self.client.replace(self.path, lease)  # only the version we read: never another's
        except errors.NotFound:
            pass
        except errors.KubeError as exc:
            log.warning("could not release lease: %s", exc)
