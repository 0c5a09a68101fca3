"""A simulated node's network cut: what its user sends on loopback is dropped, everyone else's passes, and it heals."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devheal.lab import network_cut

UID = 20999
CONNECT = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(1.0)\n"
    "if len(sys.argv) > 2: s.bind((sys.argv[2], 0))\n"
    "try:\n    s.connect(('127.0.0.1', int(sys.argv[1]))); print('connected')\n"
    "except OSError as e:\n    print('refused' if isinstance(e, ConnectionRefusedError) else 'dropped')\n"
)


def connect_as(uid: int | None, port: int, source: str | None = None) -> str:
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
    bind = [source] if source is not None else []
    done = subprocess.run([*prefix, sys.executable, "-c", CONNECT, str(port), *bind], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def test_a_cut_drops_what_the_nodes_user_sends_and_nothing_else(listener: int) -> None:
    try:
        assert connect_as(UID, listener) == "connected"
        network_cut.cut(UID)
        assert connect_as(UID, listener) == "dropped"
        assert connect_as(None, listener) == "connected", "the launcher's own traffic (root) passes"
        address = network_cut.node_address(UID)
        assert connect_as(None, listener, address) == "dropped", "but not its store probes, sent from the node"
        assert connect_as(None, listener, network_cut.node_address(UID + 1)) == "connected", "another node's pass"
        network_cut.restore(UID)
        assert connect_as(UID, listener) == "connected"
        network_cut.cut(UID, allow_ports=(listener,))  # its launcher's step endpoint stays reachable
        assert connect_as(UID, listener) == "connected"
        network_cut.restore(UID)
        rules = subprocess.run(["iptables", "-w", "-S", "OUTPUT"], capture_output=True, text=True).stdout
        assert network_cut.COMMENT not in rules, "the allowance goes with the cut"
        network_cut.cut(UID)
        network_cut.cut(UID + 1)
        network_cut.restore_all()
        assert connect_as(UID, listener) == "connected"
        rules = subprocess.run(["iptables", "-w", "-S", "OUTPUT"], capture_output=True, text=True).stdout
        assert network_cut.COMMENT not in rules
    finally:
        network_cut.restore_all()
