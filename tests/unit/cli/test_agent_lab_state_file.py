"""`devheal agent --lab-state-file`: one node's simulated GPUs from a file; with anything else that names the
lab's GPUs, or without the simulated backend, it is a bad option saying which."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from devheal.cli.app import app


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--backend", "simulated", "--lab-url", "http://127.0.0.1:1"], "give it without --lab-dir, --lab-url"),
        (["--backend", "nvml"], "--lab-state-file need --backend simulated"),
    ],
    ids=["with-lab-url", "nvml"],
)
def test_the_state_file_goes_alone_and_with_the_simulated_backend(extra: list[str], message: str) -> None:
    args = ["agent", "--node-name", "n1", "--lab-state-file", "/nonexistent/gpus.json", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "".join(message.split()) in "".join(result.output.split()), result.output
    assert "Traceback" not in result.output
