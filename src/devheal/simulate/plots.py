"""PNG plots of a comparison, drawn with matplotlib when it is installed (it is optional).

- ``goodput_over_time.png``: training goodput per day (per hour for runs under a week), one line
  per strategy, first seed. Dips are outages; the area under the dip is what was lost.
- ``loss_breakdown.png``: GPU-hours lost per strategy, stacked by loss category, mean over seeds.
- ``loss_by_cause.png``: training GPU-hours lost per strategy, stacked by what caused them (failure
  class, checkpoints, slow nodes), mean over seeds.

Readable side by side: legends sit outside the data, each strategy has its own line style and
marker (overlapping lines stay visible), axes use plain numbers (no offset or scientific notation).
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path
from typing import Any

from devheal.simulate.fleet import Loss
from devheal.simulate.results import mean_by_cause
from devheal.simulate.runner import Comparison

LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")
TOP_CAUSES = 9
"""Causes shown one by one in the cause plot; the rest are summed as ``other causes``."""


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plain_axis(axis: Any) -> None:
    """Plain numbers with thousands separators: no offset, no scientific notation."""
    ticker = importlib.import_module("matplotlib.ticker")
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:,.0f}" if abs(v) >= 10 else f"{v:g}"))


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def write_plots(comparison: Comparison, out: Path) -> list[Path]:
    """Write the plots under ``out``; returns their paths. Requires matplotlib (check ``available()``)."""
    # Imported by name: matplotlib is optional, so neither the import nor its types may be required.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    out.mkdir(parents=True, exist_ok=True)
    names = list(comparison.results)
    runs = len(comparison.traces)
    written = []

    fig, ax = plt.subplots(figsize=(11, 5))
    for i, name in enumerate(names):
        result = comparison.results[name][0]
        unit = 86400.0 if result.series_bin_s >= 86400 else 3600.0
        xs = [(b + 0.5) * result.series_bin_s / unit for b in range(len(result.training_series))]
        label = name if result.training_ettr is None else f"{name} (ETTR {100 * result.training_ettr:.1f}%)"
        ax.plot(
            xs,
            [100 * v for v in result.training_series],
            label=label,
            linewidth=1.5,
            linestyle=LINE_STYLES[i % len(LINE_STYLES)],
            marker=MARKERS[i % len(MARKERS)],
            markersize=3.5,
            markevery=max(1, len(xs) // 18),
        )
    first = comparison.results[names[0]][0]
    ax.set_xlabel("day" if first.series_bin_s >= 86400 else "hour")
    ax.set_ylabel("training goodput (%)")
    ax.set_title(f"{comparison.config.preset}: training goodput over time (seed {first.seed})")
    ax.grid(alpha=0.3)
    _plain_axis(ax.yaxis)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    written.append(_save(plt, fig, out / "goodput_over_time.png"))

    fig, ax = plt.subplots(figsize=(11, 5))
    bottoms = [0.0] * len(names)
    for loss in Loss:
        heights = [statistics.fmean(r.loss_gpu_hours[loss.value] for r in comparison.results[n]) for n in names]
        ax.bar(names, heights, bottom=bottoms, label=loss.value)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("GPU-hours lost")
    ax.set_title(f"{comparison.config.preset}: GPU-hours lost by category (mean over {runs} trace(s))")
    _plain_axis(ax.yaxis)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.tick_params(axis="x", labelrotation=15)
    written.append(_save(plt, fig, out / "loss_breakdown.png"))

    means = {n: mean_by_cause(comparison.results[n]) for n in names}
    totals: dict[str, float] = {}
    for per in means.values():
        for cause, losses in per.items():
            totals[cause] = max(totals.get(cause, 0.0), sum(losses.values()))
    ranked = sorted(totals, key=lambda c: -totals[c])
    shown, rest = ranked[:TOP_CAUSES], ranked[TOP_CAUSES:]
    fig, ax = plt.subplots(figsize=(11, 5))
    colors = plt.get_cmap("tab10").colors
    bottoms = [0.0] * len(names)
    for i, cause in enumerate([*shown, *(["other causes"] if rest else [])]):
        picked = [cause] if cause != "other causes" else rest
        heights = [sum(sum(means[n].get(c, {}).values()) for c in picked) for n in names]
        ax.bar(
            names, heights, bottom=bottoms, label=cause, color=colors[i % len(colors)], hatch="//" if i >= 10 else ""
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("training GPU-hours lost")
    ax.set_title(f"{comparison.config.preset}: training GPU-hours lost by cause (mean over {runs} trace(s))")
    _plain_axis(ax.yaxis)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.tick_params(axis="x", labelrotation=15)
    written.append(_save(plt, fig, out / "loss_by_cause.png"))
    return written
