"""``devheal crds apply``: install (or upgrade) devheal's CustomResourceDefinitions in a cluster."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from devheal.cli.common import Context, Kubeconfig, explain, fail

app = typer.Typer(
    help="devheal's CustomResourceDefinitions (RemediationPolicy, Remediation, NodeDevices).",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
)


@app.callback()
def crds() -> None:
    """devheal's CustomResourceDefinitions (RemediationPolicy, Remediation, NodeDevices)."""
    # A callback keeps `devheal crds apply` a sub-command (typer would make a lone command the group).


@app.command()
def apply(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait until the API server serves every resource.")] = 30.0,
) -> None:
    """Server-side apply src/devheal/crds/*.yaml and wait until the API server serves them.

    Idempotent: run it again after an upgrade. Needs permission to create and patch
    customresourcedefinitions (cluster admin). Exits 2 when the kubeconfig cannot be used,
    1 when the cluster refused or did not serve the definitions in time.
    """
    if timeout <= 0:
        raise typer.BadParameter(f"must be > 0, got {timeout}", param_hint="--timeout")
    from devheal.kube import errors
    from devheal.kube.client import KubeClient
    from devheal.kube.crds import CRD_NAMES, install_crds

    async def main() -> None:
        async with await KubeClient.connect(kubeconfig, context=context, max_connections=4) as kube:
            await install_crds(kube, timeout)

    try:
        asyncio.run(main())
    except errors.KubeError as exc:
        message, code = explain(exc)
        fail("crds apply", message, code)
    for name in CRD_NAMES:
        typer.echo(f"customresourcedefinition {name} applied and served")
