"""Options converted without pydantic (``devheal.cli.params``) behave as typer's own conversion does."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from devheal.cli import params
from devheal.cli.app import app as devheal_app

runner = CliRunner()


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


def make_app() -> typer.Typer:
    params.install()
    app = typer.Typer(rich_markup_mode=None, add_completion=False)

    @app.command()
    def show(
        name: Annotated[str, typer.Option()] = "x",
        count: Annotated[int, typer.Option(min=1, max=9)] = 1,
        ratio: Annotated[float | None, typer.Option()] = None,
        path: Annotated[Path | None, typer.Option()] = None,
        color: Annotated[Color, typer.Option(case_sensitive=False)] = Color.RED,
        tags: Annotated[list[str] | None, typer.Option("--tag")] = None,
        flag: Annotated[bool, typer.Option(envvar="FLAG")] = False,
    ) -> None:
        typer.echo(repr((name, count, ratio, path, color, tags, flag)))

    return app


def test_plain_values_are_converted_to_their_types() -> None:
    result = runner.invoke(
        make_app(),
        [
            *("--name", "n", "--count", "3", "--ratio", "0.5", "--path", "/a/b"),
            *("--color", "BLUE", "--tag", "a", "--tag", "b"),
        ],
        env={"FLAG": "yes"},
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr(("n", 3, 0.5, Path("/a/b"), Color.BLUE, ["a", "b"], True))


def test_defaults_pass_through() -> None:
    result = runner.invoke(make_app(), [])
    assert result.output.strip() == repr(("x", 1, None, None, Color.RED, None, False))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--count", "0"], "Invalid value for '--count': 0 is not in the range 1<=x<=9."),
        (["--count", "x"], "Invalid value for '--count': 'x' is not a valid integer."),
        (["--ratio", "fast"], "Invalid value for '--ratio': 'fast' is not a valid float."),
        (["--color", "green"], "Invalid value for '--color': 'green' is not one of 'red', 'blue'."),
    ],
)
def test_bad_values_name_the_option_and_what_was_expected(args: list[str], message: str) -> None:
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 2
    assert message in result.output


def test_annotations_that_are_not_plain_go_to_typer() -> None:
    assert params.plain_type(str | None) == (str, False)
    assert params.plain_type(list[Path] | None) == (Path, True)
    assert params.plain_type(Color) == (Color, False)
    assert params.plain_type(tuple[int, int]) is None
    assert params.plain_type(int | str) is None


def test_devheal_options_keep_their_checks() -> None:
    result = runner.invoke(devheal_app, ["sidecar", "--pod", "p", "--namespace", "ns", "--exit-code", "256"])
    assert result.exit_code == 2
    assert "'--exit-code': 256 is not in the range 1<=x<=255." in result.output
    result = runner.invoke(devheal_app, ["barrier", "--pod", "p", "--namespace", "ns", "--log-format", "xml"])
    assert result.exit_code == 2
    assert "'xml' is not one of 'json', 'text', 'auto'." in result.output
