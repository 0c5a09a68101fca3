"""Benchmark: how long the lab takes to become ready, and how much memory it holds, by node count.

    python -m bench.lab_startup --nodes 10 100 1000

For each size: start a fresh lab (binaries already built), record the time until every
node is Ready with its GPUs, let it settle, then sum the resident memory of every lab
process (per component). Prints a table and writes bench/results/lab_startup.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.report import write_results
from devheal.lab import toolchain, versions
from devheal.lab.cluster import Lab, LabSpec

RESULTS = Path(__file__).parent / "results"


def rss_by_component(lab: Lab) -> dict[str, float]:
    state = lab.state()
    assert state is not None
    out: dict[str, float] = {}
    for component, pid in state.pids.items():
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
            out[component] = sum(p.memory_info().rss for p in procs) / 2**20
        except psutil.NoSuchProcess:
            out[component] = 0.0
    return out


def measure(nodes: int, gpus: int, settle: float) -> dict[str, object]:
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    started = time.monotonic()
    state = lab.up(LabSpec(nodes=nodes, gpus_per_node=gpus), timeout=900)
    ready = time.monotonic() - started
    try:
        time.sleep(settle)
        samples = [rss_by_component(lab)]
        for _ in range(2):
            time.sleep(1.0)
            samples.append(rss_by_component(lab))
        per_component = {c: statistics.median(s[c] for s in samples) for c in samples[0]}
    finally:
        lab.down()
    return {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "ready_seconds": round(ready, 2),
        "lab_reported_ready_seconds": round(state.ready_seconds, 2),
        "rss_mib_total": round(sum(per_component.values()), 1),
        "rss_mib_by_component": {k: round(v, 1) for k, v in per_component.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait after ready before sampling")
    parser.add_argument("--out", type=Path, default=RESULTS / "lab_startup.json")
    args = parser.parse_args()
    toolchain.ensure_binaries()
    rows = []
    for n in args.nodes:
        print(f"lab with {n} nodes ...", flush=True)
        rows.append(measure(n, args.gpus_per_node, args.settle))
    header = f"{'nodes':>6} {'ready s':>8} {'RSS MiB':>8}  " + "  ".join(
        f"{c[:12]:>12}"
        for c in rows[0]["rss_mib_by_component"]  # type: ignore[union-attr]
    )
    print(header)
    for row in rows:
        comps = row["rss_mib_by_component"]
        assert isinstance(comps, dict)
        print(
            f"{row['nodes']:>6} {row['ready_seconds']:>8} {row['rss_mib_total']:>8}  "
            + "  ".join(f"{v:>12}" for v in comps.values())
        )
    write_results(
        args.out,
        "lab_startup",
        {
            "versions": {"kubernetes": versions.KUBERNETES, "etcd": versions.ETCD, "kwok": versions.KWOK},
            "results": rows,
        },
    )


if __name__ == "__main__":
    main()
