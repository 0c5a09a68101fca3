"""``devheal demo``: bring up the lab and show, step by step, what happens when a GPU fails."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from devheal.demo import story
from devheal.lab.cluster import LabError
from devheal.lab.toolchain import ToolchainError


def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Leave the lab running afterwards, for exploring.")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", help="Plain output (for logs and CI).")] = False,
    nodes: Annotated[int, typer.Option(help="Simulated GPU nodes (4-8 tell the story well).")] = 4,
    observe_seconds: Annotated[float, typer.Option(help="How long to watch the cluster after the fault.")] = 10.0,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Lab directory (default: ~/.local/state/devheal/demo).")
    ] = None,
) -> None:
    """Start the lab, run an inference Deployment on GPUs, fail one GPU, and show what the cluster does."""
    console = Console(no_color=no_color, force_terminal=None if not no_color else False, highlight=not no_color)
    try:
        ok = asyncio.run(
            story.run(console, keep=keep, nodes=nodes, observe_seconds=observe_seconds, directory=directory)
        )
    except (LabError, ToolchainError) as exc:
        console.print(f"error: {exc}")
        raise typer.Exit(1) from exc
    if not ok:
        raise typer.Exit(1)
