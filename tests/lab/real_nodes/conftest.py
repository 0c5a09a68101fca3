"""A lab with real nodes (kubelet, containerd, runc) beside a kwok node, for the tests in this folder.

Real nodes need root (namespaces, cgroups, bridges), util-linux's ``unshare``/``nsenter``, and
what their binaries and images are built from (a C compiler and libseccomp's headers for runc,
Debian's busybox-static): ``scripts/bootstrap`` installs those as root. Where they are missing
these tests skip and say which; the real-node binaries are built on first use (minutes, once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from devheal.kube.client import KubeClient
from devheal.lab import devheal_image, images, realnode, toolchain
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.workloads import wait_until
from tests.lab.sessions import fresh_namespace, lab_client, running_lab

REAL_NODES = 1
SIMULATED_NODES = 1
GPUS_PER_NODE = 3


def real_node_support() -> str | None:
    """Why real nodes cannot run on this machine, or None when they can."""
    try:
        realnode.check_machine()
    except realnode.RealNodeError as exc:
        return str(exc)
    if toolchain.NODE.missing():
        try:
            toolchain.node_prerequisites()
        except toolchain.ToolchainError as exc:
            return str(exc)
    if not images.have_busybox():
        package = images.BUSYBOX_PACKAGE
        return f"the workload image needs Debian's {package} (apt-get install -y {package})"
    return None


@pytest.fixture(scope="package")
def real_lab() -> Iterator[Lab]:
    reason = real_node_support()
    if reason:
        pytest.skip(reason)
    spec = LabSpec(nodes=SIMULATED_NODES + REAL_NODES, gpus_per_node=GPUS_PER_NODE, real_nodes=REAL_NODES)
    with running_lab("dhl-real-", spec) as lab:
        yield lab


@pytest.fixture(scope="package")
def devheal_image_name(real_lab: Lab) -> str:
    """The devheal image, built from the sources (a minute or two the first time) and imported into the real node."""
    image = devheal_image.devheal_image()
    real_lab.import_image(image)
    return image.name


@pytest.fixture
async def real_kube(real_lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab_client(real_lab) as client:
        yield client


@pytest.fixture
async def real_namespace(real_kube: KubeClient) -> AsyncIterator[str]:
    async with fresh_namespace(real_kube, "real") as name:
        yield name


async def until(what: str, probe: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    """``probe()``'s first truthy answer, asked every quarter second; ``WaitTimeout`` saying ``what`` did not happen."""
    return await wait_until(probe, bool, timeout=timeout, what=what, interval=0.25)
