"""``devheal barrier`` and ``devheal sidecar``: in-place gang restarts through KEP-5532 ``RestartAllContainers``.

Both run on a training pod's restart path, so the modules they need are imported when they
run, never to parse options or print help.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import typer

from devheal.cli import logs
from devheal.cli.common import USAGE_ERROR, Context, Kubeconfig, explain, fail
from devheal.cli.launch import GangLabel, PodName, PodNamespace, own_pod
from devheal.model.cluster import GANG_LABEL
from devheal.model.restarts import DEFAULT_TRIGGER_EXIT_CODE

if TYPE_CHECKING:
    from devheal.launch.gang import KubeGang


def _run(
    what: str,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    pod: str,
    gang_label: str,
    body: Callable[[KubeGang], Awaitable[int]],
) -> None:
    from devheal.kube import errors
    from devheal.kube.client import KubeClient
    from devheal.launch.gang import KubeGang
    from devheal.launch.restart_all import SidecarError

    async def main() -> int:
        async with await KubeClient.connect(kubeconfig, context=context, max_connections=4) as kube:
            return await body(KubeGang(kube, namespace, pod, gang_label))

    try:
        code = asyncio.run(main())
    except errors.NotFound as exc:
        fail(what, f"pod {namespace}/{pod} not found (--pod, --namespace): {exc}", USAGE_ERROR)
    except SidecarError as exc:
        fail(what, str(exc), USAGE_ERROR)
    except errors.KubeError as exc:
        # The pod cannot start its containers meaningfully without the API server: "cannot work at all".
        fail(what, explain(exc)[0], USAGE_ERROR)
    raise typer.Exit(code)


def barrier(
    pod: PodName = "",
    namespace: PodNamespace = "",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    barrier_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the gang before letting the pod start anyway (with a warning).")
    ] = 120.0,
    gang_label: GangLabel = GANG_LABEL,
    log_level: logs.LogLevel = "INFO",
    log_format: logs.LogFormatOption = logs.LogFormat.AUTO,
) -> None:
    """Init container: acknowledge this pod's restart generation, then wait until the whole gang has.

    Run it as a regular init container before `devheal sidecar`. Exits 0 when the gang is
    there (or the wait timed out), 143 when told to stop, 2 when it cannot work at all.
    """
    logs.setup(log_level, log_format)
    namespace = own_pod(pod, namespace)
    if barrier_timeout < 0:
        raise typer.BadParameter(f"must be >= 0, got {barrier_timeout}", param_hint="--barrier-timeout")
    from devheal.launch.restart_all import run_barrier

    _run("barrier", kubeconfig, context, namespace, pod, gang_label, lambda gang: run_barrier(gang, barrier_timeout))


def sidecar(
    pod: PodName = "",
    namespace: PodNamespace = "",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    exit_code: Annotated[
        int,
        typer.Option(
            min=1,
            max=255,
            help="The exit code that the sidecar's restartPolicyRules map to RestartAllContainers.",
        ),
    ] = DEFAULT_TRIGGER_EXIT_CODE,
    log_level: logs.LogLevel = "INFO",
    log_format: logs.LogFormatOption = logs.LogFormat.AUTO,
) -> None:
    """Sidecar: exit with --exit-code when this pod's restart generation rises, so the kubelet restarts all containers.

    Needs `restartPolicy: Always` and a restartPolicyRules entry with action
    RestartAllContainers for that code on this container (checked at start: exits 2 with
    the reason when no container of the pod has one).
    """
    logs.setup(log_level, log_format)
    namespace = own_pod(pod, namespace)
    from devheal.launch.restart_all import run_sidecar

    _run("sidecar", kubeconfig, context, namespace, pod, GANG_LABEL, lambda gang: run_sidecar(gang, exit_code))
