"""The ``devheal`` command: one entry point, a sub-command per part."""

from __future__ import annotations

import typer

from devheal import __version__
from devheal.cli import agent as agent_cli
from devheal.cli import controller as controller_cli
from devheal.cli import demo as demo_cli
from devheal.cli import features as features_cli
from devheal.cli import lab as lab_cli
from devheal.cli import launch as launch_cli
from devheal.cli import restart_all as restart_all_cli
from devheal.cli import simulate as simulate_cli

app = typer.Typer(
    help="devheal: detect failing GPUs, find the pods and workloads using them, and heal the cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(lab_cli.app, name="lab")
app.command("demo")(demo_cli.demo)
app.command("controller")(controller_cli.controller)
app.command("agent")(agent_cli.agent)
app.command("simulate")(simulate_cli.simulate)
app.command("launch")(launch_cli.launch)
app.command("barrier")(restart_all_cli.barrier)
app.command("sidecar")(restart_all_cli.sidecar)
app.command("features")(features_cli.features)


@app.command()
def version() -> None:
    """Print devheal's version."""
    typer.echo(__version__)


def main() -> None:
    app()
