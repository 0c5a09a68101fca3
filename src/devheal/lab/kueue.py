"""Kueue in the lab (``devheal lab up --kueue``): its controller manager as one more loopback process.

Kueue's manager runs from the binary devheal.lab.toolchain builds (``ensure_kueue``), with the lab's admin
kubeconfig, and reads a ``Configuration`` file written here: leader election off, its internal certificate
management off, the webhook server, health probes and metrics on 127.0.0.1 ports the lab picked, and the
integrations the lab tests use (``batch/job``, ``pod``, ``deployment``). Its webhook server presents a
certificate from the lab's CA (devheal.lab.pki), and its Mutating/ValidatingWebhookConfigurations, the
release's own manifests, call it at ``url: https://127.0.0.1:<port>/<path>`` instead of through a Service.

Start order (devheal.lab.cluster): CRDs (Established), the ``kueue-system`` namespace, the manager (until
``/readyz`` answers), then the webhook configurations, so no request meets a webhook that is not serving yet.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import yaml

from devheal.lab import toolchain
from devheal.lab.pki import LabPki

NAMESPACE = "kueue-system"
"""Kueue's own namespace: its events and (were it on) leader election live there."""

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that hands a Job, pod or Deployment to Kueue: the name of a LocalQueue in its namespace."""

FRAMEWORKS = ("batch/job", "pod", "deployment")
"""Kueue's integrations the lab turns on: gangs as Jobs, inference as Deployments (which need ``pod``)."""

FEATURE_GATES = {
    # Its on-demand visibility API is an aggregated API server of its own; the lab does not register it.
    "VisibilityOnDemand": False,
    # Beta and on by default in 0.17: stated so that a default flip never changes what the lab tests show.
    "TopologyAwareScheduling": True,
    "TASFailedNodeReplacement": True,
    "TASReplaceNodeOnNodeTaints": True,
}
"""Kueue's feature gates in the lab."""

PORTS = ("kueue", "kueue-webhook", "kueue-metrics")
"""The lab's ports for Kueue: its health probes (``kueue``, the component's port), webhook server, metrics."""

_SERVED_OUTSIDE_KUEUE = {("batch", "jobs"), ("", "pods"), ("apps", "deployments")}
"""Resources of other API groups whose webhooks Kueue registers with ``FRAMEWORKS``."""

_EXEMPT_NAMESPACES = ["kube-system", NAMESPACE]
"""Namespaces whose pods and Deployments Kueue's webhooks skip (as its release's kustomization patches)."""


METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
"""Where Kueue 0.17's manager reads its metrics server's certificate when its internal certificate management
is off: a fixed path (cmd/kueue/main.go), not a setting, and it exits when the files are missing."""


class KueueSetupError(RuntimeError):
    """Kueue cannot run here; the message says what is missing and what to do."""


def directory(lab_dir: Path) -> Path:
    return lab_dir / "kueue"


def configuration(lab_dir: Path, ports: dict[str, int]) -> dict[str, Any]:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for this lab."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue-metrics']}"},
        "webhook": {"host": "127.0.0.1", "port": ports["kueue-webhook"], "certDir": str(cert_dir(lab_dir))},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 200, "burst": 400},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": dict(FEATURE_GATES),
    }


def cert_dir(lab_dir: Path) -> Path:
    return directory(lab_dir) / "certs"


def prepare(lab_dir: Path, pki: LabPki, ports: dict[str, int]) -> Path:
    """Write the configuration and the webhook server's certificate; return the configuration's path."""
    pki.ensure_loopback_serving("kueue-webhook")
    certs = cert_dir(lab_dir)
    certs.mkdir(parents=True, exist_ok=True)
    # controller-runtime's webhook server reads these two names from its certDir.
    shutil.copyfile(pki.loopback_cert("kueue-webhook"), certs / "tls.crt")
    shutil.copyfile(pki.loopback_key("kueue-webhook"), certs / "tls.key")
    (certs / "tls.key").chmod(0o600)
    _ensure_metrics_cert(lab_dir, certs)
    config = directory(lab_dir) / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(lab_dir, ports), sort_keys=False))
    namespace = directory(lab_dir) / "namespace.yaml"
    namespace.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, sort_keys=False)
    )
    webhooks = directory(lab_dir) / "webhooks.yaml"
    docs = webhook_configurations(
        list(yaml.safe_load_all((toolchain.kueue_manifests() / "webhooks.yaml").read_text())),
        ports["kueue-webhook"],
        pki.ca_cert.read_bytes(),
    )
    webhooks.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return config


METRICS_CERT_CLAIMS = METRICS_CERT_DIR / "devheal-labs"
"""The labs using a certificate the lab put at ``METRICS_CERT_DIR``, one directory per line: the last one's
``down`` takes it away again. Without this file the certificate there is someone else's and stays."""


def _ensure_metrics_cert(lab_dir: Path, certs: Path) -> None:
    """Put a certificate where Kueue's manager insists on reading one (``METRICS_CERT_DIR``), unless one is there
    that is not the lab's; note that this lab uses it (``release_metrics_cert`` at ``down``).

    Any lab's loopback certificate will do: the lab scrapes no metrics over TLS and verifies none."""
    present = all((METRICS_CERT_DIR / name).exists() for name in ("tls.crt", "tls.key"))
    if present and not METRICS_CERT_CLAIMS.exists():
        return
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        if not present:
            for name in ("tls.crt", "tls.key"):
                shutil.copyfile(certs / name, METRICS_CERT_DIR / name)
            (METRICS_CERT_DIR / "tls.key").chmod(0o600)
        claims = _claims()
        if str(lab_dir) not in claims:
            METRICS_CERT_CLAIMS.write_text("".join(f"{c}\n" for c in [*claims, str(lab_dir)]))
    except OSError as exc:
        raise KueueSetupError(
            f"Kueue's manager reads its metrics certificate from {METRICS_CERT_DIR} (a fixed path) and could not "
            f"be given one ({exc}): run the lab as root, or create that directory writable by this user"
        ) from exc


def _claims() -> list[str]:
    try:
        return [line for line in METRICS_CERT_CLAIMS.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def release_metrics_cert(lab_dir: Path) -> None:
    """This lab no longer uses the certificate it put at ``METRICS_CERT_DIR``; the last lab removes it, and the
    directories it made. A certificate the lab did not put there is never touched."""
    claims = _claims()
    if str(lab_dir) not in claims:
        return
    rest = [c for c in claims if c != str(lab_dir)]
    if rest:
        METRICS_CERT_CLAIMS.write_text("".join(f"{c}\n" for c in rest))
        return
    for name in ("tls.crt", "tls.key", METRICS_CERT_CLAIMS.name):
        (METRICS_CERT_DIR / name).unlink(missing_ok=True)
    for directory in (METRICS_CERT_DIR, METRICS_CERT_DIR.parent, METRICS_CERT_DIR.parent.parent):
        try:
            directory.rmdir()
        except OSError:
            break  # not empty: someone else's files are there


def command(lab_dir: Path, kubeconfig: Path) -> list[str]:
    """Kueue's manager; its kubeconfig comes from ``--kubeconfig`` (controller-runtime's flag)."""
    return [
        str(toolchain.KUEUE.binary("kueue")),
        f"--config={directory(lab_dir) / 'config.yaml'}",
        f"--kubeconfig={kubeconfig}",
        "--zap-log-level=info",
    ]


def crd_dir() -> Path:
    return toolchain.kueue_manifests() / "crd"


def webhook_configurations(docs: list[Any], port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The release's webhook configurations, pointed at ``https://127.0.0.1:<port>`` and cut to what Kueue serves.

    A webhook for an integration the lab leaves off would answer 404 and, with ``failurePolicy: Fail``, make
    every such object uncreatable, so only Kueue's own kinds and ``FRAMEWORKS``' resources keep theirs."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            if not all(_served(rule) for rule in hook.get("rules") or []):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            if any(_resource(rule) & {("", "pods"), ("apps", "deployments")} for rule in hook.get("rules") or []):
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": _EXEMPT_NAMESPACES}
                    ]
                }
            hooks.append(hook)
        name = doc["metadata"]["name"]
        out.append({**doc, "metadata": {"name": f"kueue-{name}"}, "webhooks": hooks})
    return out


def _resource(rule: dict[str, Any]) -> set[tuple[str, str]]:
    return {(group, res) for group in rule.get("apiGroups") or [] for res in rule.get("resources") or []}


def _served(rule: dict[str, Any]) -> bool:
    return all(group == "kueue.x-k8s.io" or (group, res) in _SERVED_OUTSIDE_KUEUE for group, res in _resource(rule))
