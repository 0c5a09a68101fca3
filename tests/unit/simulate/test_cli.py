"""``devheal simulate``: the comparison table, results.json, policy files, trace replay, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from devheal.cli.app import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[3]
SMALL = ["simulate", "--nodes", "64", "--days", "10", "--no-plots", "--no-color"]


def test_compares_every_strategy_and_writes_json(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--seeds", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("kubernetes-default", "node-health-controller", "pod-watcher", "devheal-default"):
        assert name in result.output
    assert "GPU-hours lost by cause" in result.output and "Remediations by type" in result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["results"]) == {"kubernetes-default", "node-health-controller", "pod-watcher", "devheal-default"}
    assert [t["seed"] for t in data["traces"]] == [0, 1]
    first = data["results"]["devheal-default"][0]
    assert 0 < first["training_ettr"] <= 1 and set(first["recovery_s"]) == {"p50", "p90", "p99"}
    assert data["config"]["fleet"]["gpus"] == (64 + 2) * 8
    assert data["summary"]["devheal-default"]["seeds"] == [0, 1]


def test_a_policy_file_adds_a_strategy(tmp_path: Path) -> None:
    policy = tmp_path / "restart.yaml"
    policy.write_text(
        "apiVersion: devheal.io/v1alpha1\nkind: RemediationPolicy\nmetadata: {name: restart-in-place}\n"
        "spec:\n  selector: {podSelector: {}}\n  actions: {gang: RestartGang}\n"
    )
    result = runner.invoke(app, [*SMALL, "--policy", str(policy), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "policy:restart-in-place" in result.output


def test_the_example_policies_act_in_the_simulator(tmp_path: Path) -> None:
    examples = REPO / "deploy" / "examples"
    args = [a for path in sorted(examples.glob("*.yaml")) for a in ("--policy", str(path))]
    result = runner.invoke(app, [*SMALL, "--rate", "2e-4", *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    for name in ("policy:recommended", "policy:recommended-ladder"):
        [run] = data["results"][name]
        assert any(kind.startswith("devheal:") for kind in run["remediations"]), name


def test_bound_adds_the_ideal_bound_last(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--bound", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert list(data["results"])[-1] == "ideal-bound"


def test_rate_and_spares_override_the_preset(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--rate", "2e-4", "--spare-nodes", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["fleet"]["spare_nodes"] == 1
    assert data["config"]["trace"]["rate_per_gpu_hour"] == 2e-4
    assert data["traces"][0]["faults"] > 65 * 8 * 240 * 2e-4 / 2  # about 25 expected


def test_replays_a_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "faults.csv"
    trace.write_text("time_h,node,class\n5,0,faulty-gpu\n30,3,network\n")
    result = runner.invoke(app, [*SMALL, "--trace", str(trace), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["traces"][0]["faults"] == 2
    assert data["results"]["pod-watcher"][0]["interruptions"] == 2


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    bad_policy = tmp_path / "bad.yaml"
    bad_policy.write_text("kind: RemediationPolicy\nmetadata: {name: bad}\nspec: {actions: {gang: Reboot}}\n")
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("kind: RemediationPolicy\nmetadata: {name: web}\nspec: {selector: {namespaces: [web]}}\n")
    cases = [
        (["--policy", str(bad_policy)], "spec.actions.gang: expected one of"),
        (["--policy", str(elsewhere)], "selects none of the simulated workloads' namespaces (ml-training, "),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--trace", str(tmp_path / "missing.csv")], "no such file"),
        (["--seeds", "0"], "--seeds: expected at least 1"),
        (["--spare-nodes", "-1"], "fleet.spare_nodes: expected >= 0"),
        (["--rate", "-1"], "rate_per_gpu_hour: expected a rate >= 0"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, [*SMALL, *extra, "--out", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output


def test_checkpointing_option_and_its_error(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--checkpointing", "in-memory", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["fleet"]["gangs"][0]["checkpoint_interval_s"] == 120.0
    assert "Training GPU-hours lost by cause" in result.output
    bad = runner.invoke(app, [*SMALL, "--checkpointing", "hourly", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "checkpointing: unknown 'hourly'" in bad.output


def test_culprit_model_and_parallelism_options_and_their_errors(tmp_path: Path) -> None:
    result = runner.invoke(
        app, [*SMALL, "--culprit-model", "always-named", "--parallelism", "ddp", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "ddp gangs, culprits always-named" in result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["culprits"] == {"name": "always-named", "probability": 1.0}
    assert data["config"]["fleet"]["gangs"][0]["parallelism"] == "ddp"
    bad = runner.invoke(app, [*SMALL, "--culprit-model", "sometimes", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "culprit model: unknown 'sometimes'" in bad.output
    bad = runner.invoke(app, [*SMALL, "--parallelism", "tp", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "parallelism: unknown 'tp'" in bad.output


def test_jobs_runs_in_worker_processes_and_a_bad_count_is_named(tmp_path: Path) -> None:
    result = runner.invoke(app, [*SMALL, "--jobs", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "devheal-default" in json.loads((tmp_path / "results.json").read_text())["results"]
    result = runner.invoke(app, [*SMALL, "--jobs", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--jobs: expected at least 1, got 0" in result.output
