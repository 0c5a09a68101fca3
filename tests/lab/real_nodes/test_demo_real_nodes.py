"""`devheal demo --real-nodes`, run non-interactively: the chart's devheal heals every fault on real kubelets."""

from __future__ import annotations

import ast
import io
import re
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from devheal.demo import real_nodes

# The chart install may build the image the first time (a minute or two).
pytestmark = pytest.mark.timeout(1200)


async def test_the_real_node_demo_heals_every_fault_and_disrupts_nothing_else(real_lab: object) -> None:
    # ``real_lab`` only for its skip where real nodes cannot run: the demo brings its own lab.
    out = io.StringIO()
    console = Console(file=out, no_color=True, width=200)
    directory = Path(tempfile.mkdtemp(prefix="dhl-demo-", dir="/tmp"))
    results = await real_nodes.run(console, keep=False, observe_seconds=0, directory=directory)
    text = out.getvalue()
    assert [r.action for r in results] == ["Deschedule", "RestartGang", "none (no device failed)"], text
    for r in results:
        assert r.ok, (r, text)
    assert "restarted in place by kubelet (RestartAllContainers)" in text
    # The rank that kept its GPU restarted in place (kubelet counted one restart of its training container);
    # the replaced rank's new pod started once.
    counts = re.search(r"restarts as kubelet counts them: (\{[^}]*\})", text)
    assert counts, text
    assert sorted(ast.literal_eval(counts.group(1)).values()) == [0, 1], text
    assert "tearing the lab down" in text
