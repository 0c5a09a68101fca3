"""The lab's listening ports come from below the kernel's ephemeral range, so nothing that binds port 0 or connects
out can take one between its choice and the component's own bind."""

from __future__ import annotations

import socket

import pytest

from devheal.lab import cluster
from devheal.lab.cluster import free_port


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low = cluster._ephemeral_low()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports), "two components started together would share a port"
    assert all(max(1024, low - cluster.LAB_PORTS) <= p < low for p in ports), (low, min(ports), max(ports))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # free when handed out


def test_a_port_taken_by_a_listener_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        choices = iter([taken, taken + 1 if taken + 1 < 65536 else taken - 1])
        monkeypatch.setattr(cluster.random, "randrange", lambda *_: next(choices))
        monkeypatch.setattr(cluster, "_handed_out", type(cluster._handed_out)(maxlen=10))
        assert free_port() != taken
