"""Child commands for the launch tests."""

from __future__ import annotations

from pathlib import Path


def handling_sigterm(handler: str, ready: Path) -> str:
    """Python code that installs ``handler`` for SIGTERM, then says so by creating ``ready``, then sleeps.

    Tests wait for ``ready`` before they signal, instead of sleeping and hoping the handler is in place.
    """
    return (
        f"import pathlib,signal,sys,time; signal.signal(signal.SIGTERM, {handler}); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
