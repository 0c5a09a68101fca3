"""The NodeDevices vocabulary: a reported reason's remedy as the controller reads it."""

from __future__ import annotations

import pytest

from devheal.model.node_devices import Remedy, reported_remedy


@pytest.mark.parametrize("remedy", list(Remedy))
def test_every_remedy_the_agent_writes_reads_back_as_itself(remedy: Remedy) -> None:
    assert reported_remedy(remedy.value) is remedy


@pytest.mark.parametrize("value", [None, "", "Pray", "replacehardware", 3, ["ReplaceHardware"]])
def test_a_remedy_not_said_or_not_known_reads_as_none(value: object) -> None:
    assert reported_remedy(value) is None
