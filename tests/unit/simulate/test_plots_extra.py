"""Plotting is the optional extra ``devheal[plots]``: without matplotlib, ``devheal simulate`` writes its
results and says how to get the plots instead of failing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from devheal.cli.app import app

SMALL = ["simulate", "--nodes", "16", "--days", "2", "--no-color"]


def test_without_matplotlib_the_results_are_written_and_the_extra_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        return None if name == "matplotlib" else real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", no_matplotlib)
    result = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "plots skipped: matplotlib is not installed (pip install 'devheal[plots]', or pass --no-plots)" in (
        " ".join(result.output.split())
    )
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
