"""Where the API server is and how to authenticate to it, found the way kubectl finds it.

Order: ``--kubeconfig PATH``; else ``$KUBECONFIG`` (a ``:``-separated list, merged: the
first file that sets a value wins, relative paths are relative to the file naming them);
else ``~/.kube/config``; else the pod's service account (in-cluster). ``--context`` picks
a context, else the ``current-context``.

Tokens, token files, client certificates, certificate authorities and basic auth are read
here, with ``yaml`` alone: importing kubernetes_asyncio takes seconds, which a command on
a training pod's restart path cannot afford. A user with an ``exec`` credential plugin or
an ``auth-provider`` is handed to kubernetes_asyncio (imported then). Every problem is a
``ConfigError`` whose message is one line saying what is wrong and what to do.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devheal.kube import errors, tokens

DEFAULT_KUBECONFIG = "~/.kube/config"
HOW = "pass --kubeconfig PATH, set KUBECONFIG, create ~/.kube/config, or run in a pod with a service account"


class ConfigError(errors.PermanentError):
    """The Kubernetes configuration cannot be used: the message says what is wrong and how to fix it."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"cannot load Kubernetes configuration from {where}: {problem}")


@dataclass(frozen=True)
class Connection:
    """An API server and the credentials for it."""

    server: str
    source: str
    """Where it came from, for messages: ``/a/b (context lab)`` or ``the in-cluster service account``."""
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    authorization: str | None = None
    """A fixed ``Authorization`` header (a token or basic auth)."""
    token_file: Path | None = None
    """A token file read again when it changes (in-cluster, a kubeconfig user's ``tokenFile``)."""

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings of this connection (client certificate included)."""
        if self.insecure:
            # Nothing is verified: do not load the system's certificate authorities (tens of ms).
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            try:
                context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(self.source, f"cannot read the certificate authority: {_one_line(exc)}") from exc
        if self.cert_file or self.cert_data:
            try:
                _load_client_certificate(context, self)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(self.source, f"cannot read the client certificate: {_one_line(exc)}") from exc
        return context


def _one_line(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())


def _load_client_certificate(context: ssl.SSLContext, conn: Connection) -> None:
    """``ssl`` loads certificates from files only: inline data goes through private temporary files."""
    made: list[str] = []
    try:
        paths: list[str | None] = []
        for path, data in ((conn.cert_file, conn.cert_data), (conn.key_file, conn.key_data)):
            if data is not None:
                fd, name = tempfile.mkstemp(prefix="devheal-", suffix=".pem")
                made.append(name)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                path = name
            paths.append(path)
        cert, key = paths
        assert cert is not None
        context.load_cert_chain(cert, keyfile=key)
    finally:
        for name in made:
            Path(name).unlink(missing_ok=True)


def kubeconfig_files(kubeconfig: str | None, environ: Mapping[str, str]) -> tuple[list[Path], str]:
    """The kubeconfig files to merge (only those that exist) and how they were chosen, for messages."""
    if kubeconfig is not None:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise ConfigError(str(path), "no such file (--kubeconfig): give the path of a kubeconfig file")
        return [path], str(path)
    listed = environ.get("KUBECONFIG", "")
    if listed:
        paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        return [p for p in paths if p.is_file()], f"KUBECONFIG={listed}"
    default = Path(DEFAULT_KUBECONFIG).expanduser()
    return ([default] if default.is_file() else []), str(default)


def _read(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read it: {_one_line(exc)}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"not valid YAML ({_one_line(exc)}): fix or replace the file") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigError(str(path), f"expected a kubeconfig mapping (clusters, users, ...), got {kind}")
    return loaded


_PATH_FIELDS = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key", "tokenFile")}


def merge(paths: list[Path]) -> dict[str, Any]:
    """Merge kubeconfig files as kubectl does: the first file that sets a value (or names an entry) wins.

    Relative file paths inside an entry become absolute, relative to the file naming them.
    """
    merged: dict[str, Any] = {"clusters": [], "contexts": [], "users": [], "current-context": ""}
    for path in paths:
        config = _read(path)
        if not merged["current-context"] and config.get("current-context"):
            merged["current-context"] = str(config["current-context"])
        for section, kind in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
            entries = config.get(section) or []
            if not isinstance(entries, list):
                raise ConfigError(str(path), f"{section} is not a list: fix the file")
            known = {e["name"] for e in merged[section]}
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get(kind) or {}, dict):
                    problem = f"an entry of {section} is not a {{name, {kind}}} mapping: fix the file"
                    raise ConfigError(str(path), problem)
                name = str(entry.get("name") or "")
                if not name or name in known:
                    continue
                body = dict(entry.get(kind) or {})
                for key in _PATH_FIELDS.get(kind, ()):
                    if body.get(key):
                        body[key] = str((path.parent / Path(str(body[key])).expanduser()).absolute())
                merged[section].append({"name": name, kind: body})
                known.add(name)
    return merged


def _named(merged: Mapping[str, Any], section: str, kind: str, name: str) -> dict[str, Any] | None:
    for entry in merged[section]:
        if entry["name"] == name:
            found: dict[str, Any] = entry[kind]
            return found
    return None


def from_kubeconfig(merged: Mapping[str, Any], context: str | None, where: str) -> tuple[Connection, bool]:
    """The connection of ``context`` (else the current context); True when its user needs kubernetes_asyncio."""
    names = [c["name"] for c in merged["contexts"]]
    choices = ", ".join(names) or "none defined"
    name = context or merged["current-context"]
    if not name:
        raise ConfigError(where, f"no current-context is set: pass --context NAME (contexts: {choices})")
    ctx = _named(merged, "contexts", "context", name)
    if ctx is None:
        hint = "--context" if context else "current-context"
        raise ConfigError(where, f"no context {name!r} ({hint}): use one of its contexts ({choices})")
    source = f"{where} (context {name})"
    cluster = _named(merged, "clusters", "cluster", str(ctx.get("cluster") or ""))
    if cluster is None:
        raise ConfigError(source, f"the context names cluster {ctx.get('cluster')!r}, which is not defined")
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(source, f"cluster {ctx.get('cluster')!r} has no https:// server ({server!r})")
    user = _named(merged, "users", "user", str(ctx.get("user") or "")) if ctx.get("user") else {}
    if user is None:
        raise ConfigError(source, f"the context names user {ctx.get('user')!r}, which is not defined")
    needs_plugin = bool(user.get("exec") or user.get("auth-provider"))
    authorization = None
    if user.get("token"):
        authorization = f"Bearer {user['token']}"
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password') or ''}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode()
    connection = Connection(
        server=server,
        source=source,
        ca_file=cluster.get("certificate-authority") or None,
        ca_data=_decode(cluster.get("certificate-authority-data"), source, "certificate-authority-data"),
        cert_file=user.get("client-certificate") or None,
        key_file=user.get("client-key") or None,
        cert_data=_decoded_bytes(user.get("client-certificate-data"), source, "client-certificate-data"),
        key_data=_decoded_bytes(user.get("client-key-data"), source, "client-key-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name") or None,
        authorization=authorization,
        token_file=Path(user["tokenFile"]) if user.get("tokenFile") else None,
    )
    return connection, needs_plugin


def _decoded_bytes(value: Any, source: str, key: str) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError as exc:
        raise ConfigError(source, f"{key} is not base64: fix the kubeconfig") from exc


def _decode(value: Any, source: str, key: str) -> str | None:
    data = _decoded_bytes(value, source, key)
    return data.decode("ascii", errors="replace") if data is not None else None


def in_cluster(environ: Mapping[str, str]) -> Connection | None:
    """The pod's service account, when this runs in a pod (the API server's address in the environment)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not tokens.IN_CLUSTER_TOKEN.is_file():
        return None
    if ":" in host:
        host = f"[{host}]"  # IPv6
    return Connection(
        server=f"https://{host}:{port}",
        source="the in-cluster service account",
        ca_file=str(tokens.IN_CLUSTER_CA),
        token_file=tokens.IN_CLUSTER_TOKEN,
    )


async def resolve(
    kubeconfig: str | None = None, context: str | None = None, environ: Mapping[str, str] | None = None
) -> Connection:
    """The connection to use, in kubectl's order; raises ``ConfigError`` saying what to fix."""
    env = os.environ if environ is None else environ
    paths, where = kubeconfig_files(kubeconfig, env)
    if paths:
        merged = merge(paths)
        connection, needs_plugin = from_kubeconfig(merged, context, where)
        if needs_plugin:
            return await _through_plugin(merged, connection, context)
        return connection
    pod = in_cluster(env)
    if pod is not None:
        if context:
            raise ConfigError(pod.source, f"--context {context}: a service account has no contexts; {HOW}")
        return pod
    if env.get("KUBECONFIG"):
        raise ConfigError(where, "none of these files exists: fix KUBECONFIG or pass --kubeconfig")
    raise ConfigError(where, f"no such file, and not in a pod: {HOW}")


async def _through_plugin(merged: Mapping[str, Any], connection: Connection, context: str | None) -> Connection:
    """A user with an ``exec`` plugin or an ``auth-provider``: kubernetes_asyncio runs it."""
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    cfg = k8s_client.Configuration()
    try:
        await k8s_config.load_kube_config_from_dict(dict(merged), context=context, client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        raise ConfigError(connection.source, f"the user's credential plugin failed: {_one_line(exc)}") from exc
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if token and not token.lower().startswith(("bearer ", "basic ")):
        token = f"{cfg.api_key_prefix.get('authorization', 'Bearer')} {token}"
    return Connection(
        server=str(cfg.host or connection.server).rstrip("/"),
        source=connection.source,
        ca_file=cfg.ssl_ca_cert or None,
        cert_file=cfg.cert_file or None,
        key_file=cfg.key_file or None,
        insecure=not cfg.verify_ssl,
        tls_server_name=connection.tls_server_name,
        authorization=token or connection.authorization,
    )
