"""Start-up guard: the help of every command, and barrier on its way to the API, load no heavy library.

Which modules a process imports, not how long it takes (bench/startup.py measures that):
``python -X importtime`` names every module a fresh ``devheal`` process imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("kubernetes_asyncio", "grpc", "matplotlib", "prometheus_client", "pydantic", "aiohttp", "rich")
"""Never needed to print help: the Kubernetes client, gRPC, plotting, metrics, typer's rich and pydantic layers."""

HELP = [
    [],
    ["barrier"],
    ["sidecar"],
    ["controller"],
    ["agent"],
    ["simulate"],
    ["report"],
    ["launch"],
    ["features"],
    ["demo"],
    ["crds"],
    ["crds", "apply"],
    ["lab"],
    ["lab", "up"],
]


def imported(args: list[str], expect: int = 0) -> set[str]:
    """The top-level packages a fresh ``python -m devheal ARGS`` imports."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "devheal", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == expect, done.stderr[-2000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "devheal" in names  # importtime did report
    return names


@pytest.mark.parametrize("command", HELP, ids=lambda c: " ".join(c) or "devheal")
def test_help_imports_no_heavy_library(command: list[str]) -> None:
    assert not imported([*command, "--help"]) & set(HEAVY)


def test_barrier_reaches_the_api_without_the_kubernetes_client_grpc_or_plotting(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    names = imported(["barrier", "--pod", "p", "--namespace", "ns", "--kubeconfig", str(kubeconfig)], expect=2)
    assert "aiohttp" in names  # it did get as far as the HTTP client
    assert not names & {"kubernetes_asyncio", "grpc", "matplotlib", "prometheus_client", "pydantic", "rich"}


def test_importing_the_cli_loads_no_heavy_library() -> None:
    code = "import sys, devheal.cli.app; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert not set(done.stdout.split()) & set(HEAVY)
