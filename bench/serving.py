"""A benchmark's in-memory API server in a process of its own: started, waited for, stopped."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def serving(module: str, *arguments: str) -> Iterator[subprocess.Popen[str]]:
    """Run ``python -m bench.<module> --role=serve <arguments>`` and yield it once it printed ``ready`` (it serves);
    on the way out its stdin is closed, which stops it, and it is waited for."""
    server = subprocess.Popen(
        [sys.executable, "-m", f"bench.{module}", "--role=serve", *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the in-memory API server did not start")
        yield server
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=60)
