"""``devheal simulate``: replay a fleet's failures against remediation strategies and compare goodput."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from devheal.simulate.config import PRESETS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from devheal.model.policy import Policy
    from devheal.simulate.config import SimConfig
    from devheal.simulate.results import StrategyResult
    from devheal.simulate.runner import Comparison

# rich, yaml and the simulator's engine are imported when the command runs, not for --help.


class _InputError(Exception):
    """Bad input from the command line or a file: printed without a traceback."""


def load_policies(paths: list[Path]) -> list[Policy]:
    """Every ``RemediationPolicy`` document in the given YAML files."""
    import yaml

    from devheal.model.policy import PolicyError, parse_policy
    from devheal.simulate.fleet import NAMESPACES

    policies: list[Policy] = []
    for path in paths:
        try:
            documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except OSError as exc:
            raise _InputError(f"{path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise _InputError(f"{path}: not valid YAML: {exc}") from exc
        found = 0
        for i, doc in enumerate(documents):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise _InputError(f"{path}: document {i + 1}: expected a RemediationPolicy object")
            kind = doc.get("kind", "RemediationPolicy")
            if kind != "RemediationPolicy":
                raise _InputError(f"{path}: document {i + 1}: kind {kind!r}, expected RemediationPolicy")
            try:
                parsed = parse_policy(doc)
            except PolicyError as exc:
                raise _InputError(f"{path}: {exc}") from exc
            if parsed.namespaces and parsed.namespaces.isdisjoint(NAMESPACES.values()):
                raise _InputError(
                    f"{path}: policy {parsed.name}: spec.selector.namespaces selects none of the simulated "
                    f"workloads' namespaces ({', '.join(NAMESPACES.values())}): it would never act"
                )
            policies.append(parsed)
            found += 1
        if not found:
            raise _InputError(f"{path}: no RemediationPolicy in the file")
    return policies


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _spread_pct(values: list[float | None], digits: int = 1) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mean = sum(present) / len(present)
    if len(present) == 1:
        return _pct(mean, digits)
    return f"{_pct(mean, digits)} ({100 * min(present):.{digits}f}-{100 * max(present):.{digits}f})"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _gpu_hours(value: float) -> str:
    return f"{value:,.0f}"


def _tables(comparison: Comparison) -> list[Table]:
    from rich.table import Table

    from devheal.simulate.fleet import Loss
    from devheal.simulate.results import percentile

    results = comparison.results
    any_result = next(iter(results.values()))[0]
    has_inference = any_result.inference_availability is not None
    has_batch = any_result.batch_goodput is not None
    several = len(comparison.traces) > 1

    summary = Table(
        title="Goodput by strategy" + (f" (mean, and range over {len(comparison.traces)} seeds)" if several else "")
    )
    summary.add_column("strategy", no_wrap=True)
    summary.add_column("training ETTR", justify="right")
    if has_inference:
        summary.add_column("inference requests served", justify="right")
    if has_batch:
        summary.add_column("batch goodput", justify="right")
    if has_inference or has_batch:
        summary.add_column("fleet goodput", justify="right")
    summary.add_column("interruptions", justify="right")
    summary.add_column("GPU-h lost", justify="right")
    for q in (50, 90, 99):
        summary.add_column(f"recovery p{q} (min)" if q == 50 else f"p{q} (min)", justify="right")
    for name, rs in results.items():
        recoveries = [r for res in rs for r in res.recoveries_s]
        row = [name, _spread_pct([r.training_ettr for r in rs])]
        if has_inference:
            row.append(_spread_pct([r.inference_availability for r in rs], digits=3))  # serving SLOs count nines
        if has_batch:
            row.append(_spread_pct([r.batch_goodput for r in rs]))
        if has_inference or has_batch:
            row.append(_spread_pct([r.fleet_goodput for r in rs]))
        interruptions = [r.interruptions for r in rs]
        row += [
            f"{min(interruptions)}-{max(interruptions)}" if several else str(interruptions[0]),
            _gpu_hours(sum(r.lost_gpu_hours for r in rs) / len(rs)),
            *(_minutes(percentile(recoveries, q)) for q in (50, 90, 99)),
        ]
        summary.add_row(*row)

    losses = Table(title="GPU-hours lost by cause (all workloads, mean per run)")
    losses.add_column("strategy", no_wrap=True)
    for loss in Loss:
        losses.add_column(loss.value.replace("-", " "), justify="right")
    for name, rs in results.items():
        losses.add_row(name, *(_gpu_hours(sum(r.loss_gpu_hours[loss.value] for r in rs) / len(rs)) for loss in Loss))

    by_cause = _cause_table(comparison)

    remediations = Table(title="Remediations by type, and node-hours broken (a fault on the node, or in repair)")
    remediations.add_column("strategy", no_wrap=True)
    remediations.add_column("node-h broken", justify="right")
    remediations.add_column("who did what, how often (mean per run)")
    for name, rs in results.items():
        kinds = sorted({k for r in rs for k in r.remediations})
        text = ", ".join(f"{k} {_count(sum(r.remediations.get(k, 0) for r in rs) / len(rs))}" for k in kinds)
        remediations.add_row(name, _gpu_hours(sum(r.broken_node_hours for r in rs) / len(rs)), text)
    return [summary, losses, by_cause, remediations]


def _cause_table(comparison: Comparison) -> Table:
    """Training GPU-hours lost by what caused them: per strategy, all losses and (in brackets) the time spent
    awaiting remediation, so the largest remediable share stands out. ``devheal report`` prints the same table
    from a cluster's Remediations (``devheal.model.badput.cause_table``)."""
    from devheal.cli.report import render_cause_table
    from devheal.model.badput import cause_table
    from devheal.simulate.failures import CLASSES
    from devheal.simulate.results import mean_by_cause

    means = {name: mean_by_cause(rs) for name, rs in comparison.results.items()}
    table = cause_table(means, lambda cause: str(CLASSES[cause].signal) if cause in CLASSES else "-")
    return render_cause_table(
        "Training GPU-hours lost by cause (mean per run): all losses (awaiting remediation)", table
    )


def _describe(config: SimConfig, seeds: list[int], replay: Path | None) -> str:
    fleet = config.fleet
    shapes = sorted({str(g.parallelism) for g in fleet.gangs})
    parts = [
        f"{config.preset}: {fleet.workload_nodes:,} nodes x {fleet.gpus_per_node} GPUs"
        f" (+{fleet.spare_nodes} spare nodes, {fleet.gpus:,} GPUs) for {config.days:g} days"
    ]
    if shapes:
        parts.append(f"{'/'.join(shapes)} gangs, culprits {config.culprits.name}")
    parts.append(
        f"trace {replay}"
        if replay
        else f"seed{'s' if len(seeds) > 1 else ''} {seeds[0]}" + (f"..{seeds[-1]}" if len(seeds) > 1 else "")
    )
    return ", ".join(parts)


def _write(comparison: Comparison, out: Path, console: Console, plots_wanted: bool) -> None:
    from devheal.simulate import plots

    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(comparison.to_json(), indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {path}", markup=False, soft_wrap=True)
    if not plots_wanted:
        return
    if not plots.available():
        console.print(
            "plots skipped: matplotlib is not installed (pip install 'devheal[plots]', or pass --no-plots)",
            markup=False,
        )
        return
    for written in plots.write_plots(comparison, out):
        console.print(f"wrote {written}", markup=False, soft_wrap=True)


def simulate(
    preset: Annotated[str, typer.Option(help=f"Fleet and workload preset: {', '.join(PRESETS)}.")] = "llama3-405b",
    nodes: Annotated[int | None, typer.Option(help="Nodes running workloads (the preset adds its spare pool).")] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", help="GPUs per node (default 8).")] = None,
    days: Annotated[float | None, typer.Option(help="Simulated days (default: the preset's).")] = None,
    spare_nodes: Annotated[
        int | None, typer.Option("--spare-nodes", help="Spare nodes (default: the preset's share of --nodes).")
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Failures per GPU-hour, all classes (default 1.97e-5, Llama 3 405B's)."),
    ] = None,
    checkpointing: Annotated[
        str,
        typer.Option(
            help="Training checkpoints: periodic (15 min to remote storage, the preset's) or in-memory "
            "(every 2 min to peers' host memory, the best practice)."
        ),
    ] = "periodic",
    result_validation: Annotated[
        bool,
        typer.Option(
            "--result-validation",
            help="Training jobs validate their results: on silent data corruption the suspect rank exits with a "
            "code every devheal policy declares (deviceErrorExitCodes).",
        ),
    ] = False,
    culprit_model: Annotated[
        str,
        typer.Option(
            "--culprit-model",
            help="When a stalled gang's step reports name the rank that stopped it, and a slow rank stands out: "
            "calibrated (measured on real PyTorch gangs, per failure class and --parallelism), always-named (a "
            "what-if: every culprit stands out) or never-named.",
        ),
    ] = "calibrated",
    parallelism: Annotated[
        str | None,
        typer.Option(
            help="How the training gangs split their work: ddp or fsdp (sharded, tensor or pipeline parallel; "
            "the presets')."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the first generated trace.")] = 0,
    seeds: Annotated[int, typer.Option(help="How many seeds to run: seed, seed+1, ...")] = 1,
    policy: Annotated[
        list[Path] | None, typer.Option("--policy", help="A RemediationPolicy YAML file to compare too (repeatable).")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Replay this trace file (CSV or JSONL); --seed, --seeds and --rate then go unused."),
    ] = None,
    bound: Annotated[
        bool,
        typer.Option(
            "--bound",
            help="Also run ideal-bound: every fault remediated the moment it lands (what no strategy can beat).",
        ),
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(help="Runs at once, each in its own process (default: the number of CPUs; 1: one at a time)."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory for results.json and the plots.")] = Path("simulate-results"),
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Do not draw the PNG plots.")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", help="Plain output (for logs and CI).")] = False,
) -> None:
    """Compare remediation strategies on a simulated GPU fleet: goodput, GPU-hours lost, recovery times.

    Strategies: kubernetes-default, node-health-controller, pod-watcher, devheal-default (devheal's engine
    with its recommended policy), one per --policy file, and with --bound ideal-bound (every fault remediated
    the moment it lands: what no strategy can beat). All replay the same failures."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from devheal.simulate.config import (
        ConfigError,
        build_preset,
        with_checkpointing,
        with_culprit_model,
        with_parallelism,
        with_result_validation,
    )
    from devheal.simulate.failures import TraceError
    from devheal.simulate.runner import run_comparison
    from devheal.simulate.strategies import lineup
    from devheal.simulate.tracefile import read_trace

    console = Console(no_color=no_color, highlight=not no_color)
    if not console.is_terminal:
        console.width = max(console.width, 150)  # logs and pipes: keep table rows on one line
    try:
        if seeds < 1:
            raise _InputError("--seeds: expected at least 1")
        if jobs is not None and jobs < 1:
            raise _InputError(f"--jobs: expected at least 1, got {jobs}")
        config = with_checkpointing(build_preset(preset, nodes, gpus_per_node, days), checkpointing)
        if result_validation:
            config = with_result_validation(config)
        config = with_culprit_model(config, culprit_model)
        if parallelism is not None:
            config = with_parallelism(config, parallelism)
        if spare_nodes is not None:
            config = replace(config, fleet=replace(config.fleet, spare_nodes=spare_nodes))
        if rate is not None:
            config = replace(config, trace=replace(config.trace, rate_per_gpu_hour=rate))
        config.validate()
        strategies = lineup(load_policies(policy or []), bound=bound)
        seed_list = list(range(seed, seed + seeds))
        replay = None
        if trace is not None:
            replay = read_trace(trace, config.fleet.nodes, config.fleet.gpus_per_node, config.horizon_s)
        console.print(f"devheal simulate: {_describe(config, seed_list, trace)}", markup=False, soft_wrap=True)
        runs = len(strategies) * (1 if replay is not None else len(seed_list))
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("simulating", total=runs)

            def advance(what: str) -> None:
                bar.update(task, advance=1, description=f"simulated {what}")

            workers = jobs if jobs is not None else len(os.sched_getaffinity(0))
            comparison = run_comparison(config, strategies, seed_list, replay, advance, jobs=workers)
    except (_InputError, ConfigError, TraceError, ValueError) as exc:
        console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
    _report(comparison, console)
    _write(comparison, out, console, not no_plots)


def _report(comparison: Comparison, console: Console) -> None:
    from devheal.simulate.failures import LLAMA3_INTERRUPTIONS

    traces = comparison.traces
    expected = comparison.to_json()["reference"]["expected_faults"]
    if len(traces) == 1:
        t = traces[0]
        console.print(
            f"trace: {t.faults} faults (expected {expected:.0f}); "
            f"{t.lemon_nodes} lemon nodes, {t.slow_nodes} slow nodes"
        )
    else:
        counts = [t.faults for t in traces]
        console.print(f"traces: {min(counts)}-{max(counts)} faults per seed (expected {expected:.0f})")
    for table in _tables(comparison):
        console.print(table)
    for lead in comparison.leads():
        for line in lead.summary():
            console.print(line, markup=False, soft_wrap=True)
    first: list[StrategyResult] = next(iter(comparison.results.values()))
    interruptions = [r.interruptions for r in first]
    band: Any = interruptions[0] if len(interruptions) == 1 else f"{min(interruptions)}-{max(interruptions)}"
    console.print(
        f"training interruptions ({first[0].strategy}): {band}; Llama 3 405B reported {LLAMA3_INTERRUPTIONS} "
        f"in 54 days on 16,384 GPUs. Simulated in {comparison.run_seconds:.1f}s."
    )
