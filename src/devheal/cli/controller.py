"""``devheal controller``: run the remediation controller."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer

from devheal.cli import logs
from devheal.cli.common import Context, Kubeconfig, preflight


def controller(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    dry_run: Annotated[bool, typer.Option(help="Decide and record Remediations, change nothing else.")] = False,
    paused: Annotated[bool, typer.Option(help="Record findings, take no action at all.")] = False,
    leader_elect: Annotated[bool, typer.Option(help="Take the leader Lease before acting (run 2 replicas).")] = True,
    lease_namespace: Annotated[
        str, typer.Option(help="Namespace of the leader Lease (default: $POD_NAMESPACE or kube-system).")
    ] = "",
    lease_duration: Annotated[float, typer.Option(help="Seconds a leader's lease lasts without renewal.")] = 15.0,
    gang_restart_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a gang restart may take before it ends as Failed (reason Timeout), naming the lagging ranks."
        ),
    ] = 900.0,
    dra: Annotated[
        bool,
        typer.Option(
            help="Watch DRA ResourceSlices and quarantine failed DRA devices with DeviceTaintRules "
            "(resource.k8s.io/v1, Kubernetes 1.37; docs/dra.md)."
        ),
    ] = False,
    gpu_resource: Annotated[
        list[str] | None,
        typer.Option(
            help="An extended resource that is a GPU (repeat for several; default nvidia.com/gpu). "
            "nvidia.com/mig-<profile> resources always count."
        ),
    ] = None,
    full_round_every: Annotated[
        float,
        typer.Option(
            help="Seconds within which every node is judged again, a slice of the fleet at each round: the safety "
            "net of the rounds, which look only at the nodes that changed and those that can matter. 0: every "
            "round is full (every node looked at)."
        ),
    ] = 60.0,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics on this port.")] = None,
    log_level: logs.LogLevel = "INFO",
    log_format: logs.LogFormatOption = logs.LogFormat.AUTO,
) -> None:
    """Watch device signals, decide with the policies, remediate within the safety rails.

    Exits 2 when the kubeconfig cannot be used, 1 when the API server cannot be reached or
    does not serve devheal's resources (install them with `devheal crds apply`).
    """
    if full_round_every < 0:
        raise typer.BadParameter(f"must be >= 0, got {full_round_every}", param_hint="--full-round-every")
    if gang_restart_timeout <= 0:
        raise typer.BadParameter(f"must be > 0, got {gang_restart_timeout}", param_hint="--gang-restart-timeout")
    from devheal.model.gpu_resources import DEFAULT_GPU_RESOURCES, GpuResources

    try:
        gpus = GpuResources(tuple(gpu_resource or DEFAULT_GPU_RESOURCES))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--gpu-resource") from None
    logs.setup(log_level, log_format)
    preflight("controller", kubeconfig, context=context)
    from devheal.controller.cache import collect_garbage_less_often
    from devheal.controller.loop import ControllerOptions, serve

    options = ControllerOptions(
        dry_run=dry_run,
        paused=paused,
        leader_elect=leader_elect,
        lease_namespace=lease_namespace or os.environ.get("POD_NAMESPACE") or "kube-system",
        lease_duration=lease_duration,
        gang_restart_timeout=gang_restart_timeout,
        dra=dra,
        gpu_resources=gpus,
        full_round_every=full_round_every,
        renew_deadline=lease_duration * 2 / 3,
        retry_period=max(0.5, lease_duration / 7.5),
    )
    collect_garbage_less_often()
    asyncio.run(serve(kubeconfig, options, metrics_port, context=context))
