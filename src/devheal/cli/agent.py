"""``devheal agent``: run the node agent (NVML on a GPU node; simulated GPUs in the lab, one or every node)."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from devheal.cli import logs
from devheal.cli.common import Context, preflight
from devheal.model.node_devices import PLURAL

if TYPE_CHECKING:
    from devheal.agent.runner import NodeAgent
    from devheal.agent.simulated import LabDeviceFeed
    from devheal.kube.client import KubeClient

KUBELET_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class Backend(StrEnum):
    NVML = "nvml"
    SIMULATED = "simulated"


def agent(
    node_name: Annotated[
        list[str] | None,
        typer.Option(
            envvar="NODE_NAME",
            help="This node's name (in a pod: from the downward API). Simulated backend: repeat for several nodes.",
        ),
    ] = None,
    backend: Annotated[Backend, typer.Option(help="Where device telemetry comes from.")] = Backend.NVML,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            help="Kubeconfig path (the lab's with --lab-dir; else $KUBECONFIG, ~/.kube/config, the service account)."
        ),
    ] = None,
    context: Context = None,
    pod_resources_socket: Annotated[
        Path | None,
        typer.Option(help=f"The kubelet's pod-resources socket (default {KUBELET_SOCKET}; the lab's with --lab-dir)."),
    ] = None,
    lab_dir: Annotated[
        Path | None, typer.Option(help="Simulated backend: the lab directory (control URL, sockets, kubeconfig).")
    ] = None,
    lab_url: Annotated[
        str | None, typer.Option(help="Simulated backend: the node simulator's URL, instead of --lab-dir.")
    ] = None,
    lab_state_file: Annotated[
        Path | None,
        typer.Option(
            help="Simulated backend: this node's GPU state file, instead of --lab-dir or --lab-url "
            "(an agent pod on a real lab node: <lab dir>/nodes/<node>/gpus.json, mounted from the host).",
        ),
    ] = None,
    all_nodes: Annotated[
        bool,
        typer.Option("--all-nodes", help="Simulated backend with --lab-dir: one agent per lab node, in this process."),
    ] = False,
    poll_interval: Annotated[float, typer.Option(help="Seconds between samples.")] = 1.0,
    publish_interval: Annotated[
        float, typer.Option(help="Least seconds between two NodeDevices writes (health changes are written at once).")
    ] = 0.5,
    classification: Annotated[
        Path | None, typer.Option(help="Classification override file (YAML), e.g. a mounted ConfigMap.")
    ] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics on this port.")] = None,
    metrics_address: Annotated[str, typer.Option(help="Address to serve metrics on.")] = "0.0.0.0",
    delete_on_exit: Annotated[bool, typer.Option(help="Delete the NodeDevices objects when stopping (lab).")] = False,
    log_level: logs.LogLevel = "INFO",
    log_format: logs.LogFormatOption = logs.LogFormat.AUTO,
) -> None:
    """Publish the health of this node's GPUs (NVML) and the pods using them as NodeDevices.

    Exits 2 on bad options or a kubeconfig that cannot be used, 1 when the API server cannot
    be reached or does not serve NodeDevices (install devheal's CRDs with `devheal crds apply`).
    """
    logs.setup(log_level, log_format)
    from devheal.agent.classification import ClassificationError
    from devheal.agent.metrics import AgentMetrics
    from devheal.agent.nvml import NvmlBackend
    from devheal.agent.runner import AgentOptions, ClassificationSource, NodeAgent, serve
    from devheal.agent.simulated import LabDeviceFeed, SimulatedBackend
    from devheal.agent.telemetry import TelemetryBackend, TelemetryUnavailable
    from devheal.lab.cluster import Lab, LabError

    if poll_interval <= 0 or publish_interval < 0:
        raise typer.BadParameter("--poll-interval must be > 0 and --publish-interval >= 0")
    try:
        table = ClassificationSource(classification)
    except ClassificationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--classification") from exc

    lab = Lab(lab_dir) if lab_dir is not None else None
    feed: LabDeviceFeed | None = None
    if backend is Backend.SIMULATED:
        if lab_state_file is not None:
            if lab is not None or lab_url or all_nodes:
                raise typer.BadParameter(
                    "--lab-state-file is one node's GPUs: give it without --lab-dir, --lab-url and --all-nodes",
                    param_hint="--lab-state-file",
                )
            feed = LabDeviceFeed(None, state_file=lab_state_file, interval=0.25)
        else:
            try:
                url = lab_url or (lab.control_url() if lab is not None else None)
            except LabError as exc:
                raise typer.BadParameter(str(exc), param_hint="--lab-dir") from exc
            if url is None:
                raise typer.BadParameter(
                    "the simulated backend needs --lab-dir, --lab-url or --lab-state-file", param_hint="--backend"
                )
            # With the lab directory at hand, the feed reads the simulator only when its state file changes.
            feed = (
                LabDeviceFeed(url, state_file=lab.devices_path, interval=0.25)
                if lab is not None
                else LabDeviceFeed(url)
            )
        if lab is not None and kubeconfig is None:
            kubeconfig = str(lab.kubeconfig)
    elif all_nodes or lab_url or lab_state_file:
        raise typer.BadParameter(
            "--all-nodes, --lab-url and --lab-state-file need --backend simulated", param_hint="--backend"
        )

    if all_nodes:
        if feed is None or lab is None:
            raise typer.BadParameter("--all-nodes needs --backend simulated and --lab-dir", param_hint="--all-nodes")
        try:
            nodes = sorted((feed.fetch("/v1/nodes").get("nodes") or {}).keys())
        except TelemetryUnavailable as exc:
            raise typer.BadParameter(str(exc), param_hint="--lab-dir") from exc
    elif node_name:
        nodes = list(dict.fromkeys(node_name))
        if backend is Backend.NVML and len(nodes) > 1:
            raise typer.BadParameter("the nvml backend watches this node only: give one --node-name")
    else:
        raise typer.BadParameter("name the node: --node-name NAME (or $NODE_NAME), or --all-nodes in the lab")

    def socket_for(node: str) -> Path:
        if pod_resources_socket is not None and len(nodes) == 1:
            return pod_resources_socket
        if lab is not None:
            return lab.pod_resources_socket(node)
        return KUBELET_SOCKET

    metrics = AgentMetrics()

    def make_agents(kube: KubeClient) -> list[NodeAgent]:
        agents = []
        for node in nodes:
            telemetry: TelemetryBackend = SimulatedBackend(feed, node) if feed is not None else NvmlBackend()
            options = AgentOptions(
                node=node,
                pod_resources_socket=socket_for(node),
                poll_interval=poll_interval,
                publish_interval=publish_interval,
            )
            agents.append(NodeAgent(kube, telemetry, options, table, metrics))
        return agents

    try:
        preflight("agent", kubeconfig, (PLURAL,), context=context)
        asyncio.run(
            serve(
                kubeconfig,
                make_agents,
                metrics_port=metrics_port,
                metrics_address=metrics_address,
                delete_on_exit=delete_on_exit,
                context=context,
            )
        )
    finally:
        if feed is not None:
            feed.stop()
