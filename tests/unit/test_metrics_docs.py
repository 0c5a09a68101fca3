"""docs/metrics.md lists every metric the controller and the node agent register, with its type and labels,
and nothing else; none of them is one of dcgm-exporter's ``DCGM_FI_*`` series, and all follow Prometheus'
naming (``devheal_`` prefix, ``_total`` on counters, base units)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from devheal.agent.metrics import AgentMetrics
from devheal.controller import metrics as controller_metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
Row = tuple[str, str, tuple[str, ...]]


def documented(section: str) -> dict[str, Row]:
    """The table under ``## section``: name -> (name, type, labels)."""
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`devheal_"):
            continue
        labels = tuple(re.findall(r"`([^`]+)`", cells[2]))
        rows[cells[0].strip("`")] = (cells[0].strip("`"), cells[1], labels)
    assert rows, f"no metrics table under '## {section}' in {DOC}"
    return rows


def exposed_name(metric: MetricWrapperBase) -> str:
    """The name a scrape shows: a counter's family name gets ``_total`` (prometheus_client strips it)."""
    name: str = metric._name  # the client keeps the family name (and type, labels) only in these attributes
    return f"{name}_total" if metric._type == "counter" else name


def registered(metrics: list[MetricWrapperBase]) -> dict[str, Row]:
    rows = {}
    for metric in metrics:
        name = exposed_name(metric)
        rows[name] = (name, str(metric._type), tuple(metric._labelnames))
    return rows


def controller() -> dict[str, Row]:
    return registered([m for m in vars(controller_metrics).values() if isinstance(m, MetricWrapperBase)])


def agent() -> dict[str, Row]:
    made = AgentMetrics(CollectorRegistry())
    return registered([m for m in vars(made).values() if isinstance(m, MetricWrapperBase)])


@pytest.mark.parametrize(("section", "actual"), [("Controller", controller), ("Node agent", agent)])
def test_the_docs_list_exactly_the_registered_metrics(section: str, actual: object) -> None:
    assert callable(actual)
    assert documented(section) == actual()


@pytest.mark.parametrize("actual", [controller, agent])
def test_names_follow_prometheus_conventions_and_leave_dcgm_series_to_dcgm_exporter(actual: object) -> None:
    assert callable(actual)
    for name, kind, _ in actual().values():
        assert name.startswith("devheal_") and not name.startswith("DCGM_"), name
        assert name.endswith("_total") == (kind == "counter"), f"{name}: _total on counters, and only there"
        assert not re.search(r"_(ms|milliseconds|minutes|hours|bytes_total)$", name), f"{name}: base units"


def test_the_agent_exports_no_dcgm_series() -> None:
    registry = CollectorRegistry()
    AgentMetrics(registry)
    assert not [m.name for m in registry.collect() if m.name.upper().startswith("DCGM_")]
