"""The ``devheal`` command: one entry point, a sub-command per part.

A command's module is imported, and its options built, only when that command runs (or
its help is asked for); ``devheal --help`` lists the commands from their docstrings. The
command modules import only typer and small pure modules at the top, and what they need
(the Kubernetes client, aiohttp, grpc, prometheus_client, rich, matplotlib) when they run:
`devheal --help` and the commands on a training pod's restart path (`barrier`, `sidecar`)
start in a fraction of a second. ``tests/unit/cli/test_startup.py`` keeps it so;
``bench/startup.py`` measures it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import typer
from typer import _click
from typer._click.utils import make_default_short_help
from typer.core import TyperGroup

from devheal import __version__
from devheal.cli import params

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("devheal.cli.demo", "demo"),
    "controller": ("devheal.cli.controller", "controller"),
    "agent": ("devheal.cli.agent", "agent"),
    "simulate": ("devheal.cli.simulate", "simulate"),
    "report": ("devheal.cli.report", "report"),
    "launch": ("devheal.cli.launch", "launch"),
    "barrier": ("devheal.cli.restart_all", "barrier"),
    "sidecar": ("devheal.cli.restart_all", "sidecar"),
    "features": ("devheal.cli.features", "features"),
    "doctor": ("devheal.cli.doctor", "doctor"),
    "crds": ("devheal.cli.crds", "app"),
    "lab": ("devheal.cli.lab", "app"),
}
"""Command name -> (module, the function or ``typer.Typer`` in it)."""


def _target(name: str) -> Any:
    module, attribute = COMMANDS[name]
    return getattr(importlib.import_module(module), attribute)


def load_command(name: str) -> _click.Command:
    """Build one command (or group) from its module, as typer would have at start-up."""
    target = _target(name)
    if isinstance(target, typer.Typer):
        return typer.main.get_command(target)
    single = typer.Typer(rich_markup_mode=None, add_completion=False)
    single.command(name)(target)
    return typer.main.get_command(single)


def short_help(name: str) -> str:
    """The command's help, as the command itself would give it (without building it)."""
    target = _target(name)
    if isinstance(target, typer.Typer):
        return str(target.info.help or "")
    return inspect.getdoc(target) or ""


class LazyGroup(TyperGroup):
    """The top-level group: its commands are built when invoked, not all at start-up."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name in COMMANDS:
            return load_command(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            if name in COMMANDS:
                rows.append((name, make_default_short_help(short_help(name), limit)))
            else:
                command = super().get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


params.install()

app = typer.Typer(
    cls=LazyGroup,
    help="devheal: detect failing GPUs, find the pods and workloads using them, and heal the cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help and usage errors: typer's rich formatting alone takes longer to import than
    # the whole start-up may (0.5 s).
    rich_markup_mode=None,
)


@app.callback()
def root() -> None:
    """Options of every command come after its name (``devheal controller --help``)."""
    # A callback keeps typer from turning an app of one registered command into that command.


@app.command()
def version() -> None:
    """Print devheal's version."""
    typer.echo(__version__)


def main() -> None:
    app()
