"""What every benchmark writes beside its table: its figures as JSON, with what tells one run from another.

``write_results`` adds the benchmark's name, the command line that produced the figures,
when, and the machine (CPUs, Python, platform), so that a figure quoted anywhere can be
traced to a command and compared only with runs on a like machine.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devheal.model.times import format_time


def write_results(out: Path, benchmark: str, figures: Mapping[str, Any]) -> None:
    """Write ``figures`` to ``out`` (creating its folder) with the run's identity, and say where."""
    document = {
        "benchmark": benchmark,
        "command": shlex.join(["python", "-m", f"bench.{benchmark}", *sys.argv[1:]]),
        "when": format_time(time.time()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        **figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")
