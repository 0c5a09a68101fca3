"""``devheal launch`` refuses bad input with messages that name the flag (or environment variable) to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from devheal.cli.app import app
from devheal.cli.launch import parse_exit_codes


def plain(output: str) -> str:
    """The output without rich's box drawing and line wrapping."""
    return " ".join(output.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    return CliRunner()


def test_missing_pod_name_names_the_flag_and_the_variable(runner: CliRunner) -> None:
    result = runner.invoke(app, ["launch", "--namespace", "ns", "--", "python", "train.py"])
    assert result.exit_code == 2
    assert "--pod NAME or $POD_NAME" in plain(result.output)


def test_missing_namespace_names_the_flag_and_the_variable(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("devheal.cli.launch.SERVICE_ACCOUNT_NAMESPACE", Path("/no/such/file"))
    result = runner.invoke(app, ["launch", "--", "python", "train.py"], env={"POD_NAME": "rank-0"})
    assert result.exit_code == 2
    assert "--namespace NS or $POD_NAMESPACE" in plain(result.output)


def test_missing_command(runner: CliRunner) -> None:
    result = runner.invoke(app, ["launch", "--pod", "p", "--namespace", "ns"])
    assert result.exit_code == 2
    assert "Missing argument" in plain(result.output)


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["--steps-addr", "0.0.0.0:9000"], "loopback"),
        (["--device-error-exit-codes", "79,abc"], "exit codes within 1..255"),
        (["--device-error-exit-codes", "300"], "exit codes within 1..255"),
        (["--grace", "-1"], "must be >= 0"),
        (["--barrier-timeout", "-5"], "must be >= 0"),
        (["--hold-failed", "-1"], "must be within 0..86400 seconds"),
        (["--hold-failed", "100000"], "must be within 0..86400 seconds"),
        (["--probe-interval", "0"], "must be within 1..60 seconds"),
        (["--probe-store", "llm-0"], "--probe-store: expected HOST:PORT with a port within 1..65535"),
        (["--probe-store", "llm-0:99999"], "--probe-store: expected HOST:PORT"),
    ],
)
def test_bad_options(runner: CliRunner, args: list[str], hint: str) -> None:
    result = runner.invoke(app, ["launch", "--pod", "p", "--namespace", "ns", *args, "--", "true"])
    assert result.exit_code == 2
    assert hint in plain(result.output), result.output


def test_a_bad_rendezvous_environment_names_the_variables(runner: CliRunner) -> None:
    result = runner.invoke(
        app,
        ["launch", "--pod", "p", "--namespace", "ns", "--", "true"],
        env={"MASTER_ADDR": "llm-0", "MASTER_PORT": "http"},
    )
    assert result.exit_code == 2
    assert "$MASTER_ADDR:$MASTER_PORT: expected HOST:PORT" in plain(result.output), result.output


def test_an_unreadable_kubeconfig_is_a_clear_error(runner: CliRunner) -> None:
    result = runner.invoke(
        app, ["launch", "--pod", "p", "--namespace", "ns", "--kubeconfig", "/no/such/kubeconfig", "--", "true"]
    )
    assert result.exit_code == 2
    assert "cannot load Kubernetes configuration from /no/such/kubeconfig" in plain(result.output)


def test_options_after_the_double_dash_belong_to_the_command(runner: CliRunner) -> None:
    # --grace after `--` is the command's, so the launcher's own options stay valid and it reaches the kubeconfig.
    result = runner.invoke(
        app, ["launch", "--pod", "p", "--namespace", "ns", "--kubeconfig", "/nope", "--", "train", "--grace", "-1"]
    )
    assert "cannot load Kubernetes configuration" in plain(result.output)


def test_parse_exit_codes() -> None:
    assert parse_exit_codes("") == frozenset()
    assert parse_exit_codes("74, 79,,79") == frozenset({74, 79})
    with pytest.raises(ValueError, match="'0'"):
        parse_exit_codes("0")


@pytest.mark.parametrize("command", ["barrier", "sidecar"])
def test_barrier_and_sidecar_need_their_pod_name(runner: CliRunner, command: str) -> None:
    result = runner.invoke(app, [command, "--namespace", "ns"])
    assert result.exit_code == 2
    assert "--pod NAME or $POD_NAME" in plain(result.output)


def test_sidecar_exit_code_must_be_a_valid_exit_code(runner: CliRunner) -> None:
    result = runner.invoke(app, ["sidecar", "--pod", "p", "--namespace", "ns", "--exit-code", "256"])
    assert result.exit_code == 2
    assert "--exit-code" in plain(result.output)


def test_barrier_timeout_must_not_be_negative(runner: CliRunner) -> None:
    result = runner.invoke(app, ["barrier", "--pod", "p", "--namespace", "ns", "--barrier-timeout", "-1"])
    assert result.exit_code == 2
    assert "--barrier-timeout" in plain(result.output)


def test_sidecar_with_an_unreadable_kubeconfig_is_a_clear_error(runner: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = runner.invoke(app, ["sidecar", "--pod", "p", "--namespace", "ns", "--kubeconfig", str(missing)])
    assert result.exit_code == 2
    assert "devheal sidecar:" in result.output
