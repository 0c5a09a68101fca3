"""The README's first command, run non-interactively: every fault detected and healed, nothing else disrupted."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

from rich.console import Console

from devheal.demo import story


async def test_demo_heals_every_fault_and_disrupts_nothing_else() -> None:
    out = io.StringIO()
    console = Console(file=out, no_color=True, width=160)
    directory = Path(tempfile.mkdtemp(prefix="devheal-demo-", dir="/tmp"))
    results = await story.run(console, keep=False, nodes=4, observe_seconds=0, directory=directory)
    text = out.getvalue()
    assert [r.action for r in results] == [
        "Deschedule",
        "RestartGang",
        "Taint + RemediateNode",
        "none (no device failed)",
    ]
    for r in results:
        assert r.ok, (r, text)
        assert r.pods_disrupted == r.expected_disrupted, (r, text)
    assert results[0].detection_seconds is not None and results[1].detection_seconds is not None
    assert "summary" in text and "tearing the lab down" in text
