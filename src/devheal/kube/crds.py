"""Install devheal's custom resource definitions and wait until the API server serves them.

``install_crds`` server-side-applies every manifest of ``devheal.crds`` (field manager
``devheal``), so it is idempotent: running it again, from several processes at once or
after an upgrade changed a schema, converges on the packaged definitions. It returns once
each definition reports ``NamesAccepted`` and ``Established`` and a list of its resource
succeeds (right after ``Established`` the API server may still answer 429 "storage is
(re)initializing" while it fills its watch cache), and raises ``CRDNotEstablished`` naming
the definition otherwise.

``check_installed`` tells at a command's start whether the API server serves devheal's
resources (discovery, which every authenticated user may read), so a controller or agent
on a cluster without the definitions stops with one line saying how to install them
instead of retrying 404s forever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from devheal import crds
from devheal.kube import errors
from devheal.kube.client import KubeClient, api_path
from devheal.model.api import GROUP, GROUP_VERSION

CRD_API = "apiextensions.k8s.io/v1"
FIELD_MANAGER = "devheal"

PLURALS = ("remediationpolicies", "remediations", "nodedevices")
CRD_NAMES = tuple(f"{plural}.{GROUP}" for plural in PLURALS)
"""The CustomResourceDefinitions devheal installs, in the order of ``devheal.crds.manifests()``."""

_READY = ("NamesAccepted", "Established")
_POLL = 0.1


INSTALL_HINT = "run `devheal crds apply` (with the same --kubeconfig/--context), or apply src/devheal/crds/*.yaml"


class CRDNotEstablished(errors.KubeError):
    """A CustomResourceDefinition was applied but the API server did not start serving it."""


class CRDsMissing(errors.PermanentError):
    """The API server does not serve (some of) devheal's resources: the definitions are not installed."""


async def check_installed(client: KubeClient, plurals: tuple[str, ...] = PLURALS) -> None:
    """Raise ``CRDsMissing`` unless the API server serves every one of ``plurals`` in devheal's group.

    Other errors (unreachable server, refused credentials) propagate as they are.
    """
    try:
        listing = await client.get(f"/apis/{GROUP_VERSION}")
    except errors.NotFound:
        served: set[str] = set()
    else:
        served = {str(r.get("name")) for r in listing.get("resources") or [] if isinstance(r, Mapping)}
    missing = [p for p in plurals if p not in served]
    if missing:
        raise CRDsMissing(
            f"devheal's CRDs are not installed (the API server does not serve {', '.join(missing)} "
            f"in {GROUP_VERSION}): {INSTALL_HINT}"
        )


def crd_path(name: str) -> str:
    return api_path(CRD_API, "customresourcedefinitions", name=name)


def _conditions(crd: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    items = (crd.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in items if isinstance(c, Mapping)}


def _describe(conditions: Mapping[str, Mapping[str, Any]]) -> str:
    if not conditions:
        return "no conditions yet"
    return "; ".join(
        f"{kind}={c.get('status')}" + (f" ({c.get('reason')}: {c.get('message')})" if c.get("message") else "")
        for kind, c in sorted(conditions.items())
    )


def _ready(conditions: Mapping[str, Mapping[str, Any]]) -> bool:
    return all(conditions.get(kind, {}).get("status") == "True" for kind in _READY)


def _names_rejected(conditions: Mapping[str, Mapping[str, Any]]) -> bool:
    """The API server refused the names (a conflict with another definition): waiting will not help."""
    return conditions.get("NamesAccepted", {}).get("status") == "False"


async def install_crds(client: KubeClient, timeout: float = 30.0) -> None:
    """Apply every devheal CRD and wait until each is ``NamesAccepted`` and ``Established``."""
    deadline = time.monotonic() + timeout
    applied: dict[str, dict[str, Any]] = {}
    manifests = crds.manifests()
    for manifest in manifests:
        name = str(manifest["metadata"]["name"])
        try:
            applied[name] = await client.apply(crd_path(name), manifest, field_manager=FIELD_MANAGER)
        except errors.KubeError as exc:
            raise type(exc)(
                f"CustomResourceDefinition {name}: apply failed: {exc}",
                status=exc.status,
                reason=exc.reason,
                body=exc.body,
            ) from exc
    for name, crd in applied.items():
        await _wait_established(client, name, crd, deadline, timeout)
    for manifest in manifests:
        await _wait_served(client, manifest, deadline, timeout)


async def _wait_established(
    client: KubeClient, name: str, crd: dict[str, Any], deadline: float, timeout: float
) -> None:
    while True:
        conditions = _conditions(crd)
        if _ready(conditions):
            return
        if _names_rejected(conditions):
            raise CRDNotEstablished(f"CustomResourceDefinition {name}: names not accepted: {_describe(conditions)}")
        if time.monotonic() >= deadline:
            raise CRDNotEstablished(
                f"CustomResourceDefinition {name}: not established within {timeout:g}s: {_describe(conditions)}"
            )
        await asyncio.sleep(_POLL)
        try:
            crd = await client.get(crd_path(name))
        except errors.TemporaryError:
            continue


async def _wait_served(client: KubeClient, manifest: Mapping[str, Any], deadline: float, timeout: float) -> None:
    """List the resource until the API server answers (its storage is ready)."""
    name = str(manifest["metadata"]["name"])
    spec = manifest["spec"]
    versions = [v["name"] for v in spec["versions"] if v.get("served")]
    path = api_path(f"{spec['group']}/{versions[0]}", spec["names"]["plural"])
    while True:
        try:
            await client.get(path, limit=1)
            return
        except (errors.TemporaryError, errors.NotFound) as exc:
            # NotFound: discovery of a brand-new resource can lag behind Established.
            if time.monotonic() >= deadline:
                raise CRDNotEstablished(
                    f"CustomResourceDefinition {name}: established, but {path} not served within {timeout:g}s: {exc}"
                ) from exc
        await asyncio.sleep(_POLL)
