"""Benchmark: how long each ``devheal`` entry point takes to start, against the 0.5 s goal.

    python -m bench.startup              # every entry point, 5 runs each
    python -m bench.startup --runs 10

Spawns each entry point as a fresh process (``python -m devheal ...``, the console script's
code path) ``--runs`` times, after one warm-up run that also writes the bytecode an installed
package has, and reports the median and the slowest wall time. Besides the
``--help`` of every command it runs ``barrier`` for real against an API server that refuses
connections (127.0.0.1:1): everything a restarting training pod's init container loads, up
to its first request, once as is and once with ``SSL_CERT_FILE`` naming one CA certificate
(aiohttp loads the CA bundle at import: in a pod, the service account's ``ca.crt`` is all the
API server needs). `barrier` and `sidecar` sit on that restart path, hence the goal.
Prints a table and writes bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import write_results

RESULTS = Path(__file__).parent / "results"
GOAL_S = 0.5

HELP = ["--help"]
ENTRY_POINTS: dict[str, list[str]] = {
    "devheal --help": HELP,
    "devheal barrier --help": ["barrier", *HELP],
    "devheal sidecar --help": ["sidecar", *HELP],
    "devheal controller --help": ["controller", *HELP],
    "devheal agent --help": ["agent", *HELP],
    "devheal simulate --help": ["simulate", *HELP],
    "devheal launch --help": ["launch", *HELP],
    "devheal crds --help": ["crds", *HELP],
    "devheal lab --help": ["lab", *HELP],
}

REFUSING_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: refused, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: refused, context: {cluster: refused, user: u}}]
current-context: refused
"""


class Failed(Exception):
    """The entry point did not run as expected (e.g. a command this version does not have)."""


def one_certificate(directory: Path) -> Path | None:
    """A file holding one CA certificate (the first of the system's), as a pod's service-account ``ca.crt``."""
    bundle = ssl.get_default_verify_paths().cafile
    if not bundle or not Path(bundle).is_file():
        return None
    text = Path(bundle).read_text(encoding="ascii", errors="replace")
    end = text.find("-----END CERTIFICATE-----")
    start = text.rfind("-----BEGIN CERTIFICATE-----", 0, end)
    if start < 0 or end < 0:
        return None
    path = directory / "ca.crt"
    path.write_text(text[start : end + len("-----END CERTIFICATE-----")] + "\n", encoding="ascii")
    return path


def once(args: list[str], env: dict[str, str], ok: set[int]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "devheal", *args], env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in ok:
        raise Failed(f"exited {done.returncode}: {done.stderr.decode(errors='replace').strip()[-300:]}")
    return elapsed


def measure(name: str, args: list[str], runs: int, env: dict[str, str], ok: set[int]) -> dict[str, Any]:
    try:
        once(args, env, ok)  # warm the file cache, as a pod's second start would be
        times = [once(args, env, ok) for _ in range(runs)]
    except Failed as exc:
        return {"entry_point": name, "error": str(exc)}
    median = statistics.median(times)
    return {
        "entry_point": name,
        "median_s": round(median, 3),
        "max_s": round(max(times), 3),
        "runs_s": [round(t, 3) for t in times],
        "goal_met": median < GOAL_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "startup.json")
    args = parser.parse_args()
    # Bytecode is written on the warm-up run, as an installed package has it (pip compiles on install).
    skip = ("KUBECONFIG", "PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(REFUSING_KUBECONFIG)
        cases = [(name, argv, {0}, env) for name, argv in ENTRY_POINTS.items()]
        barrier = ["barrier", "--pod", "p", "--namespace", "ns", "--kubeconfig", str(kubeconfig)]
        cases.append(("devheal barrier (runs; API refuses)", barrier, {2}, env))
        ca = one_certificate(Path(tmp))
        if ca is not None:
            # aiohttp loads the system's CA bundle twice at import; in a pod it can be the service account's CA.
            small = {**env, "SSL_CERT_FILE": str(ca), "SSL_CERT_DIR": str(Path(tmp) / "none")}
            cases.append(("devheal barrier (runs; SSL_CERT_FILE=ca.crt)", barrier, {2}, small))
        for name, argv, ok, case_env in cases:
            print(f"{name} ...", flush=True)
            rows.append(measure(name, argv, args.runs, case_env, ok))
    width = max(len(r["entry_point"]) for r in rows)
    print(f"{'entry point':<{width}} {'median s':>9} {'max s':>7}  goal < {GOAL_S} s")
    for row in rows:
        if "error" in row:
            print(f"{row['entry_point']:<{width}} {'-':>9} {'-':>7}  {row['error'][:60]}")
            continue
        verdict = "met" if row["goal_met"] else "NOT met"
        print(f"{row['entry_point']:<{width}} {row['median_s']:>9.3f} {row['max_s']:>7.3f}  {verdict}")
    write_results(args.out, "startup", {"goal_s": GOAL_S, "runs": args.runs, "results": rows})


if __name__ == "__main__":
    main()
