"""Shared GPUs on a simulated node: time-slicing replicas and MIG instances, as the NVIDIA device plugin shows them.

A node reconfigured for sharing (``faults.share`` / ``faults.mig``, as the GPU operator's MIG
manager or a time-slicing config would) advertises slots instead of whole GPUs:

- **time-slicing** (or MPS): ``nvidia.com/gpu`` with ``replicas`` slots per GPU, device IDs
  ``<uuid>::<n>``; a failed GPU fails all its replicas;
- **MIG**: ``nvidia.com/mig-<profile>`` with ``replicas`` instances per GPU, device IDs
  ``MIG-<uuid>/<gi>/0`` (the form that names the parent GPU); a failed GPU fails all its
  instances, an instance fault (``faults.instance_fault``) only that instance.

Pure data like ``devices``: ``SimulatedNodeGpus`` hands its allocation questions here while a node shares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from devheal.model.cluster import GPU_RESOURCE, DeviceHealth

if TYPE_CHECKING:
    from devheal.lab.devices import Holder, SimulatedNodeGpus

MIG_PROFILE = re.compile(r"[0-9]+g\.[0-9]+gb")
MAX_REPLICAS = 16


@dataclass(slots=True)
class Sharing:
    replicas: int
    """Slots per GPU: time-slicing replicas, or MIG instances."""
    profile: str = ""
    """The MIG profile (``3g.40gb``); "" for time-slicing."""
    holders: dict[tuple[int, int], Holder] = field(default_factory=dict)
    faults: dict[tuple[int, int], str] = field(default_factory=dict)
    """MIG instances that failed on their own: (GPU index, instance) -> message."""

    @classmethod
    def create(cls, replicas: int, profile: str = "") -> Sharing:
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas}")
        if profile and not MIG_PROFILE.fullmatch(profile):
            raise ValueError(f"MIG profile must look like 3g.40gb, got {profile!r}")
        return cls(replicas, profile)

    @property
    def resource(self) -> str:
        return f"nvidia.com/mig-{self.profile}" if self.profile else GPU_RESOURCE

    def slot_id(self, uuid: str, n: int) -> str:
        return f"MIG-{uuid}/{n + 1}/0" if self.profile else f"{uuid}::{n}"

    def slot(self, nd: SimulatedNodeGpus, device_id: str) -> tuple[int, int] | None:
        for dev in nd.devices:
            for n in range(self.replicas):
                if self.slot_id(dev.uuid, n) == device_id:
                    return dev.index, n
        return None

    def usable(self, nd: SimulatedNodeGpus, index: int, n: int) -> bool:
        return nd.devices[index].allocatable and (index, n) not in self.faults

    def capacity(self, nd: SimulatedNodeGpus) -> int:
        return len(nd.devices) * self.replicas

    def allocatable(self, nd: SimulatedNodeGpus) -> int:
        return sum(1 for d in nd.devices for n in range(self.replicas) if self.usable(nd, d.index, n))

    def allocate(self, nd: SimulatedNodeGpus, holder: Holder, count: int) -> tuple[str, ...] | None:
        """``count`` free usable slots (lowest GPU and slot first) for ``holder``; None when there are too few."""
        free = [
            (d.index, n)
            for d in nd.devices
            for n in range(self.replicas)
            if self.usable(nd, d.index, n) and (d.index, n) not in self.holders
        ]
        if len(free) < count:
            return None
        for key in free[:count]:
            self.holders[key] = holder
        return tuple(self.slot_id(nd.devices[i].uuid, n) for i, n in free[:count])

    def held_by(self, nd: SimulatedNodeGpus, pod_uid: str, container: str | None) -> tuple[str, ...]:
        return tuple(
            self.slot_id(nd.devices[i].uuid, n)
            for (i, n), h in sorted(self.holders.items())
            if h.uid == pod_uid and (container is None or h.container == container)
        )

    def release(self, nd: SimulatedNodeGpus, pod_uid: str) -> tuple[str, ...]:
        freed = self.held_by(nd, pod_uid, None)
        for key in [k for k, h in self.holders.items() if h.uid == pod_uid]:
            del self.holders[key]
        return freed

    def health(self, nd: SimulatedNodeGpus, device_id: str) -> tuple[str, str]:
        """The kubelet's view of a slot: (Healthy|Unhealthy|Unknown, message)."""
        slot = self.slot(nd, device_id)
        if slot is None:
            return "Unknown", ""
        dev = nd.devices[slot[0]]
        if dev.health is DeviceHealth.UNHEALTHY:
            return "Unhealthy", dev.reason
        if slot in self.faults:
            return "Unhealthy", self.faults[slot]
        return "Healthy", ""

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "replicas": self.replicas,
            "profile": self.profile,
            "instanceFaults": [{"gpu": i, "instance": n, "message": m} for (i, n), m in sorted(self.faults.items())],
        }


SHARING_FAULTS = ("share", "instance-fault")
"""Fault API kinds (``nodesim.faultapi``): reconfigure a node's sharing; fail one MIG instance."""


def sharing_fault(nd: SimulatedNodeGpus, kind: str, body: dict[str, Any]) -> set[str]:
    """Apply a sharing fault to ``nd``; returns the GPU UUIDs whose pods' status changed. ValueError on bad input."""
    if kind == "share":
        replicas, profile = body.get("replicas", 1), body.get("profile", "")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not isinstance(profile, str):
            raise ValueError(f"fault 'share' needs 'replicas' (integer) and 'profile' (string), got {body!r}")
        if nd.holders():
            raise ValueError(f"node {nd.node} has pods holding GPUs: reconfigure it while it is idle")
        nd.sharing = None if replicas == 1 and not profile else Sharing.create(replicas, profile)
        return set()
    if kind == "instance-fault":
        sharing = nd.sharing
        gpu, instance, code = body.get("gpu"), body.get("instance"), body.get("code", 94)
        if sharing is None or not sharing.profile:
            raise ValueError(f"fault 'instance-fault': node {nd.node} has no MIG instances (share it with a profile)")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gpu, instance, code)):
            raise ValueError(f"fault 'instance-fault' needs 'gpu', 'instance' and 'code' integers, got {body!r}")
        assert isinstance(gpu, int) and isinstance(instance, int)
        dev = nd.device(gpu)  # raises IndexError with the valid range
        if not 0 <= instance < sharing.replicas:
            raise ValueError(f"GPU {gpu} has MIG instances 0..{sharing.replicas - 1}; there is no instance {instance}")
        sharing.faults[(gpu, instance)] = f"XID {code} on MIG instance {instance + 1} (GPU {gpu})"
        return {dev.uuid}
    raise ValueError(f"unknown sharing fault {kind!r}")
