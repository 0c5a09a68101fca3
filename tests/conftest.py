"""Shared pytest set-up: lab tests are marked ``lab`` by living under tests/lab/."""

from __future__ import annotations

from pathlib import Path

import pytest

LAB_DIR = Path(__file__).parent / "lab"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if LAB_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.lab)
