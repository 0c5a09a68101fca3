"""``lab up --kueue``: Kueue's manager is a lab component, and its webhooks call it on loopback."""

from __future__ import annotations

from devheal.kube.client import KubeClient, api_path
from devheal.lab import versions
from devheal.lab.cluster import Lab


async def test_kueue_runs_as_a_lab_component_with_its_webhooks_on_loopback(lab: Lab, kube: KubeClient) -> None:
    status = lab.status()
    assert status["components"]["kueue"]["healthy"], status["components"]["kueue"]
    assert status["versions"]["kueue"] == versions.KUEUE

    port = status["components"]["kueue"]["port"]
    state = lab.state()
    assert state is not None and port == state.ports["kueue"]
    hooks = []
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        items, _ = await kube.list_all(api_path("admissionregistration.k8s.io/v1", kind))
        hooks += [h for item in items if item["metadata"]["name"].startswith("kueue-") for h in item["webhooks"]]
    assert {"mjob.kb.io", "mpod.kb.io", "mdeployment.kb.io", "vworkload.kb.io"} <= {h["name"] for h in hooks}
    for hook in hooks:
        assert hook["clientConfig"]["url"].startswith(f"https://127.0.0.1:{state.ports['kueue-webhook']}/"), hook
        assert "service" not in hook["clientConfig"]
