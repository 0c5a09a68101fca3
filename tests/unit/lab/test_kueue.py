"""Kueue in the lab: pinned and cached apart, configured for loopback, its webhooks pointed at loopback."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from devheal.lab import kueue, toolchain, versions


def test_kueue_is_pinned_and_cached_apart_from_the_control_plane() -> None:
    assert versions.KUEUE in versions.kueue_cache_key()
    assert toolchain.KUEUE.root not in (toolchain.CONTROL_PLANE.root, toolchain.NODE.root)
    assert toolchain._kueue_target().version == f"v{versions.KUEUE}"
    assert not {"kueue"} & {name for target in toolchain._targets() for name in target.outputs}


def test_configuration_keeps_everything_on_loopback_and_off_leader_election() -> None:
    ports = {"kueue": 1001, "kueue-webhook": 1002, "kueue-metrics": 1003}
    config = kueue.configuration(Path("/lab"), ports)
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:1001"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:1003"
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1002, "certDir": "/lab/kueue/certs"}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["integrations"]["frameworks"] == ["batch/job", "pod", "deployment"]


def _hook(name: str, group: str, resource: str) -> dict:
    return {
        "name": name,
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": f"/mutate-{resource}"}},
        "failurePolicy": "Fail",
        "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}],
    }


def test_webhooks_call_loopback_with_the_lab_ca_and_only_for_what_kueue_serves() -> None:
    docs = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                _hook("mjob.kb.io", "batch", "jobs"),
                _hook("mpod.kb.io", "", "pods"),
                _hook("mstatefulset.kb.io", "apps", "statefulsets"),
                _hook("mworkload.kb.io", "kueue.x-k8s.io", "workloads"),
                _hook("mrayjob.kb.io", "ray.io", "rayjobs"),
            ],
        },
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook-service"}},
    ]
    (config,) = kueue.webhook_configurations(docs, 9443, b"CA")
    assert config["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    hooks = {h["name"]: h for h in config["webhooks"]}
    assert set(hooks) == {"mjob.kb.io", "mpod.kb.io", "mworkload.kb.io"}
    assert hooks["mjob.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-jobs",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    (exempt,) = hooks["mpod.kb.io"]["namespaceSelector"]["matchExpressions"]
    assert exempt["operator"] == "NotIn" and set(exempt["values"]) == {"kube-system", "kueue-system"}
    assert "namespaceSelector" not in hooks["mjob.kb.io"]


def _fixed_path(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    """``METRICS_CERT_DIR`` under ``root`` (``etc/kueue/metrics/certs``), as the lab sees it."""
    directory = root / "etc" / "kueue" / "metrics" / "certs"
    monkeypatch.setattr(kueue, "METRICS_CERT_DIR", directory)
    monkeypatch.setattr(kueue, "METRICS_CERT_CLAIMS", directory / "devheal-labs")
    return directory


def _certs(tmp_path: Path) -> Path:
    certs = tmp_path / "lab-certs"
    certs.mkdir()
    (certs / "tls.crt").write_text("cert")
    (certs / "tls.key").write_text("key")
    return certs


def test_the_metrics_certificate_at_kueues_fixed_path_goes_with_the_last_lab_that_put_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = _fixed_path(monkeypatch, tmp_path)
    (tmp_path / "etc").mkdir()
    certs = _certs(tmp_path)
    kueue._ensure_metrics_cert(Path("/lab-a"), certs)
    kueue._ensure_metrics_cert(Path("/lab-b"), certs)
    assert (fixed / "tls.crt").read_text() == "cert"
    kueue.release_metrics_cert(Path("/lab-a"))
    assert (fixed / "tls.crt").exists(), "lab-b still uses it"
    kueue.release_metrics_cert(Path("/lab-b"))
    assert not (tmp_path / "etc" / "kueue").exists(), "the last lab takes away what the labs made"
    assert (tmp_path / "etc").exists()


def test_a_metrics_certificate_the_lab_did_not_put_there_is_used_and_never_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = _fixed_path(monkeypatch, tmp_path)
    fixed.mkdir(parents=True)
    (fixed / "tls.crt").write_text("theirs")
    (fixed / "tls.key").write_text("theirs")
    kueue._ensure_metrics_cert(Path("/lab-a"), _certs(tmp_path))
    kueue.release_metrics_cert(Path("/lab-a"))
    assert (fixed / "tls.crt").read_text() == "theirs"
    assert not (fixed / "devheal-labs").exists()
