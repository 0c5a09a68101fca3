"""The simulated kubelets' opt-in training process: a new pod's framework start-up keeps it Running but not Ready,
and a pod under a simulated launcher acknowledges its restart generation and restarts its process in place."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab.nodesim.training import INIT_SECONDS_ANNOTATION, RESTART_SECONDS_ANNOTATION
from devheal.lab.workloads import wait_until
from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION, RESTART_GENERATION_ANNOTATION

from .test_startup_model import conditions, phase, read, seconds, sim_pod, started_at


def ready(pod: dict | None) -> bool:
    return bool(pod) and phase(pod) == "Running" and conditions(pod).get("Ready") == "True"


async def test_a_new_pod_is_ready_once_its_process_initialised(kube: KubeClient, namespace: str) -> None:
    await kube.create(api_path("v1", "pods", namespace=namespace), sim_pod("init", {INIT_SECONDS_ANNOTATION: "3"}))
    starting = await wait_until(
        lambda: read(kube, namespace, "init"), lambda p: phase(p) == "Running", timeout=20, what="init running"
    )
    assert starting is not None
    assert conditions(starting)["Ready"] == "False", "running, its training process still starting"
    assert starting["status"]["containerStatuses"][0]["ready"] is False
    pod = await wait_until(lambda: read(kube, namespace, "init"), ready, timeout=20, what="init ready")
    assert pod is not None
    became_ready = seconds(next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"])
    assert became_ready - started_at(pod) >= 2, "ready 3 s after its containers started (whole-second stamps)"


async def test_a_launcher_pod_acknowledges_and_restarts_in_place(kube: KubeClient, namespace: str) -> None:
    notes = {RESTART_SECONDS_ANNOTATION: "2"}
    await kube.create(api_path("v1", "pods", namespace=namespace), sim_pod("rank", notes))

    def acknowledged(generation: str):
        return lambda p: (
            bool(p) and (p["metadata"].get("annotations") or {}).get(LAUNCHER_GENERATION_ANNOTATION) == generation
        )

    first = await wait_until(lambda: read(kube, namespace, "rank"), acknowledged("0"), timeout=20, what="ack 0")
    assert ready(first)
    uid = first["metadata"]["uid"]

    await kube.patch(
        api_path("v1", "pods", namespace=namespace, name="rank"),
        {"metadata": {"annotations": {RESTART_GENERATION_ANNOTATION: "1"}}},
    )
    restarting = await wait_until(
        lambda: read(kube, namespace, "rank"), acknowledged("1"), timeout=20, what="generation 1 acknowledged"
    )
    assert restarting is not None and not ready(restarting), "its process restarts: not ready yet"
    again = await wait_until(lambda: read(kube, namespace, "rank"), ready, timeout=20, what="ready again")
    assert again is not None and again["metadata"]["uid"] == uid, "the same pod: restarted in place"
