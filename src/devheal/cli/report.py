"""``devheal report``: the GPU-hours a cluster's workloads lost, by cause, from its Remediations.

Every Remediation on a pod or a gang records, as it ends, what its workload lost
(``status.badput``, ``devheal.engine.badput``); this command sums the records that ended
within a window into the loss-by-cause table ``devheal simulate`` prints
(``devheal.model.badput.cause_table``), one column per namespace.
"""

from __future__ import annotations

import asyncio
import json
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from devheal.cli.common import Context, Kubeconfig, explain, fail

if TYPE_CHECKING:
    from rich.table import Table

    from devheal.model.badput import BookedLoss, CauseTable

# rich and the Kubernetes client are imported when the command runs, not for --help.


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


def render_cause_table(title: str, table: CauseTable) -> Table:
    """The loss-by-cause table as rich prints it (``devheal simulate`` prints it too)."""
    from rich.table import Table

    out = Table(title=title)
    for i, header in enumerate(table.headers):
        if i < 2:
            out.add_column(header, no_wrap=True)
        else:
            out.add_column(header, justify="right")
    for row in table.rows:
        out.add_row(*row)
    return out


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def booked_losses(
    items: list[dict[str, Any]], since: float, namespace: str | None
) -> tuple[list[BookedLoss], list[str]]:
    """The badput of the records whose workload ran again (or whose remediation failed) at or after ``since``,
    in ``namespace`` (None: all); and a line per record whose ``status.badput`` cannot be read."""
    from devheal.model.badput import Badput, BadputError, BookedLoss

    booked: list[BookedLoss] = []
    unreadable: list[str] = []
    for obj in items:
        status = obj.get("status")
        if not isinstance(status, dict) or "badput" not in status:
            continue  # records of nodes, active ones, and those written before badput was recorded
        name = str((obj.get("metadata") or {}).get("name") or "?")
        spec = _object(obj.get("spec"))
        target, finding = _object(spec.get("target")), _object(spec.get("finding"))
        try:
            badput = Badput.from_status(status["badput"])
        except BadputError as exc:
            unreadable.append(f"remediation {name}: {exc}")
            continue
        ns = str(target.get("namespace") or "")
        if badput.until < since or (namespace is not None and ns != namespace):
            continue
        booked.append(BookedLoss(ns, str(finding.get("kind") or ""), badput))
    return booked, unreadable


def report(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    since: Annotated[
        str, typer.Option(help="The window: records whose workload ran again within this long, e.g. 30m, 24h, 168h.")
    ] = "24h",
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only workloads in this namespace (default: all).")
    ] = None,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table, or json (GPU-hours by cause).")
    ] = Output.TABLE,
    no_color: Annotated[bool, typer.Option("--no-color", help="Plain output (for logs and CI).")] = False,
) -> None:
    """GPU-hours the cluster's workloads lost, by cause, from its Remediations' status.badput.

    Each Remediation on a pod or a gang records, as it ends, the GPU-hours its workload lost
    from the fault's first sighting to running again, awaiting remediation and restarting,
    and the cause (the simulator's failure classes). The table is the one `devheal simulate`
    prints: a row per cause, a column per namespace, all losses and (in brackets) those awaiting
    remediation. With kubectl: `kubectl get remediations -o wide` (columns Lost GPU-h, Cause)."""
    from devheal.kube import errors
    from devheal.kube.client import KubeClient
    from devheal.model.times import parse_duration

    try:
        window = parse_duration(since, "--since")
    except ValueError as exc:
        fail("report", str(exc))
    from devheal.controller.records import REMEDIATIONS

    async def main() -> list[dict[str, Any]]:
        async with await KubeClient.connect(kubeconfig, context=context, max_connections=1) as kube:
            items, _ = await kube.list_all(REMEDIATIONS)
            return items

    try:
        items = asyncio.run(main())
    except errors.KubeError as exc:
        message, code = explain(exc)
        fail("report", message, code)
    now = time.time()
    booked, unreadable = booked_losses(items, now - window, namespace)
    for line in unreadable:
        typer.echo(f"devheal report: {line} (left out)", err=True)
    _print(booked, now - window, now, namespace, output, no_color)


def _print(
    booked: list[BookedLoss], start: float, end: float, namespace: str | None, output: Output, no_color: bool
) -> None:
    from devheal.model.badput import cause_table, findings_by_cause, report_columns
    from devheal.model.times import format_time

    columns = report_columns(booked)
    if output is Output.JSON:
        body = {
            "from": format_time(start),
            "to": format_time(end),
            "namespace": namespace,
            "records": len(booked),
            "gpuHours": sum(b.badput.gpu_hours for b in booked),
            "byNamespace": columns,
        }
        typer.echo(json.dumps(body, indent=2))
        return
    from rich.console import Console

    console = Console(no_color=no_color, highlight=not no_color)
    if not console.is_terminal:
        console.width = max(console.width, 150)
    window = f"{format_time(start)} to {format_time(end)}"
    if not booked:
        console.print(f"no workload lost GPU time from {window}" + (f" in {namespace}" if namespace else ""))
        return
    seen_by = findings_by_cause(booked)
    table = cause_table(columns, lambda cause: seen_by.get(cause, "-"))
    total = sum(b.badput.gpu_hours for b in booked)
    console.print(f"Remediations that ended from {window}" + (f", namespace {namespace}" if namespace else ""))
    console.print(render_cause_table("GPU-hours lost by cause: all losses (awaiting remediation)", table))
    console.print(f"{len(booked)} remediations, {total:,.2f} GPU-hours lost", markup=False)
