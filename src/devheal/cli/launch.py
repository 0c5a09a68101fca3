"""``devheal launch -- CMD ARGS``: run a training command in its pod and restart it in place with its gang."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from devheal.cli import logs
from devheal.cli.common import USAGE_ERROR, Context, Kubeconfig, explain
from devheal.launch.steps import DEFAULT_WINDOW
from devheal.model.cluster import GANG_LABEL

if TYPE_CHECKING:
    from devheal.launch.launcher import LaunchOptions

# The launcher (aiohttp, the Kubernetes client) is imported when the command runs, not for --help.

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def parse_exit_codes(text: str) -> frozenset[int]:
    """``"74,79"`` -> {74, 79}; raises ValueError naming the bad entry."""
    codes: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= 255:
            raise ValueError(f"expected comma-separated exit codes within 1..255, got {part!r}")
        codes.add(int(part))
    return frozenset(codes)


def _namespace_of_service_account() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return ""


PodName = Annotated[
    str, typer.Option(envvar="POD_NAME", help="This pod's name (in a pod: $POD_NAME from the downward API).")
]
PodNamespace = Annotated[
    str,
    typer.Option(
        envvar="POD_NAMESPACE",
        help="This pod's namespace (in a pod: $POD_NAMESPACE, else the service account's namespace).",
    ),
]
GangLabel = Annotated[str, typer.Option(help="Pods with the same value of this label form the gang.")]


def own_pod(pod: str, namespace: str) -> str:
    """Check that this pod is named; its namespace (from the option, $POD_NAMESPACE or the service account)."""
    if not pod:
        raise typer.BadParameter(
            "name this pod: --pod NAME or $POD_NAME (downward API: fieldRef metadata.name)", param_hint="--pod"
        )
    namespace = namespace or _namespace_of_service_account()
    if not namespace:
        raise typer.BadParameter(
            "name this pod's namespace: --namespace NS or $POD_NAMESPACE (downward API: fieldRef metadata.namespace)",
            param_hint="--namespace",
        )
    return namespace


def launch(
    command: Annotated[
        list[str],
        typer.Argument(help="The training command and its arguments; put them after `--`.", metavar="CMD"),
    ],
    pod: PodName = "",
    namespace: PodNamespace = "",
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL when stopping the command.")] = 10.0,
    barrier_timeout: Annotated[
        float,
        typer.Option(help="Seconds to wait for the whole gang to stop before restarting anyway (with a warning)."),
    ] = 120.0,
    gang_label: GangLabel = GANG_LABEL,
    device_error_exit_codes: Annotated[
        str,
        typer.Option(help="Comma-separated exit codes of the command that mean a device error, e.g. 74,79."),
    ] = "",
    termination_log: Annotated[
        Path | None,
        typer.Option(
            help="Where to write the pod's termination message on a device error (default: /dev/termination-log)."
        ),
    ] = None,
    steps_addr: Annotated[
        str, typer.Option(help="Loopback HOST:PORT for step reports (port 0: any free port).")
    ] = "127.0.0.1:0",
    steps_window: Annotated[int, typer.Option(help="How many recent steps the step-time figures cover.")] = (
        DEFAULT_WINDOW
    ),
    steps_publish_interval: Annotated[
        float,
        typer.Option(
            help="Seconds between publications of the step-time summary on the pod (devheal.io/steps), "
            "for the controller's straggler and stall detection; 0: never publish."
        ),
    ] = 10.0,
    hold_failed: Annotated[
        float,
        typer.Option(
            help="When CMD exits by itself with a non-zero code, publish the failed run on the pod "
            "(devheal.io/launcher-failed) and wait up to this many seconds for the controller to restart the "
            "gang: CMD then starts again in place; with no restart in time, exit with CMD's code. "
            "0: exit at once (within 0..86400)."
        ),
    ] = 0.0,
    probe_store: Annotated[
        str,
        typer.Option(
            help="HOST:PORT of the gang's rendezvous store to probe (a TCP connect every --probe-interval): the "
            "step report says since when it is unreachable, and the controller names this rank when its gang "
            "stopped meanwhile (stall.unreachableAfter). Default: $MASTER_ADDR:$MASTER_PORT when both are set; "
            "'off': no probes."
        ),
    ] = "",
    probe_interval: Annotated[
        float,
        typer.Option(help="Seconds between probes of the rendezvous store, and each probe's timeout (within 1..60)."),
    ] = 5.0,
    probe_bind: Annotated[
        str,
        typer.Option(
            help="Local address the probes connect from: the interface the rank's rendezvous traffic leaves by, "
            "on a host with several (default: the system picks)."
        ),
    ] = "",
    log_level: logs.LogLevel = "INFO",
    log_format: logs.LogFormatOption = logs.LogFormat.AUTO,
) -> None:
    """Run CMD; restart it in place when the gang's restart generation rises; exit with CMD's exit code.

    With --hold-failed N, a failed CMD (non-zero exit) waits up to N seconds to be restarted in place by the
    controller before the launcher exits with its code.

    Example: devheal launch --device-error-exit-codes 74,79 -- python train.py --epochs 3
    """
    logs.setup(log_level, log_format)
    namespace = own_pod(pod, namespace)
    if grace < 0:
        raise typer.BadParameter(f"must be >= 0, got {grace}", param_hint="--grace")
    if barrier_timeout < 0:
        raise typer.BadParameter(f"must be >= 0, got {barrier_timeout}", param_hint="--barrier-timeout")
    if steps_window < 1:
        raise typer.BadParameter(f"must be >= 1, got {steps_window}", param_hint="--steps-window")
    if not 0 <= steps_publish_interval <= 3600 or (0 < steps_publish_interval < 1):
        raise typer.BadParameter(
            f"must be 0 (never) or within 1..3600 seconds, got {steps_publish_interval}",
            param_hint="--steps-publish-interval",
        )
    if not 0 <= hold_failed <= 86400:
        raise typer.BadParameter(f"must be within 0..86400 seconds, got {hold_failed}", param_hint="--hold-failed")
    try:
        codes = parse_exit_codes(device_error_exit_codes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--device-error-exit-codes") from exc
    if not 1 <= probe_interval <= 60:
        raise typer.BadParameter(f"must be within 1..60 seconds, got {probe_interval}", param_hint="--probe-interval")
    from devheal.launch.launcher import DEFAULT_TERMINATION_LOG, LaunchError, LaunchOptions
    from devheal.launch.steps_server import parse_steps_address
    from devheal.launch.store_probe import store_to_probe

    try:
        host, port = parse_steps_address(steps_addr)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--steps-addr") from exc
    try:
        store = store_to_probe(probe_store, os.environ)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--probe-store") from exc
    options = LaunchOptions(
        command=tuple(command),
        grace=grace,
        barrier_timeout=barrier_timeout,
        device_error_exit_codes=codes,
        termination_log=termination_log or DEFAULT_TERMINATION_LOG,
        steps_host=host,
        steps_port=port,
        steps_window=steps_window,
        steps_publish_interval=steps_publish_interval,
        hold_failed=hold_failed,
        store=store,
        store_probe_interval=probe_interval,
        probe_bind=probe_bind or None,
    )
    try:
        code = asyncio.run(_run(options, kubeconfig, context, namespace, pod, gang_label))
    except LaunchError as exc:
        typer.echo(f"devheal launch: {exc}", err=True)
        raise typer.Exit(USAGE_ERROR) from exc
    raise typer.Exit(code)


async def _run(
    options: LaunchOptions, kubeconfig: str | None, context: str | None, namespace: str, pod: str, gang_label: str
) -> int:
    from devheal.kube import errors
    from devheal.kube.client import KubeClient
    from devheal.launch.gang import KubeGang
    from devheal.launch.launcher import Launcher, LaunchError

    try:
        kube = await KubeClient.connect(kubeconfig, context=context, max_connections=4)
    except errors.PermanentError as exc:
        raise LaunchError(explain(exc)[0]) from exc
    async with kube:
        return await Launcher(options, KubeGang(kube, namespace, pod, gang_label)).run()
