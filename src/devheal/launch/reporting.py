"""``report_step``: the one call a training loop makes to tell its launcher how long a step took.

Runs inside the training process, so it imports only the standard library, never raises,
and never waits long: one small POST over loopback with a short timeout, on a kept-alive
connection (a new connection per step would leave thousands of sockets in TIME_WAIT at
high step rates). Without a launcher (``DEVHEAL_LAUNCHER_ADDR`` unset) it does nothing.
``report_collective`` is cheaper still: it counts in memory, and a daemon thread posts the
count when it changed, at most every ``COLLECTIVES_POST_SECONDS`` (also while the training
thread is blocked in a collective). ``collective()`` (or ``enter_collective`` and
``leave_collective``, for a collective that completes on another thread) marks the exit as
well: the launcher then knows whether the rank is inside a collective, waiting for its peers,
and since when.
When the launcher does not answer, reports are skipped for a while instead of costing
every step a timeout. Safe across threads and ``fork`` (data-loader workers).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

ADDR_ENV = "DEVHEAL_LAUNCHER_ADDR"
"""Set by the launcher for its child: ``host:port`` of its step endpoint (loopback)."""
RESTARTS_ENV = "DEVHEAL_LAUNCHER_RESTARTS"
"""Set by the launcher for its child: how many times it restarted the command in place (0 on the first run)."""
STEPS_PATH = "/steps"
TIMEOUT_SECONDS = 0.25
BACKOFF_SECONDS = 10.0
"""After a failed report, skip reports for this long."""
COLLECTIVES_POST_SECONDS = 0.5
"""The collective count is posted at most this often (and only when it changed)."""

log = logging.getLogger(__name__)

_state: dict[str, float | bool] = {"suspended_until": 0.0, "told_absent": False}


class _Connection:
    """One kept-alive connection to the launcher, shared by the threads of one process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: http.client.HTTPConnection | None = None
        self.target: tuple[str, int] | None = None

    def post(self, host: str, port: int, body: bytes) -> int:
        if not self.lock.acquire(timeout=TIMEOUT_SECONDS):
            raise TimeoutError("another thread is still reporting")
        try:
            for attempt in range(2):
                reused = self.conn is not None and self.target == (host, port)
                if not reused:
                    self.close()
                    self.conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_SECONDS)
                    self.target = (host, port)
                assert self.conn is not None
                try:
                    self.conn.request("POST", STEPS_PATH, body=body, headers={"Content-Type": "application/json"})
                    response = self.conn.getresponse()
                    response.read()
                    return response.status
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    self.close()
                    if not reused or attempt:
                        raise  # a kept-alive connection the launcher closed is retried once, fresh
                except Exception:
                    self.close()
                    raise
            raise AssertionError("unreachable")
        finally:
            self.lock.release()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.target = None


class _CollectiveCounter:
    """The collectives this process entered and left, counted in memory; a daemon thread started on the first count
    posts them to the launcher when they changed (one thread per process, never a post on the training thread).

    ``count`` counts every entry (``report_collective`` and ``enter_collective``); ``exits`` the exits marked
    (``leave_collective``); ``depth`` how many marked collectives are open now (nested, or several in flight at
    once), and ``entered_at`` when the oldest of them was entered (monotonic seconds)."""

    def __init__(self) -> None:
        self.count = 0
        self.exits = 0
        self.depth = 0
        self.entered_at = 0.0
        self.marked = False
        """Whether the process marks exits (then each post says whether it is inside a collective)."""
        self.posted: tuple[int, int, bool] = (0, 0, False)
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.marks_lock = threading.Lock()
        """Serialises the marks: a collective's exit may be marked on the thread that completes it."""

    def enter(self) -> None:
        self.count += 1  # one bytecode-level increment under the GIL; a lost race costs one count, never a crash
        self._start()

    def enter_marked(self) -> None:
        with self.marks_lock:
            self.count += 1
            self.marked = True
            if self.depth == 0:
                self.entered_at = time.monotonic()
            self.depth += 1
        self._start()

    def leave_marked(self) -> None:
        with self.marks_lock:
            if self.depth == 0:
                log.debug("leave_collective() without enter_collective(): ignored")
                return
            self.depth -= 1
            self.exits += 1

    def _start(self) -> None:
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    self.thread = threading.Thread(target=self._post_changes, name="devheal-collectives", daemon=True)
                    self.thread.start()

    def _post_changes(self) -> None:
        while True:
            time.sleep(COLLECTIVES_POST_SECONDS)
            self.post_if_changed()

    def snapshot(self) -> tuple[tuple[int, int, bool], dict[str, object]]:
        """What changed is judged by (entries, exits, inside); the body to post says it, with how long the rank has
        been inside its collective (the launcher turns that into a time on its own clock)."""
        with self.marks_lock:
            count, exits, depth, entered_at, marked = self.count, self.exits, self.depth, self.entered_at, self.marked
        if not marked:
            return (count, 0, False), {"collectives": count}
        inside = round(max(0.0, time.monotonic() - entered_at), 3) if depth else None
        return (count, exits, depth > 0), {"collectives": count, "exits": exits, "inside_seconds": inside}

    def post_if_changed(self) -> None:
        state, body = self.snapshot()
        if state == self.posted:
            return
        try:
            target = _launcher()
            if target is None:
                return
            _send(*target, body, "collective count")
            self.posted = state
        except Exception as exc:
            _failed(exc, "collective count")


_connection = _Connection()
_collectives = _CollectiveCounter()


def _after_fork_in_child() -> None:
    # The parent's socket and lock are not ours to use: start afresh (the socket copy is dropped, not shut down).
    # A forked child (a data-loader worker) is not the training loop: its collectives, if any, start from zero
    # on a thread of its own.
    global _connection, _collectives
    _connection = _Connection()
    _collectives = _CollectiveCounter()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{ADDR_ENV}={address!r} is not host:port")
    return host.strip("[]"), int(port)


def _launcher() -> tuple[str, int] | None:
    """The launcher's step endpoint, or None outside a launcher or while reports are suspended after a failure."""
    address = os.environ.get(ADDR_ENV)
    if not address:
        if not _state["told_absent"]:
            _state["told_absent"] = True
            log.debug("%s is not set (not run by devheal launch); step reports are dropped", ADDR_ENV)
        return None
    if time.monotonic() < float(_state["suspended_until"]):
        return None
    return _split_address(address)


def _send(host: str, port: int, body: dict[str, object], what: str) -> None:
    status = _connection.post(host, port, json.dumps(body).encode())
    if status >= 300:
        log.debug("launcher refused a %s: HTTP %s", what, status)


def _failed(exc: Exception, what: str) -> None:
    _state["suspended_until"] = time.monotonic() + BACKOFF_SECONDS
    log.debug("%s failed (%s: %s); skipping reports for %.0fs", what, type(exc).__name__, exc, BACKOFF_SECONDS)


def report_step(duration_seconds: float, step: int | None = None) -> None:
    """Report that one training step took ``duration_seconds`` (and, optionally, which step it was).

    Safe to call on every step: returns within about 0.25 s even when the launcher hangs,
    never raises, and does nothing outside a launcher.
    """
    try:
        target = _launcher()
        if target is None:
            return
        if isinstance(duration_seconds, bool) or not isinstance(duration_seconds, int | float):
            log.debug("step report dropped: duration %r is not a number", duration_seconds)
            return
        if not math.isfinite(duration_seconds) or duration_seconds < 0:
            log.debug("step report dropped: duration %r is not a finite number >= 0", duration_seconds)
            return
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            log.debug("step number %r is not an integer; reporting the duration alone", step)
            step = None
        _send(*target, {"duration_seconds": float(duration_seconds), "step": step}, "step report")
    except Exception as exc:
        _failed(exc, "step report")


def report_joined() -> None:
    """Report that this rank reached its gang's rendezvous: call it once per run, when the rank has connected to
    the rendezvous store (the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``), before ``init_process_group``.

    A rank whose peers reached the rendezvous while it never did (its network cut, its node's fabric down) is
    then named when its gang stalls at a restart (docs/stragglers.md). Never raises; does nothing outside a
    launcher.
    """
    _tell({"joined": True}, "rendezvous report")


def report_checkpoint() -> None:
    """Report that this rank has saved a checkpoint the gang can resume from: call it once the save is complete
    (on every rank, or at least once the gang's checkpoint is whole).

    A slow rank is then replaced right after the gang's next checkpoint instead of at once, so the restart rolls
    back no work (``stragglers.action: ReplaceAtCheckpoint``, docs/stragglers.md). Never raises; does nothing
    outside a launcher.
    """
    _tell({"checkpoint": True}, "checkpoint report")


def _tell(body: dict[str, object], what: str) -> None:
    """Post one event of the run (``body``) to the launcher, if there is one; never raises."""
    try:
        target = _launcher()
        if target is not None:
            _send(*target, body, what)
    except Exception as exc:
        _failed(exc, what)


def report_collective() -> None:
    """Count that this rank is entering a collective (an all-gather, an all-reduce): call it just before each.

    Costs an integer increment: a daemon thread posts the count to the launcher at most every
    ``COLLECTIVES_POST_SECONDS`` when it changed, also while this thread waits in the collective. When a gang
    stalls with every rank's last step alike, the rank that entered fewer collectives than its peers is the one
    they wait for (docs/stragglers.md). Never raises; does nothing outside a launcher.
    """
    _collectives.enter()


def enter_collective() -> None:
    """Mark that this rank enters a collective it will wait in for its peers; ``leave_collective`` marks its exit.

    Counts an entry as ``report_collective`` does, and from then on each post tells the launcher whether the rank is
    inside a collective now, and since when: at a stall, a rank inside one waits for a peer and is not the one the
    gang waits for (docs/stragglers.md). Calls nest (several collectives in flight at once: the rank is inside until
    the last has left). For a collective that completes on another thread (a DDP communication hook's future), call
    ``leave_collective`` there. Never raises; does nothing outside a launcher.
    """
    _collectives.enter_marked()


def leave_collective() -> None:
    """Mark that this rank left the collective ``enter_collective`` marked (it completed, or failed). Safe on any
    thread; one call without an open entry is ignored. Never raises."""
    _collectives.leave_marked()


@contextmanager
def collective() -> Iterator[None]:
    """``with collective(): dist.all_reduce(t)``: marks the entry and, however the block ends, the exit."""
    enter_collective()
    try:
        yield
    finally:
        leave_collective()
