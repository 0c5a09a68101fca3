"""The child process: real processes, real signals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devheal.launch.child import ChildProcess, ChildStartError, exit_code_of, reap_orphans
from tests.shell.waiting import until
from tests.unit.launch.children import handling_sigterm

PY = sys.executable


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_exit_code_of_a_command_that_ends() -> None:
    child = await ChildProcess.start([PY, "-c", "raise SystemExit(3)"], os.environ)
    assert await child.wait() == 3


async def test_environment_is_passed() -> None:
    child = await ChildProcess.start(
        [PY, "-c", "import os,sys; sys.exit(0 if os.environ['X_TEST'] == 'y' else 1)"], {**os.environ, "X_TEST": "y"}
    )
    assert await child.wait() == 0


async def test_stop_with_sigterm_handled_politely(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = await ChildProcess.start([PY, "-c", handling_sigterm("lambda *a: sys.exit(7)", ready)], os.environ)
    await until(ready.exists, "the child's SIGTERM handler")
    # 7 is the handler's own exit: the grace period was not used up, no SIGKILL came.
    assert await child.stop(grace=30) == 7


async def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    ready, termed = tmp_path / "ready", tmp_path / "termed"
    # The handler notes the SIGTERM and carries on, so only a SIGKILL ends the child.
    handler = f"lambda *a: pathlib.Path({str(termed)!r}).touch()"
    child = await ChildProcess.start([PY, "-c", handling_sigterm(handler, ready)], os.environ)
    await until(ready.exists, "the child to handle SIGTERM")
    assert await child.stop(grace=0.5) == 128 + 9
    assert termed.exists(), "SIGTERM came before the SIGKILL"


async def test_stop_reaches_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess,sys,time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    child = await ChildProcess.start([PY, "-c", code], os.environ)
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert await child.stop(grace=2) == 128 + 15
    for _ in range(100):
        if not alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not alive(grandchild), "the grandchild was stopped with its group"


async def test_stop_after_exit_returns_the_code() -> None:
    child = await ChildProcess.start([PY, "-c", "pass"], os.environ)
    assert await child.wait() == 0
    assert await child.stop(grace=1) == 0


async def test_missing_command_says_so() -> None:
    with pytest.raises(ChildStartError, match="command not found: /no/such/trainer") as info:
        await ChildProcess.start(["/no/such/trainer"], os.environ)
    assert info.value.exit_code == 127


async def test_not_executable_says_so(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ChildStartError, match="not executable") as info:
        await ChildProcess.start([str(script)], os.environ)
    assert info.value.exit_code == 126


def test_exit_code_of() -> None:
    assert exit_code_of(0) == 0 and exit_code_of(79) == 79 and exit_code_of(-15) == 143 and exit_code_of(-9) == 137


def test_reap_orphans_collects_exited_processes_but_leaves_the_kept_one() -> None:
    kept = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    orphans = [subprocess.Popen([PY, "-c", "pass"]) for _ in range(2)]
    try:
        _until(lambda: all(_is_zombie(p.pid) for p in orphans))
        assert sorted(reap_orphans({kept.pid})) == sorted(p.pid for p in orphans)
        assert not any(_exists(p.pid) for p in orphans)
        kept.kill()
        _until(lambda: _is_zombie(kept.pid))
        assert reap_orphans({kept.pid}) == []
        assert kept.wait(timeout=5) == -9, "the kept process's exit status is left to its owner"
        assert reap_orphans(set()) == []
    finally:
        kept.kill()
        for p in orphans:
            p.returncode = 0  # already reaped: keep Popen from waiting on a pid that is gone


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return False
