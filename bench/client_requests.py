"""Benchmark: the API client's CPU per request, as devheal connects and as aiohttp's ``trust_env`` did.

    python -m bench.client_requests --requests 4000 --runs 3

The in-memory API server (``tests.shell.memapi``) runs in a process of its own holding one pod; this
process connects with ``KubeClient.connect`` and GETs that pod ``--requests`` times, ``--concurrency`` at
a time, and measures its own CPU per request (the server's is not in it). Each run times the client
as devheal makes it (the environment's proxy read once, at connect) and the same client with aiohttp's
``trust_env`` on (the proxy, and ~/.netrc, read again for every request, in two thread-pool hops: how
the client was made before), taking turns. Prints the median of each and writes
bench/results/client_requests.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.report import write_results
from bench.serving import serving

RESULTS = Path(__file__).parent / "results"
POD = "/api/v1/namespaces/ns/pods/p"


async def serve(kubeconfig: Path) -> None:
    """Hold one pod until stdin closes."""
    from tests.shell.memapi import MemApi

    async with MemApi() as api:
        api.create("/api/v1/namespaces/ns/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
        api.kubeconfig(kubeconfig)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


async def cpu_per_request(kubeconfig: Path, requests: int, concurrency: int, trust_env: bool) -> float:
    """Microseconds of this process's CPU per GET, after a warm-up."""
    from devheal.kube.client import KubeClient

    kube = await KubeClient.connect(str(kubeconfig))
    if trust_env:
        kube._session._trust_env = True  # how the session was made before
    limit = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with limit:
            await kube.get(POD)

    try:
        await asyncio.gather(*(one() for _ in range(concurrency * 4)))
        started = time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        return (time.process_time() - started) / requests * 1e6
    finally:
        await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "client_requests.json")
    parser.add_argument("--role", choices=["main", "serve"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The client builds a TLS context even for plain http; without a CA store to read that is instant.
    os.environ.setdefault("SSL_CERT_FILE", os.devnull)
    if args.role == "serve":
        asyncio.run(serve(args.kubeconfig))
        return
    now: list[float] = []
    before: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        with serving("client_requests", f"--kubeconfig={kubeconfig}"):
            for _ in range(args.runs):
                now.append(asyncio.run(cpu_per_request(kubeconfig, args.requests, args.concurrency, False)))
                before.append(asyncio.run(cpu_per_request(kubeconfig, args.requests, args.concurrency, True)))
    figures = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "runs": args.runs,
        "cpu_us_per_request": round(statistics.median(now), 1),
        "cpu_us_per_request_trust_env": round(statistics.median(before), 1),
        "runs_us": [round(x, 1) for x in now],
        "runs_trust_env_us": [round(x, 1) for x in before],
        "load_average": round(os.getloadavg()[0], 2),
    }
    for key, value in figures.items():
        print(f"{key:>30}  {value}")
    write_results(args.out, "client_requests", figures)


if __name__ == "__main__":
    main()
