"""The training command as a child process: started in its own process group, stopped politely, then firmly.

Training commands fork (torchrun, data-loader workers), so signals go to the whole
process group: SIGTERM first, SIGKILL once the grace period is over. Whatever is left
of the group once its leader has gone is killed too, so a restarted command never finds
the previous run's workers still holding its GPUs. As a container's PID 1 the launcher
also inherits every orphaned process; ``reap_orphans`` collects their exit statuses so
they do not pile up as zombies over many restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Container, Mapping, Sequence

log = logging.getLogger(__name__)

COMMAND_NOT_FOUND = 127
COMMAND_NOT_EXECUTABLE = 126


class ChildStartError(Exception):
    """The command could not be started; ``exit_code`` follows the shell's convention (127, 126)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_of(returncode: int) -> int:
    """A process's return code as a shell reports it: 128+N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


class ChildProcess:
    """One run of the command. ``wait`` gives its exit code; ``stop`` ends it within the grace period."""

    def __init__(self, process: asyncio.subprocess.Process, command: Sequence[str]) -> None:
        self.process = process
        self.command = list(command)
        self.pid = process.pid
        self.stop_requested = False

    @classmethod
    async def start(cls, command: Sequence[str], env: Mapping[str, str]) -> ChildProcess:
        """Start ``command`` (stdin, stdout and stderr inherited) as the leader of a new process group."""
        if not command:
            raise ChildStartError("no command to run", COMMAND_NOT_FOUND)
        try:
            process = await asyncio.create_subprocess_exec(*command, env=dict(env), process_group=0)
        except FileNotFoundError as exc:
            raise ChildStartError(f"command not found: {command[0]} ({exc.strerror})", COMMAND_NOT_FOUND) from exc
        except PermissionError as exc:
            raise ChildStartError(
                f"command not executable: {command[0]} ({exc.strerror})", COMMAND_NOT_EXECUTABLE
            ) from exc
        except OSError as exc:
            raise ChildStartError(f"cannot start {command[0]}: {exc}", COMMAND_NOT_EXECUTABLE) from exc
        return cls(process, command)

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def wait(self) -> int:
        """Wait until the command ends; its exit code (128+N for signal N)."""
        return exit_code_of(await self.process.wait())

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the command's process group; False when the group is gone."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            log.warning("not allowed to signal process group %d", self.pid)
            return False
        return True

    async def stop(self, grace: float) -> int:
        """SIGTERM to the group, SIGKILL after ``grace`` seconds; then kill what is left of the group. Exit code."""
        self.stop_requested = True
        if self.running:
            self.signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout=grace)
            except TimeoutError:
                log.warning(
                    "command %s (pid %d) still runs %.1fs after SIGTERM; sending SIGKILL",
                    self.command[0],
                    self.pid,
                    grace,
                )
        if not self.signal_group(signal.SIGKILL) and self.running:
            # The leader left its group: kill it alone. With os.kill, not Process.kill: Popen.send_signal
            # polls first and can take the exit status from asyncio's child watcher, which then reports 255.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        return await self.wait()


def reap_orphans(keep: Container[int]) -> list[int]:
    """Reap exited child processes other than ``keep`` (left to their owners); the pids reaped.

    Peeks first (``WNOWAIT``) so the exit status of a process in ``keep`` is never taken
    from the code waiting for it; stops at the first such process and tries again later.
    """
    reaped: list[int] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid == 0 or info.si_pid in keep:
            return reaped
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, os.WNOHANG)
        reaped.append(info.si_pid)
