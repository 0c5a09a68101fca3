"""The launcher's probe of its gang's rendezvous store: can this rank still reach its peers?

A rank behind a cut network waits in a collective like every peer it holds up, so its step
times name nobody (``devheal.engine.stragglers``). Its launcher runs beside it, in the same
pod and network namespace, and is not stuck: every few seconds it opens a TCP connection to
the store the rank's rendezvous uses (``MASTER_ADDR:MASTER_PORT``, PyTorch's ``env://``) and
closes it at once. A probe that times out or finds no route says the store is unreachable
from here; a refused connection says the host answered (its store not up yet, between
runs): reached. The step report carries since when the probes fail
(``StepReport.unreachable``), and the engine names the rank once that has lasted
``stall.unreachableAfter`` while its gang stopped stepping.

What the probe sees is the pod's network to the store, the path the rank's rendezvous takes;
a fault of a separate data fabric that the store's traffic does not use (NCCL over InfiniBand
beside a pod network) is not seen by it, nor by the rendezvous.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Mapping
from enum import StrEnum

DEFAULT_PROBE_INTERVAL = 5.0
"""Seconds between probes; each waits this long for its connection at most."""
UNREACHABLE_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN})


class Probe(StrEnum):
    REACHED = "reached"
    """Connected, or the host answered (refused, reset)."""
    UNREACHABLE = "unreachable"
    """No answer within the timeout, or no route to the store's host."""
    UNKNOWN = "unknown"
    """Something else failed (the name does not resolve, a local error): says nothing about the network."""


def outcome_of(error: BaseException | None) -> Probe:
    """What a connection attempt that ended with ``error`` (None: it connected) says about the store."""
    if error is None or isinstance(error, ConnectionRefusedError | ConnectionResetError):
        return Probe.REACHED
    if isinstance(error, TimeoutError):
        return Probe.UNREACHABLE
    if isinstance(error, socket.gaierror):
        # The name server did not answer: it is reached over the same network. A name that does not exist is no
        # network's fault (the store's pod not created yet).
        return Probe.UNREACHABLE if error.errno == socket.EAI_AGAIN else Probe.UNKNOWN
    if isinstance(error, OSError) and error.errno in UNREACHABLE_ERRNOS:
        return Probe.UNREACHABLE
    return Probe.UNKNOWN


def parse_address(text: str, where: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); raises ValueError naming ``where``."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where}: expected HOST:PORT with a port within 1..65535, got {text!r}")
    return host, int(port)


def store_to_probe(option: str, env: Mapping[str, str]) -> tuple[str, int] | None:
    """The store ``--probe-store`` names: ``HOST:PORT``, ``off`` (None), or empty for ``MASTER_ADDR:MASTER_PORT``
    when both are set (None when not)."""
    if option == "off":
        return None
    if option:
        return parse_address(option, "--probe-store")
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not host or not port:
        return None
    return parse_address(f"{host}:{port}", "$MASTER_ADDR:$MASTER_PORT")


async def probe(host: str, port: int, timeout: float, bind: str | None = None) -> Probe:
    """One probe: connect to ``host:port`` within ``timeout`` (from ``bind``, a local address, when given), close."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=(bind, 0) if bind else None), timeout
        )
    except (OSError, TimeoutError) as exc:
        return outcome_of(exc)
    writer.close()
    with contextlib.suppress(OSError):  # closed anyway: the connection was made
        await writer.wait_closed()
    return Probe.REACHED
