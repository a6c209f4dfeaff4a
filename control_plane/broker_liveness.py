"""Brokers that refuse connections: their listeners close until they answer again.

A broker that is down refuses a client's connection (nothing listens on its port), and
every Kafka client handles that as "not ready yet". A gateway listener in front of it
accepted the connection instead, and closed it once Envoy could not reach the broker:
the client saw its first request fail on a connection it thought established.
kafka-python's group consumer raised that (`KafkaConnectionError: socket disconnected`)
from `poll()` at every try while its only broker restarted, where directly it waited
quietly. Kafka's own fencing takes a dead broker out of Metadata only after its session
times out (9 s by default), and a lone broker never leaves it.

So the control plane asks each broker's port every `PROBE_INTERVAL_S`: after
`REFUSALS_TO_DOWN` refusals in a row the broker counts as down, and its listener is
withdrawn (clients are refused, as by the broker itself) while it is still advertised
at its port; the first accepted connection brings it back. Only a refusal counts: a
probe that times out, or a name that does not resolve (a DNS outage would take every
listener at once), says nothing sure about the broker, and a withdrawn listener drains
its live connections (Envoy closes them within its drain time, 30 s under keg up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 1.0
REFUSALS_TO_DOWN = 2


async def refuses(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether `host:port` refuses a TCP connection."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):  # socket.gaierror too: DNS says nothing of the broker
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class BrokerLiveness:
    """Which brokers count as down, from the probes' answers (no I/O)."""

    def __init__(self, refusals_to_down: int = REFUSALS_TO_DOWN) -> None:
        self._refusals_to_down = refusals_to_down
        self._refusals: dict[int, int] = {}
        self.down: frozenset[int] = frozenset()

    def observe(self, answers: dict[int, bool]) -> bool:
        """node id -> refused, for the brokers probed; True when the down set changed."""
        for node_id, refused in answers.items():
            self._refusals[node_id] = self._refusals.get(node_id, 0) + 1 if refused else 0
        down = frozenset(n for n, count in self._refusals.items()
                         if count >= self._refusals_to_down)
        changed, self.down = down != self.down, down
        return changed

    def keep_only(self, node_ids: Iterable[int]) -> bool:
        """Forget brokers no longer in the topology; True when the down set changed."""
        known = set(node_ids)
        self._refusals = {n: c for n, c in self._refusals.items() if n in known}
        return self.observe({})
