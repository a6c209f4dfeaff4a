"""Ports the gateway picks for its listeners, ext_proc workers and metrics."""

from __future__ import annotations

import random
import socket

import pytest

from control_plane.service import EPHEMERAL_RANGE, LOWEST_PICKED_PORT, free_port, free_port_block


def test_picked_ports_are_bindable_distinct_and_below_the_ephemeral_range() -> None:
    """A port from the kernel's ephemeral range can be given to an outgoing connection
    before the listener binds it (seen as Envoy NACKing a listener: address in use)."""
    ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PICKED_PORT <= port < ephemeral_low for port in ports)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports[-1]))  # free indeed


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        real = random.randrange
        offered = iter([busy, busy])  # the busy port first, twice; then any
        monkeypatch.setattr("control_plane.service.random.randrange",
                            lambda low, high: next(offered, None) or real(low, high))
        assert free_port() != busy


def test_a_block_never_overlaps_a_port_picked_before() -> None:
    """The fleet test picked its groups' listener blocks apart from free_port: a block
    once held the xDS port picked a moment earlier, and Envoys' ADS streams went to a
    Kafka listener. Blocks and single ports now come from one ledger."""
    singles = {free_port() for _ in range(200)}
    blocks = [free_port_block(4) for _ in range(100)]
    block_ports = [base + i for base in blocks for i in range(4)]
    assert len(set(block_ports)) == len(block_ports)
    assert not singles & set(block_ports)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", blocks[-1] + 3))  # free indeed
