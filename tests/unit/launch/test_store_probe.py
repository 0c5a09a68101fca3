"""The launcher's probe of its gang's rendezvous store, against real sockets on loopback."""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devheal.launch import launcher as launcher_module
from devheal.launch.launcher import Launcher, LaunchOptions
from devheal.launch.store_probe import Probe, outcome_of, parse_address, probe, store_to_probe
from devheal.model.steps import parse_step_report
from tests.shell.waiting import until
from tests.unit.launch.test_launcher import FakeGang, stop


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A port whose listener never accepts and whose queue is full: a new connection's SYN gets no answer, as a
    store behind a cut network gives none."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    waiting = []
    for _ in range(4):  # fill the accept queue (its length is the backlog + 1)
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        waiting.append(s)
    yield port
    for s in waiting:
        s.close()
    listener.close()


async def test_a_listening_store_and_a_refusing_host_are_reached() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    assert await probe("127.0.0.1", port, 2.0) is Probe.REACHED
    server.close()
    await server.wait_closed()
    assert await probe("127.0.0.1", port, 2.0) is Probe.REACHED, "refused: the host answered"


async def test_a_store_that_never_answers_is_unreachable(full_backlog: int) -> None:
    assert await probe("127.0.0.1", full_backlog, 0.5) is Probe.UNREACHABLE


def test_what_each_error_says_about_the_network() -> None:
    assert outcome_of(None) is Probe.REACHED
    assert outcome_of(ConnectionRefusedError()) is Probe.REACHED
    assert outcome_of(TimeoutError()) is Probe.UNREACHABLE
    assert outcome_of(OSError(errno.ENETUNREACH, "Network is unreachable")) is Probe.UNREACHABLE
    assert outcome_of(OSError(errno.EHOSTUNREACH, "No route to host")) is Probe.UNREACHABLE
    assert outcome_of(socket.gaierror(socket.EAI_AGAIN, "Temporary failure")) is Probe.UNREACHABLE
    assert outcome_of(socket.gaierror(socket.EAI_NONAME, "Name or service not known")) is Probe.UNKNOWN
    assert outcome_of(OSError(errno.EMFILE, "Too many open files")) is Probe.UNKNOWN


def test_the_store_comes_from_the_option_or_the_rendezvous_environment() -> None:
    env = {"MASTER_ADDR": "llm-0.llm", "MASTER_PORT": "29500"}
    assert store_to_probe("", env) == ("llm-0.llm", 29500)
    assert store_to_probe("", {"MASTER_ADDR": "llm-0.llm"}) is None
    assert store_to_probe("off", env) is None
    assert store_to_probe("10.0.0.7:1234", env) == ("10.0.0.7", 1234)
    assert parse_address("[fd00::7]:29500", "x") == ("fd00::7", 29500)
    for bad in ("llm-0", ":29500", "llm-0:http", "llm-0:0", "llm-0:70000"):
        with pytest.raises(ValueError, match="--probe-store: expected HOST:PORT"):
            store_to_probe(bad, env)
    with pytest.raises(ValueError, match=r"\$MASTER_ADDR:\$MASTER_PORT: expected HOST:PORT"):
        store_to_probe("", {"MASTER_ADDR": "llm-0", "MASTER_PORT": "x"})


async def test_the_step_report_says_since_when_the_store_is_unreachable_and_forgets_it_once_reached(
    tmp_path: Path, full_backlog: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher probes the store, the one its listener never answers; the report carries since when, across a
    restart too; a probe that reaches it (the listener's queue drained) clears it."""
    gang = FakeGang()
    command = (sys.executable, "-c", "import time; time.sleep(60)")
    opts = LaunchOptions(
        command=command,
        grace=0.5,
        steps_publish_interval=0.2,
        termination_log=tmp_path / "termination-log",
        store=("127.0.0.1", full_backlog),
        store_probe_interval=0.5,
    )
    launcher = Launcher(opts, gang)
    run = asyncio.ensure_future(launcher.run())

    def unreachable() -> float | None:
        reports = [parse_step_report(p)[0] for p in gang.published]
        return reports[-1].unreachable if reports and reports[-1] is not None else None

    await until(lambda: unreachable() is not None, "the store reported unreachable", timeout=10)
    since = unreachable()
    launcher.stats.new_run(launcher.clock())  # a restart keeps it: it is the network's
    await asyncio.sleep(0.6)
    assert unreachable() == since
    monkeypatch.setattr(launcher_module, "probe", _reaching)
    await until(lambda: unreachable() is None, "the store reached again", timeout=10)
    await stop(launcher, run)


async def _reaching(host: str, port: int, timeout: float, bind: str | None = None) -> Probe:
    return Probe.REACHED
