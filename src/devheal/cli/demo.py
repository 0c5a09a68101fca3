"""``devheal demo``: bring up the lab, break GPUs on purpose, and watch devheal heal the cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer


def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Leave the lab running afterwards, for exploring.")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", help="Plain output (for logs and CI).")] = False,
    nodes: Annotated[int, typer.Option(help="Simulated GPU nodes (at least 3; the last one is an idle spare).")] = 4,
    observe_seconds: Annotated[float, typer.Option(help="Extra seconds to watch the cluster at the end.")] = 0.0,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Lab directory (default: ~/.local/state/devheal/demo).")
    ] = None,
    real_nodes: Annotated[
        bool,
        typer.Option(
            "--real-nodes",
            help="Tell it on 2 real nodes (kubelet, containerd, runc; needs root) with devheal installed by its "
            "Helm chart: a few minutes, and the first run builds the node binaries and the image.",
        ),
    ] = False,
) -> None:
    """Fail GPUs under an inference Deployment, a training gang and an idle node; devheal heals each."""
    from rich.console import Console

    from devheal.demo import real_nodes as real_story
    from devheal.demo import story
    from devheal.kube.errors import KubeError
    from devheal.lab.cluster import LabError
    from devheal.lab.realnode import RealNodeError
    from devheal.lab.toolchain import ToolchainError
    from devheal.lab.workloads import WaitTimeout

    console = Console(no_color=no_color, force_terminal=False if no_color else None, highlight=not no_color)
    try:
        if real_nodes:
            told = real_story.run(console, keep=keep, observe_seconds=observe_seconds, directory=directory)
        else:
            told = story.run(console, keep=keep, nodes=nodes, observe_seconds=observe_seconds, directory=directory)
        results = asyncio.run(told)
    except (LabError, ToolchainError, KubeError, WaitTimeout, RealNodeError) as exc:
        console.print(f"error: {exc}")
        raise typer.Exit(1) from exc
    if not all(r.ok for r in results):
        console.print("error: some faults were not healed as expected (see the summary)")
        raise typer.Exit(1)
