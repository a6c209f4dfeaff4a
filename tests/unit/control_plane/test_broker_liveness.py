"""Which brokers count as down: only refusals in a row, and the first answer brings one back."""

from __future__ import annotations

import asyncio
import socket

from control_plane.broker_liveness import BrokerLiveness, refuses


def test_a_broker_is_down_after_refusals_in_a_row_and_back_at_its_first_answer() -> None:
    liveness = BrokerLiveness(refusals_to_down=2)
    assert not liveness.observe({1: True, 2: False})  # one refusal is not enough
    assert not liveness.observe({1: False, 2: True})  # an answer starts the count again
    assert liveness.observe({1: True, 2: True}) and liveness.down == {2}
    assert liveness.observe({1: True, 2: True}) and liveness.down == {1, 2}
    assert not liveness.observe({1: True})  # unchanged
    assert liveness.observe({2: False}) and liveness.down == {1}
    assert liveness.keep_only([2]) and liveness.down == frozenset()  # 1 left the cluster


def test_a_probe_tells_a_refusal_from_an_answer() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert asyncio.run(refuses("127.0.0.1", port)) is False
    assert asyncio.run(refuses("127.0.0.1", port)) is True  # nothing listens there now
    # A name that does not resolve says nothing sure: a DNS outage would withdraw every
    # listener (and drain its connections) at once.
    assert asyncio.run(refuses("no-such-host.invalid", port)) is False
