"""``devheal doctor``: check a cluster for what devheal needs, and say what is missing."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from devheal.cli.common import Context, Kubeconfig, explain, fail


def doctor(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    service_account: Annotated[
        str, typer.Option(help="The controller's service account, namespace/name, whose permissions are checked.")
    ] = "devheal-system/devheal-controller",
    namespace: Annotated[
        str, typer.Option(help="Namespace for the RestartAllContainers dry-run probe (nothing is created).")
    ] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Check a cluster for devheal: CRDs, policies, agents, templates, KEP-4680, RestartAllContainers, gang Jobs, RBAC.

    Reads only. Each check prints ok, warn or fail with what to do. Exits 0 when nothing
    fails, 1 when a check fails, 2 when the cluster cannot be asked.
    """
    if "/" not in service_account:
        raise typer.BadParameter(f"expected namespace/name, got {service_account!r}", param_hint="--service-account")
    from devheal.controller.doctor import FAIL, Check, run_checks
    from devheal.kube import errors
    from devheal.kube.client import KubeClient

    async def main() -> list[Check]:
        async with await KubeClient.connect(kubeconfig, context=context, max_connections=2) as kube:
            return await run_checks(kube, account=service_account, namespace=namespace)

    try:
        checks = asyncio.run(main())
    except errors.KubeError as exc:
        fail("doctor", explain(exc)[0], 2)
    if as_json:
        typer.echo(json.dumps([{"check": c.name, "status": c.status, "detail": c.detail} for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            typer.echo(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
    raise typer.Exit(1 if any(c.status == FAIL for c in checks) else 0)
