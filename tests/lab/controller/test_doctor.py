"""`devheal doctor` on a real API server: what it finds ready, and what it says is missing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.lab.cluster import Lab
from devheal.lab.workloads import gpu_job

from .conftest import ControllerHarness
from .test_deploy_rbac import install_rbac


async def doctor(lab: Lab, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_SERVICE"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devheal", "doctor", "--kubeconfig", str(lab.kubeconfig), "--json", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None and proc.returncode in (0, 1), err.decode()
    return proc.returncode, {c["check"]: c for c in json.loads(out)}


async def test_doctor_finds_the_deployed_rbac_and_names_a_missing_template(
    lab: Lab, kube: KubeClient, harness: ControllerHarness, namespace: str
) -> None:
    _, _, created = await install_rbac(kube)
    template = {"apiVersion": "example.com/v1", "kind": "RebootRemediationTemplate", "namespace": "ops", "name": "gone"}
    await harness.policy({"node": {"template": template}})  # removed by the harness
    # A gang the policy selects, with one backoff for the whole Job (suspended: it needs no pod to be judged).
    gang = gpu_job("wide", ranks=4, indexed=True)
    gang["spec"]["suspend"] = True
    await kube.create(api_path("batch/v1", "jobs", namespace=namespace), gang)
    try:
        code, checks = await doctor(lab)
        assert code == 1, checks
        assert checks["crds"]["status"] == "ok"
        assert checks["permissions"]["status"] == "ok", checks["permissions"]
        assert checks["templates"]["status"] == "fail"
        assert "RebootRemediationTemplate ops/gone" in checks["templates"]["detail"]
        assert checks["agents"]["status"] in ("ok", "warn")  # no agent runs on the lab's GPU nodes here
        assert checks["gang-jobs"]["status"] == "warn", checks["gang-jobs"]
        assert f"Job {namespace}/wide: one backoff for the whole Job" in checks["gang-jobs"]["detail"]

        code, checks = await doctor(lab, "--service-account", "default/nobody")
        assert checks["permissions"]["status"] == "fail"
        assert "system:serviceaccount:default:nobody may not" in checks["permissions"]["detail"]
        assert "create pods/eviction" in checks["permissions"]["detail"]
    finally:
        for path in created:
            with contextlib.suppress(errors.NotFound):
                await kube.delete(path)
