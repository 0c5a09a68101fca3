"""A pod on a real node reaches the API server as a pod in a cluster does: at the `kubernetes` Service's
ClusterIP, over TLS checked against the service-account CA, authenticated by its service-account token."""

from __future__ import annotations

import json

import pytest

from devheal.kube.client import KubeClient, api_path
from devheal.lab import realnode, versions
from devheal.lab.cluster import Lab

from .pods import pod_in_phase

# The fixtures may build the real nodes' binaries (minutes, once) and the devheal image (a minute or two, once).
pytestmark = pytest.mark.timeout(1800)

# In-cluster configuration as every Kubernetes client reads it: the Service's address from the environment
# kubelet sets, the CA and token from the mounted service account.
CALLER = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
base = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
headers = {"Authorization": "Bearer " + open(f"{sa}/token").read(), "Content-Type": "application/json"}

def call(path, body=None):
    request = urllib.request.Request(base + path, data=body, headers=headers)
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.load(response)

review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
answer = {
    "base": base,
    "version": call("/version")["gitVersion"],
    "user": call("/apis/authentication.k8s.io/v1/selfsubjectreviews", json.dumps(review).encode())["status"],
}
open("/dev/termination-log", "w").write(json.dumps(answer))
"""


async def test_a_pod_calls_the_api_server_at_the_kubernetes_service_with_its_service_account(
    real_lab: Lab, real_kube: KubeClient, real_namespace: str, devheal_image_name: str
) -> None:
    service = await real_kube.get(api_path("v1", "services", namespace="default", name="kubernetes"))
    pod = {
        "metadata": {"name": "in-cluster"},
        "spec": {
            "restartPolicy": "Never",
            **realnode.on_real_nodes(),
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "caller",
                    "image": devheal_image_name,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", CALLER],
                }
            ],
        },
    }
    await real_kube.create(api_path("v1", "pods", namespace=real_namespace), pod)
    done = await pod_in_phase(real_kube, real_namespace, "in-cluster")
    (status,) = done["status"]["containerStatuses"]
    assert done["status"]["phase"] == "Succeeded", status["state"]
    answer = json.loads(status["state"]["terminated"]["message"])
    assert answer["base"] == f"https://{service['spec']['clusterIP']}:443"
    assert answer["version"] == f"v{versions.KUBERNETES}"
    assert answer["user"]["userInfo"]["username"] == f"system:serviceaccount:{real_namespace}:default"
