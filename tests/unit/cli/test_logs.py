"""Logs: every record is one line holding one valid JSON object (or text for a person on a terminal)."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest
import typer

from devheal.cli import logs

RFC3339_MILLIS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, given back as it was."""
    logger = logging.getLogger()
    handlers, level = logger.handlers[:], logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    lines = stream.getvalue().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    "message",
    ['a "quoted" word and a \\ backslash', "two\nlines\r\nand a tab\t", "GPU 0 ✗ naïve 日本語 🔥", "{}", ""],
    ids=["quotes", "newlines", "non-ascii", "braces", "empty"],
)
def test_each_message_is_one_parseable_json_line(root: logging.Logger, message: str) -> None:
    stream = io.StringIO()
    logs.setup("INFO", "json", stream)
    logging.getLogger("devheal.test").warning("%s", message)
    (entry,) = json_lines(stream)
    assert entry["message"] == message
    assert entry["level"] == "WARNING" and entry["logger"] == "devheal.test"
    assert RFC3339_MILLIS.match(str(entry["time"])), entry["time"]


def test_an_exception_is_a_field_of_the_same_line(root: logging.Logger) -> None:
    stream = io.StringIO()
    logs.setup("INFO", "json", stream)
    try:
        raise ValueError('bad "value"\nsecond line')
    except ValueError:
        logging.getLogger("devheal.test").exception("it failed")
    (entry,) = json_lines(stream)
    assert entry["message"] == "it failed"
    assert str(entry["exc"]).startswith("Traceback (most recent call last):")
    assert 'ValueError: bad "value"\nsecond line' in str(entry["exc"])


def test_extra_fields_are_fields(root: logging.Logger) -> None:
    stream = io.StringIO()
    logs.setup("DEBUG", "json", stream)
    extra = {"node": "gpu-node-000", "gpus": [0, 1], "ratio": float("nan"), "where": object()}
    logging.getLogger("devheal.test").debug("seen", extra=extra)
    (entry,) = json_lines(stream)
    assert entry["node"] == "gpu-node-000" and entry["gpus"] == [0, 1]
    assert entry["ratio"] == "nan"  # NaN is not JSON
    assert str(entry["where"]).startswith("<object object")


def test_records_below_the_level_are_dropped(root: logging.Logger) -> None:
    stream = io.StringIO()
    logs.setup("warning", "json", stream)
    logging.getLogger("devheal.test").info("quiet")
    assert stream.getvalue() == ""


def test_auto_is_text_on_a_terminal_and_json_elsewhere(root: logging.Logger) -> None:
    tty = Tty()
    logs.setup("INFO", "auto", tty)
    logging.getLogger("devheal.test").info("hello %s", "you", extra={"node": "n1"})
    assert re.match(r"^\d\d:\d\d:\d\d\.\d{3} INFO  devheal\.test: hello you node=n1$", tty.getvalue().strip())
    pipe = io.StringIO()
    logs.setup("INFO", "auto", pipe)
    logging.getLogger("devheal.test").info("hello")
    assert json_lines(pipe)[0]["message"] == "hello"


def test_setup_replaces_earlier_handlers(root: logging.Logger) -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.setup("INFO", "json", first)
    logs.setup("INFO", "json", second)
    logging.getLogger("devheal.test").info("once")
    assert first.getvalue() == "" and len(json_lines(second)) == 1


@pytest.mark.parametrize(("level", "fmt", "hint"), [("LOUD", "json", "--log-level"), ("INFO", "xml", "--log-format")])
def test_bad_settings_name_the_option(root: logging.Logger, level: str, fmt: str, hint: str) -> None:
    with pytest.raises(typer.BadParameter) as caught:
        logs.setup(level, fmt, io.StringIO())
    assert caught.value.param_hint == hint


def test_rfc3339_millis() -> None:
    assert logs.rfc3339_millis(1_796_112_000.1234) == "2026-12-01T08:00:00.123Z"
