"""``python -m devheal.lab.nodesim``: the node simulator process that ``devheal.lab.cluster`` starts."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
from pathlib import Path

from devheal.kube.client import KubeClient
from devheal.lab.nodesim.simulator import NodeSimulator
from devheal.lab.nodesim.store import NodeStore


async def _main(args: argparse.Namespace) -> None:
    client = await KubeClient.connect(args.kubeconfig, max_connections=64)
    store = NodeStore(Path(args.state_file))
    store.load_or_create(args.nodes, args.gpus_per_node, args.gpu_model, args.dra_nodes)
    sim = NodeSimulator(
        client=client,
        store=store,
        socket_dir=Path(args.socket_dir) if args.socket_dir else None,
    )
    try:
        await sim.run(args.gpus_per_node, args.gpu_model, args.http_port)
    finally:
        await client.close()


def _raise_fd_limit() -> None:
    """One unix socket per node: 1,000 nodes need more descriptors than the usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devheal.lab.nodesim", description="devheal lab: simulated kubelets and GPUs for kwok nodes"
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--dra-nodes", type=int, default=0, help="the last N nodes expose GPUs through DRA")
    parser.add_argument("--gpu-model", default="NVIDIA H100 80GB HBM3")
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--socket-dir", default="")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _raise_fd_limit()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
