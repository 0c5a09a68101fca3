"""The benchmarks that need no lab still run, on tiny inputs, and write their figures with the run's identity.

A benchmark is not part of the suite's timing, but one that crashes has no figure: a change
to the engine or the policy (a new required field, say) must not leave it broken unnoticed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

QUICK = {
    # benchmark: (tiny arguments, the key its figures are under)
    "client_requests": (["--requests", "50", "--runs", "1"], "cpu_us_per_request"),
    "decide_records": (["--records", "100", "--nodes", "20", "--runs", "1"], "results"),
    "decide_round": (["--nodes", "40", "--runs", "1"], "rows"),
    "controller_memory": (["--pods", "400", "--nodes", "20"], "sync_cpu_seconds"),
    # A storm on 40 nodes (2 fail): the controller's rounds are timed and read from its /metrics.
    "controller_scale": (["--nodes", "40", "--pods", "320", "--storm", "--storm-seconds", "2"], "longest_round_ms"),
    "stragglers": (
        ["--seeds", "1", "--steps", "60", "--healthy-steps", "60", "--slowdowns", "1.5", "--noise", "0.1"],
        "detection",
    ),
}


@pytest.mark.parametrize("benchmark", sorted(QUICK))
def test_a_quick_benchmark_runs_and_writes_its_figures(benchmark: str, tmp_path: Path) -> None:
    arguments, key = QUICK[benchmark]
    out = tmp_path / f"{benchmark}.json"
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{benchmark}", *arguments, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["benchmark"] == benchmark
    assert figures["command"].startswith(f"python -m bench.{benchmark} ")
    assert figures["machine"]["cpus"] >= 1
    assert figures[key]
