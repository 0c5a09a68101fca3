"""``devheal barrier`` and ``devheal sidecar``: in-place gang restarts through KEP-5532 ``RestartAllContainers``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated

import typer

from devheal.cli.launch import (
    USAGE_ERROR,
    GangLabel,
    Kubeconfig,
    LogLevel,
    PodName,
    PodNamespace,
    own_pod,
    setup_logging,
)
from devheal.engine.inplace import DEFAULT_TRIGGER_EXIT_CODE
from devheal.kube import errors
from devheal.kube.client import KubeClient
from devheal.launch.gang import KubeGang
from devheal.launch.restart_all import SidecarError, run_barrier, run_sidecar
from devheal.model.cluster import GANG_LABEL


def _run(
    what: str,
    kubeconfig: str | None,
    namespace: str,
    pod: str,
    gang_label: str,
    body: Callable[[KubeGang], Awaitable[int]],
) -> None:
    async def main() -> int:
        async with await KubeClient.connect(kubeconfig, max_connections=4) as kube:
            return await body(KubeGang(kube, namespace, pod, gang_label))

    try:
        code = asyncio.run(main())
    except errors.NotFound as exc:
        typer.echo(f"devheal {what}: pod {namespace}/{pod} not found (--pod, --namespace): {exc}", err=True)
        raise typer.Exit(USAGE_ERROR) from exc
    except (errors.PermanentError, SidecarError) as exc:
        typer.echo(f"devheal {what}: {exc}", err=True)
        raise typer.Exit(USAGE_ERROR) from exc
    raise typer.Exit(code)


def barrier(
    pod: PodName = "",
    namespace: PodNamespace = "",
    kubeconfig: Kubeconfig = None,
    barrier_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the gang before letting the pod start anyway (with a warning).")
    ] = 120.0,
    gang_label: GangLabel = GANG_LABEL,
    log_level: LogLevel = "INFO",
) -> None:
    """Init container: acknowledge this pod's restart generation, then wait until the whole gang has.

    Run it as a regular init container before `devheal sidecar`. Exits 0 when the gang is
    there (or the wait timed out), 143 when told to stop, 2 when it cannot work at all.
    """
    setup_logging(log_level)
    namespace = own_pod(pod, namespace)
    if barrier_timeout < 0:
        raise typer.BadParameter(f"must be >= 0, got {barrier_timeout}", param_hint="--barrier-timeout")
    _run("barrier", kubeconfig, namespace, pod, gang_label, lambda gang: run_barrier(gang, barrier_timeout))


def sidecar(
    pod: PodName = "",
    namespace: PodNamespace = "",
    kubeconfig: Kubeconfig = None,
    exit_code: Annotated[
        int,
        typer.Option(
            min=1,
            max=255,
            help="The exit code that the sidecar's restartPolicyRules map to RestartAllContainers.",
        ),
    ] = DEFAULT_TRIGGER_EXIT_CODE,
    log_level: LogLevel = "INFO",
) -> None:
    """Sidecar: exit with --exit-code when this pod's restart generation rises, so the kubelet restarts all containers.

    Needs `restartPolicy: Always` and a restartPolicyRules entry with action
    RestartAllContainers for that code on this container (checked at start: exits 2 with
    the reason when no container of the pod has one).
    """
    setup_logging(log_level)
    namespace = own_pod(pod, namespace)
    _run("sidecar", kubeconfig, namespace, pod, GANG_LABEL, lambda gang: run_sidecar(gang, exit_code))
