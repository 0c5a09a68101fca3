"""PNG plots of a comparison, drawn with matplotlib when it is installed (it is optional).

- ``goodput_over_time.png``: training goodput per day (per hour for runs under a week), one line
  per strategy, first seed. Dips are outages; the area under the dip is what was lost.
- ``loss_breakdown.png``: GPU-hours lost per strategy, stacked by cause, mean over seeds.
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

from devheal.simulate.fleet import Loss
from devheal.simulate.runner import Comparison


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plots(comparison: Comparison, out: Path) -> list[Path]:
    """Write both plots under ``out``; returns their paths. Requires matplotlib (check ``available()``)."""
    # Imported by name: matplotlib is optional, so neither the import nor its types may be required.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    out.mkdir(parents=True, exist_ok=True)
    written = []
    names = list(comparison.results)

    fig, ax = plt.subplots(figsize=(10, 5))
    for name in names:
        result = comparison.results[name][0]
        unit = 86400.0 if result.series_bin_s >= 86400 else 3600.0
        xs = [(i + 0.5) * result.series_bin_s / unit for i in range(len(result.training_series))]
        label = name if result.training_ettr is None else f"{name} (ETTR {100 * result.training_ettr:.1f}%)"
        ax.plot(xs, [100 * v for v in result.training_series], label=label, linewidth=1.4)
    first = comparison.results[names[0]][0]
    ax.set_xlabel("day" if first.series_bin_s >= 86400 else "hour")
    ax.set_ylabel("training goodput (%)")
    ax.set_title(f"{comparison.config.preset}: training goodput over time (seed {first.seed})")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    path = out / "goodput_over_time.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(10, 5))
    bottoms = [0.0] * len(names)
    for loss in Loss:
        heights = [statistics.fmean(r.loss_gpu_hours[loss.value] for r in comparison.results[n]) for n in names]
        ax.bar(names, heights, bottom=bottoms, label=loss.value)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("GPU-hours lost")
    ax.set_title(f"{comparison.config.preset}: GPU-hours lost by cause (mean over {len(comparison.traces)} trace(s))")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=15)
    path = out / "loss_breakdown.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written
