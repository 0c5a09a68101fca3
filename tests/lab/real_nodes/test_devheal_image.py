"""The devheal image, built here from Debian's packages and the wheel, runs on a real node as the Dockerfile's
image does: its entry point is `devheal`, its user is not root, and it works on a read-only root file system."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.lab import realnode
from devheal.lab.cluster import Lab
from tests.lab.sessions import kubectl_argv

from .pods import pod_in_phase

# The fixtures may build the real nodes' binaries (minutes, once) and the image (a minute or two, once).
pytestmark = pytest.mark.timeout(1800)

PROBE = """
import errno, json, os, sys
try:
    open("/opt/devheal/written", "w")
    write = "written"
except OSError as exc:
    write = errno.errorcode[exc.errno]
import devheal.cli.app
report = {"uid": os.getuid(), "gid": os.getgid(), "write": write, "executable": sys.executable,
          "home": os.environ["HOME"], "bytecode": sys.dont_write_bytecode}
open("/dev/termination-log", "w").write(json.dumps(report))
"""


def _hardened(name: str, image: str, command: list[str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": "Never",
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if command:
        container["command"] = command
    return container


async def test_the_image_runs_devheal_as_non_root_on_a_read_only_root_file_system(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str, devheal_image_name: str
) -> None:
    pod = {
        "metadata": {"name": "devheal-image"},
        "spec": {
            "restartPolicy": "Never",
            **realnode.on_real_nodes(),
            "terminationGracePeriodSeconds": 1,
            # No runAsUser: kubelet checks the image's own user (65532) is not root.
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                _hardened("help", devheal_image_name),  # the image's ENTRYPOINT and CMD: `devheal --help`
                _hardened("probe", devheal_image_name, ["python", "-c", PROBE]),
            ],
        },
    }
    await real_kube.create(api_path("v1", "pods", namespace=real_namespace), pod)
    done = await pod_in_phase(real_kube, real_namespace, "devheal-image")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    states = {s["name"]: s["state"]["terminated"] for s in done["status"]["containerStatuses"]}
    assert {name: state["exitCode"] for name, state in states.items()} == {"help": 0, "probe": 0}
    assert json.loads(states["probe"]["message"]) == {
        "uid": 65532,
        "gid": 65532,
        "write": "EROFS",
        "executable": "/opt/devheal/bin/python",
        "home": "/tmp",
        "bytecode": True,
    }
    kubectl = kubectl_argv(real_lab, real_namespace)
    logs = await asyncio.create_subprocess_exec(
        *kubectl, "logs", "devheal-image", "-c", "help", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await logs.communicate()
    assert out.decode().startswith("Usage: devheal"), out.decode()
