"""Benchmark: how long the lab takes to become ready, and how much memory it holds, by node count.

    python -m bench.lab_startup --nodes 10 100 1000
    python -m bench.lab_startup --nodes 3 --real-nodes 2      # as root: 2 of the 3 nodes real
    python -m bench.lab_startup --nodes 2 --real-nodes 2 --install   # and devheal installed by its chart

For each size: start a fresh lab (binaries already built), record the time until every
node is Ready with its GPUs, let it settle, then sum the resident memory of every lab
process (per component). Prints a table and writes bench/results/lab_startup.json
(``lab_startup_real_nodes.json`` with ``--real-nodes``). With real nodes, each real node's
memory is also given as kubelet + containerd + its shims (``rss_mib_per_real_node``) and its
device plugin apart; with ``--install``, the time `devheal lab install` takes until the chart's controller
and agents are Ready (the image built beforehand), and the memory is sampled with them running.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.report import write_results
from devheal.lab import devheal_image, install, realnode, toolchain, versions
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
    for node in state.real_nodes(lab.dir):
        # The shims daemonize (not containerd's children): they are the rest of the node's mount namespace.
        own = {state.pids.get(node.containerd_component()), state.pids.get(node.kubelet_component())}
        shims = realnode.namespace_pids(state.mount_namespaces.get(node.name, "")) - own
        out[f"shims/{node.name}"] = sum(_rss(pid) for pid in shims) / 2**20
    return out


def _rss(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return 0


def per_real_node(per_component: dict[str, float], lab: Lab) -> dict[str, float]:
    """kubelet + containerd + shims of each real node (its device plugin is listed apart)."""
    state = lab.state()
    assert state is not None
    return {
        node.name: round(
            sum(per_component.get(f"{part}/{node.name}", 0.0) for part in ("kubelet", "containerd", "shims")), 1
        )
        for node in state.real_nodes(lab.dir)
    }


def measure(nodes: int, gpus: int, settle: float, real_nodes: int = 0, chart: bool = False) -> dict[str, object]:
    lab = Lab(Path(tempfile.mkdtemp(prefix="devheal-bench-", dir="/tmp")))
    started = time.monotonic()
    state = lab.up(LabSpec(nodes=nodes, gpus_per_node=gpus, real_nodes=real_nodes), timeout=900)
    ready = time.monotonic() - started
    chart_ready: float | None = None
    try:
        if chart:
            # The image is built before the clock starts: what is timed is the import, helm and the pods' start.
            devheal_image.devheal_image()
            began = time.monotonic()
            install.install(lab, timeout=600)
            chart_ready = time.monotonic() - began
        time.sleep(settle)
        samples = [rss_by_component(lab)]
        for _ in range(2):
            time.sleep(1.0)
            samples.append(rss_by_component(lab))
        per_component = {c: statistics.median(s[c] for s in samples) for c in samples[0]}
        real = per_real_node(per_component, lab)
    finally:
        lab.down()
    return {
        "nodes": nodes,
        "real_nodes": real_nodes,
        "rss_mib_per_real_node": real,
        "gpus_per_node": gpus,
        "ready_seconds": round(ready, 2),
        # `devheal lab install` until the controller Deployment is Available and every agent Ready (with --install).
        "chart_ready_seconds": None if chart_ready is None else round(chart_ready, 2),
        "lab_reported_ready_seconds": round(state.ready_seconds, 2),
        "rss_mib_total": round(sum(per_component.values()), 1),
        "rss_mib_by_component": {k: round(v, 1) for k, v in per_component.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait after ready before sampling")
    parser.add_argument("--real-nodes", type=int, default=0, help="of each lab's nodes, this many are real")
    parser.add_argument(
        "--install", action="store_true", help="with --real-nodes: also install devheal by its chart, timed"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or RESULTS / ("lab_startup_real_nodes.json" if args.real_nodes else "lab_startup.json")
    if args.install and not args.real_nodes:
        parser.error("--install needs --real-nodes: the chart's pods run on the real nodes")
    toolchain.ensure_binaries()
    if args.real_nodes:
        toolchain.ensure_node_binaries()
    rows = []
    for n in args.nodes:
        print(f"lab with {n} nodes ({args.real_nodes} real) ...", flush=True)
        rows.append(measure(n, args.gpus_per_node, args.settle, args.real_nodes, args.install))
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
        if row["real_nodes"]:
            print(f"       real nodes (kubelet + containerd + shims, MiB): {row['rss_mib_per_real_node']}")
        if row["chart_ready_seconds"] is not None:
            print(f"       devheal's chart Ready after {row['chart_ready_seconds']} s (controller and agents)")
    node_versions = {"containerd": versions.CONTAINERD, "runc": versions.RUNC, "cni_plugins": versions.CNI_PLUGINS}
    write_results(
        out,
        "lab_startup",
        {
            "versions": {
                "kubernetes": versions.KUBERNETES,
                "etcd": versions.ETCD,
                "kwok": versions.KWOK,
                **(node_versions if args.real_nodes else {}),
            },
            "results": rows,
        },
    )


if __name__ == "__main__":
    main()
