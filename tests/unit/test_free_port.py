"""free_port picks ports the kernel does not hand to outgoing connections."""

from __future__ import annotations

import socket

import pytest

from keylane.testing import processes
from keylane.testing.processes import FREE_PORTS, free_port


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_bound() -> None:
    ephemeral = processes._ephemeral_ports()
    for _ in range(50):
        port = free_port()
        assert FREE_PORTS[0] <= port < FREE_PORTS[1] and port not in ephemeral
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()


def test_a_taken_port_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    taken, other = free_port(), free_port()
    while other == taken:
        other = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        picks = iter([taken - FREE_PORTS[0], taken - FREE_PORTS[0], other - FREE_PORTS[0]])
        monkeypatch.setattr(processes.secrets, "randbelow", lambda _n: next(picks))

        assert free_port() == other


def test_with_no_port_outside_the_ephemeral_range_it_takes_the_kernels_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "_ephemeral_ports", lambda: range(1, 65536))

    port = free_port()

    assert port in processes._ephemeral_ports()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
