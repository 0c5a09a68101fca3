"""The command lines of the lab's control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, each on loopback with the lab's PKI and ports (``devheal.lab.cluster``
starts them).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from devheal.lab import toolchain
from devheal.lab.pki import SERVICE_CLUSTER_IP_RANGE, LabPki

FEATURE_GATES = {
    "ResourceHealthStatus": True,
    "ResourceHealthStatusMessage": True,
    "ContainerRestartRules": True,
    "RestartAllContainersOnContainerExits": True,
    # DRA device taints (KEP-5055): GA and on by default in 1.37, set so the DRA lab never depends on a default.
    "DRADeviceTaints": True,
    "DRADeviceTaintRules": True,
    # Node lifecycle conditions (KEP-5683, alpha in 1.37): devheal publishes DrainInProgress/Drained where on.
    "NodeLifecycleConditions": True,
    # Cooperative eviction (KEP-4563, alpha in 1.37): serves lifecycle.k8s.io/v1alpha1 with the runtime config below.
    "EvictionRequestAPI": True,
    # The Workload API (KEP-4671, beta in 1.37): PodGroups in scheduling.k8s.io/v1beta1 with the runtime config
    # below, pods naming theirs in spec.schedulingGroup.podGroupName, gang scheduling by the scheduler. Not
    # WorkloadWithJob (KEP-5547, alpha): with it the Job controller gives every new Job a Workload and a PodGroup,
    # and every lab Job would be scheduled through one.
    "GenericWorkload": True,
}
"""Beta gates later issues rely on, set explicitly so a default flip never surprises us."""


RUNTIME_CONFIG = "lifecycle.k8s.io/v1alpha1=true,scheduling.k8s.io/v1beta1=true"
"""Alpha and beta API versions the lab serves: such a version stays off without it, whatever its gate says."""


def _bin(name: str) -> str:
    return str(toolchain.CONTROL_PLANE.binary(name))


SCHEDULER_GATES = ("GenericWorkload",)
"""The gates the scheduler is given too: gang scheduling of PodGroups is the scheduler's as much as the API
server's. The others stay at the scheduler's defaults, as before."""


def _gates(names: tuple[str, ...] | None = None) -> str:
    chosen = FEATURE_GATES if names is None else {k: FEATURE_GATES[k] for k in names}
    return ",".join(f"{k}={str(v).lower()}" for k, v in chosen.items())


def etcd(lab_dir: Path, ports: dict[str, int]) -> list[str]:
    return [
        _bin("etcd"),
        "--name=devheal-lab",
        f"--data-dir={lab_dir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
        f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
        f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
        f"--initial-cluster=devheal-lab=http://127.0.0.1:{ports['etcd-peer']}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver(pki: LabPki, ports: dict[str, int]) -> list[str]:
    return [
        _bin("kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports['kube-apiserver']}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        # As in a cluster: a kubelet (system:node:<name>) may touch only its own node and that node's pods.
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # Logs and exec on a real node's pods: the API server's client identity towards kubelet.
        f"--kubelet-client-certificate={pki.admin_cert}",
        f"--kubelet-client-key={pki.admin_key}",
        "--kubelet-preferred-address-types=InternalIP",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
        "--max-requests-inflight=2000",
        "--max-mutating-requests-inflight=1000",
        f"--feature-gates={_gates()}",
        f"--runtime-config={RUNTIME_CONFIG}",
        "--v=1",
    ]


def controller_manager(kubeconfig: Path, pki: LabPki, ports: dict[str, int]) -> list[str]:
    return [
        _bin("kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['kube-controller-manager']}",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
        "--concurrent-deployment-syncs=20",
        "--concurrent-replicaset-syncs=20",
        "--concurrent-job-syncs=20",
        "--profiling=false",
        f"--feature-gates={_gates()}",
        "--v=1",
    ]


def scheduler(lab_dir: Path, kubeconfig: Path, ports: dict[str, int]) -> list[str]:
    config = lab_dir / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 500, "burst": 1000},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    return [
        _bin("kube-scheduler"),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['kube-scheduler']}",
        "--profiling=false",
        f"--feature-gates={_gates(SCHEDULER_GATES)}",
        "--v=1",
    ]


def kwok(lab_dir: Path, kubeconfig: Path, ports: dict[str, int]) -> list[str]:
    stages = lab_dir / "kwok-stages.yaml"
    stages.write_text(resources.files("devheal.lab").joinpath("data/kwok-stages.yaml").read_text())
    return [
        _bin("kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        "--node-ip=10.0.0.1",
    ]
