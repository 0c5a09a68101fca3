"""Which extended resources are GPUs, and which physical GPU a device ID is part of.

Clusters name GPUs differently: ``nvidia.com/gpu``, ``amd.com/gpu``, ``gpu.intel.com/i915``; the
NVIDIA device plugin's mixed MIG strategy adds one resource per MIG profile
(``nvidia.com/mig-1g.10gb``), each instance a device of its own. Sharing gives one physical GPU
several device IDs: time-slicing and MPS advertise replicas as ``<uuid>::<n>``. devheal counts
every such resource as GPUs, and maps each device ID to the physical GPU it is part of:

- a replica ``GPU-abc::3`` is ``GPU-abc``: a failure of the GPU fails every pod sharing it;
- a MIG instance is its own device (a fault on one instance fails only its pods); the
  ``MIG-GPU-<uuid>/<gi>/<ci>`` form names its parent ``GPU-<uuid>``, so a GPU-wide fault the
  node agent reports for the parent fails the pods of every instance on it.

Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from devheal.model.cluster import GPU_RESOURCE

DEFAULT_GPU_RESOURCES = (GPU_RESOURCE,)
MIG_PREFIX = "nvidia.com/mig-"

_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_MIG_PROFILE = re.compile(r"[0-9]+(c\.[0-9]+)?g\.[0-9]+gb(\+me)?")
_OLD_MIG = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/[0-9]+/[0-9]+")


@dataclass(frozen=True, slots=True)
class GpuResources:
    """The extended resources that are GPUs (whole or MIG instances)."""

    names: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    mig: bool = True
    """Count ``nvidia.com/mig-<profile>`` resources as GPUs too."""

    def __post_init__(self) -> None:
        for name in self.names:
            if not _RESOURCE_NAME.fullmatch(name):
                raise ValueError(f"GPU resource {name!r} is not an extended resource name like nvidia.com/gpu")

    def is_gpu(self, resource: str) -> bool:
        return resource in self.names or (self.mig and mig_profile(resource) is not None)

    def count(self, quantities: dict[str, int]) -> int:
        """GPUs (whole or MIG instances) in a resource list already read as whole numbers."""
        return sum(v for k, v in quantities.items() if self.is_gpu(k))


DEFAULT = GpuResources()


def mig_profile(resource: str) -> str | None:
    """``nvidia.com/mig-1g.10gb`` -> ``1g.10gb``; None for any other resource."""
    if not resource.startswith(MIG_PREFIX):
        return None
    profile = resource[len(MIG_PREFIX) :]
    return profile if _MIG_PROFILE.fullmatch(profile) else None


def physical_id(device_id: str) -> str:
    """The physical GPU a device ID is part of: ``GPU-abc::2`` -> ``GPU-abc`` (a time-sliced or MPS replica),
    ``MIG-GPU-abc/1/0`` -> ``GPU-abc`` (a MIG instance naming its parent); anything else is itself."""
    base, sep, replica = device_id.rpartition("::")
    if sep and base and replica.isascii() and replica.isdigit():
        return base
    old = _OLD_MIG.fullmatch(device_id)
    return old.group(1) if old else device_id


def shares_physical(device_id: str, physical: str) -> bool:
    """Whether ``device_id`` is ``physical`` or a part of it (replica or MIG instance)."""
    return device_id == physical or physical_id(device_id) == physical
