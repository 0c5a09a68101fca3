"""Without devheal's CRDs, the controller and the agent stop at once with one line saying how to install them.

The in-memory API server serves no discovery for devheal's group (as an API server without
the definitions answers: 404), so ``devheal controller`` and ``devheal agent``, run as
processes against it, meet exactly what they meet after a fresh ``devheal lab up``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from devheal.kube.client import KubeClient
from devheal.kube.crds import CRDsMissing, check_installed
from tests.shell.memapi import MemApi

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture(loop_scope="function")
async def api() -> AsyncIterator[MemApi]:
    async with MemApi() as server:
        yield server


async def devheal(*args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_SERVICE"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devheal", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (["controller", "--no-leader-elect"], "remediationpolicies, remediations, nodedevices"),
        (["agent", "--node-name", "gpu-node-000"], "nodedevices"),
    ],
    ids=["controller", "agent"],
)
async def test_missing_crds_end_the_command_with_how_to_install_them(
    api: MemApi, tmp_path: Path, command: list[str], missing: str
) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    code, err = await devheal(*command, "--kubeconfig", str(kubeconfig))
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert code == 1
    assert line == (
        f"devheal {command[0]}: devheal's CRDs are not installed (the API server does not serve {missing} in "
        "devheal.io/v1alpha1): run `devheal crds apply` (with the same --kubeconfig/--context), "
        "or apply src/devheal/crds/*.yaml"
    )


async def test_check_installed_names_what_is_missing(api: MemApi, tmp_path: Path) -> None:
    async with await KubeClient.connect(str(api.kubeconfig(tmp_path / "kubeconfig"))) as kube:
        with pytest.raises(CRDsMissing, match=r"does not serve nodedevices in devheal\.io/v1alpha1"):
            await check_installed(kube, ("nodedevices",))
