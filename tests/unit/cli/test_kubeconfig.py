"""Kubeconfig resolution as kubectl does it: --kubeconfig, $KUBECONFIG merged, ~/.kube/config, in-cluster; --context."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.kube import kubeconfig, tokens
from devheal.kube.kubeconfig import ConfigError, resolve
from devheal.lab.pki import LabPki


def write(path: Path, **config: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **config}))
    return path


def cluster(name: str, server: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server, **extra}}


def context(name: str, cluster_name: str, user: str) -> dict[str, Any]:
    return {"name": name, "context": {"cluster": cluster_name, "user": user}}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return tmp_path / "home"


async def test_kubeconfig_files_merge_first_file_wins(tmp_path: Path) -> None:
    first = write(
        tmp_path / "a" / "config",
        clusters=[cluster("prod", "https://first:6443", **{"certificate-authority": "ca.crt"})],
        users=[{"name": "me", "user": {"tokenFile": "token"}}],
        contexts=[context("prod", "prod", "me")],
        **{"current-context": "prod"},
    )
    second = write(
        tmp_path / "b" / "config",
        clusters=[cluster("prod", "https://second:6443"), cluster("lab", "https://lab:6443")],
        users=[{"name": "me", "user": {"token": "ignored"}}, {"name": "admin", "user": {"token": "t"}}],
        contexts=[context("lab", "lab", "admin")],
        **{"current-context": "lab"},
    )
    merged = kubeconfig.merge([first, second])
    assert merged["current-context"] == "prod"
    conn, plugin = kubeconfig.from_kubeconfig(merged, None, "here")
    assert not plugin
    assert conn.server == "https://first:6443"
    assert conn.ca_file == str(tmp_path / "a" / "ca.crt")  # relative to the file naming it
    assert conn.token_file == tmp_path / "a" / "token" and conn.authorization is None
    lab, _ = kubeconfig.from_kubeconfig(merged, "lab", "here")
    assert (lab.server, lab.authorization, lab.source) == ("https://lab:6443", "Bearer t", "here (context lab)")


async def test_order_flag_then_environment_then_home(tmp_path: Path, home: Path) -> None:
    def config(path: Path, server: str) -> Path:
        return write(
            path,
            clusters=[cluster("c", server)],
            users=[{"name": "u", "user": {}}],
            contexts=[context("c", "c", "u")],
            **{"current-context": "c"},
        )

    flag = config(tmp_path / "flag", "https://flag:1")
    env = config(tmp_path / "env", "https://env:1")
    config(home / ".kube" / "config", "https://home:1")
    assert (await resolve(str(flag), environ={"KUBECONFIG": str(env)})).server == "https://flag:1"
    assert (await resolve(None, environ={"KUBECONFIG": str(env)})).server == "https://env:1"
    assert (await resolve(None, environ={})).server == "https://home:1"


async def test_in_cluster_when_no_kubeconfig_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    monkeypatch.setattr(tokens, "IN_CLUSTER_TOKEN", token)
    monkeypatch.setattr(tokens, "IN_CLUSTER_CA", tmp_path / "ca.crt")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    conn = await resolve(None, environ=env)
    assert conn.server == "https://[fd00::1]:443"
    assert conn.token_file == token and conn.ca_file == str(tmp_path / "ca.crt")
    with pytest.raises(ConfigError, match="a service account has no contexts"):
        await resolve(None, "prod", environ=env)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"contexts": [context("c", "nowhere", "u")], "current-context": "c"}, "names cluster 'nowhere'"),
        ({"clusters": [cluster("c", "")], "contexts": [context("c", "c", "")], "current-context": "c"}, "no https"),
        ({"contexts": [context("a", "c", "u"), context("b", "c", "u")]}, r"no current-context is set: pass --context"),
        (
            {
                "clusters": [cluster("c", "https://x", **{"certificate-authority-data": "%%%"})],
                "contexts": [context("c", "c", "")],
                "current-context": "c",
            },
            "certificate-authority-data is not base64",
        ),
        ({"clusters": "oops"}, "clusters is not a list"),
    ],
    ids=["undefined-cluster", "no-server", "no-current-context", "bad-base64", "not-a-list"],
)
async def test_a_broken_kubeconfig_says_what_to_fix(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    path = write(tmp_path / "config", **config)
    with pytest.raises(ConfigError, match=message) as caught:
        await resolve(str(path), environ={})
    assert str(caught.value).startswith(f"cannot load Kubernetes configuration from {path}")
    assert "\n" not in str(caught.value)


async def test_inline_client_certificates_load_without_leaving_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = LabPki(tmp_path / "pki")
    pki.ensure()
    path = tmp_path / "config"
    path.write_text(pki.kubeconfig("https://127.0.0.1:6443"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    conn = await resolve(str(path), environ={})
    assert conn.cert_data is not None and conn.ca_data is not None
    context_ = conn.ssl_context()
    assert context_.cert_store_stats()["x509_ca"] == 1  # the lab's CA, not the system's
    assert list(scratch.iterdir()) == []


async def test_an_exec_credential_plugin_runs_through_kubernetes_asyncio(tmp_path: Path) -> None:
    credential = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential"}
    credential["status"] = {"token": "from-plugin"}  # type: ignore[assignment]
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
            "interactiveMode": "Never",
        }
    }
    path = write(
        tmp_path / "config",
        clusters=[cluster("c", "https://api:6443", **{"insecure-skip-tls-verify": True})],
        users=[{"name": "u", "user": user}],
        contexts=[context("c", "c", "u")],
        **{"current-context": "c"},
    )
    conn = await resolve(str(path), environ=dict(os.environ))
    assert conn.server == "https://api:6443" and conn.insecure
    assert conn.authorization == "Bearer from-plugin"


def test_basic_auth_is_a_header() -> None:
    merged = {
        "clusters": [cluster("c", "https://x")],
        "users": [{"name": "u", "user": {"username": "ann", "password": "pw"}}],
        "contexts": [context("c", "c", "u")],
        "current-context": "c",
    }
    conn, _ = kubeconfig.from_kubeconfig(merged, None, "here")
    assert conn.authorization == "Basic " + base64.b64encode(b"ann:pw").decode()
