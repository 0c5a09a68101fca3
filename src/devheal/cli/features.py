"""``devheal features``: what this cluster supports for restarting gangs in place."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from devheal.cli.common import Context, Kubeconfig, explain, fail
from devheal.model.restarts import RESTART_ALL_FEATURE


def features(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    namespace: Annotated[
        str, typer.Option(help="Namespace for the dry-run probe pod (nothing is created).")
    ] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Detect KEP-5532 RestartAllContainers: does the API server accept it, do the nodes declare it?

    Exits 0 when it is usable (accepted, and declared by at least one node), 1 when it is not,
    2 when the cluster cannot be asked.
    """
    from devheal.kube import errors
    from devheal.kube.client import KubeClient
    from devheal.kube.features import RestartAllSupport, detect_restart_all

    async def main() -> RestartAllSupport:
        async with await KubeClient.connect(kubeconfig, context=context, max_connections=2) as kube:
            return await detect_restart_all(kube, namespace)

    try:
        support = asyncio.run(main())
    except errors.KubeError as exc:
        fail("features", explain(exc)[0], 2)
    if as_json:
        typer.echo(json.dumps({"restartAllContainers": support.as_json()}, indent=2))
    else:
        verdict = (
            "usable: gangs can restart in place with `devheal sidecar` + `devheal barrier` (or the launcher)"
            if support.usable
            else "not usable here: restart gangs in place with the launcher (`devheal launch`)"
        )
        typer.echo("RestartAllContainers (KEP-5532)")
        typer.echo(f"  API server: {support.detail}")
        typer.echo(f"  nodes:      {support.nodes_declaring}/{support.nodes} declare {RESTART_ALL_FEATURE}")
        typer.echo(f"  verdict:    {verdict}")
    raise typer.Exit(0 if support.usable else 1)
