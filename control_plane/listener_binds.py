"""Listeners an Envoy could not bind (their port held by another process), tried again.

Envoy refuses a listener whose port it cannot bind (`cannot bind '127.0.0.1:19093':
Address already in use`): it NACKs the update, keeps the other listeners of it, and
never tries that one again by itself, because the control plane would send it the same
resources, and the same version, until something else changed. A broker that joined
after start with its port taken thus stayed without a listener for good, while Metadata
sent clients to that port, even once the port was free.

So each listener a node could not bind is sent again, after 1, 2, 4 ... up to
`MAX_RETRY_S` seconds, as a new version of that one listener: its metadata carries an
attempt number (`keg.bind_attempt`). Envoy takes it for a listener it does not have and
binds it; the listeners it has are unchanged, so none is drained. The attempt number
stays once the listener is bound: dropping it would change a bound listener, which Envoy
replaces (draining its connections).

Pure bookkeeping, no I/O: the control plane feeds NACKs and ACKs in, asks which
listeners to mark and when to publish again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.config.listener.v3 import listener_pb2
from google.protobuf.message import Message

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 10.0
METADATA_KEY = "keg"
ATTEMPT_FIELD = "bind_attempt"

# Envoy 1.40: "Error adding/updating listener(s) kafka_broker_2: cannot bind
# '127.0.0.1:19093': Address already in use" (one line per refused listener).
_CANNOT_BIND = re.compile(r"(?P<name>[\w.-]+): cannot bind '(?P<address>[^']+)': (?P<why>[^\n]+)")


def unbound_listeners(nack: str) -> dict[str, str]:
    """Listener name -> why, for each listener an LDS NACK says could not be bound."""
    return {m["name"]: f"cannot bind {m['address']}: {m['why'].strip()}"
            for m in _CANNOT_BIND.finditer(nack)}


@dataclass
class _Node:
    attempts: dict[str, int] = field(default_factory=dict)  # listener -> attempts so far
    unbound: dict[str, str] = field(default_factory=dict)  # listener -> why, until an ACK


class UnboundListeners:
    """Per node: which listeners it could not bind, and how often they were tried."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}

    def refused(self, node_id: str, nack: str) -> float | None:
        """An LDS NACK of `node_id`: the delay before its unbound listeners go again (None:
        the NACK is not about binding)."""
        unbound = unbound_listeners(nack)
        if not unbound:
            return None
        node = self._nodes.setdefault(node_id, _Node())
        node.unbound = unbound
        tries = max(node.attempts.get(name, 0) for name in unbound)
        return min(FIRST_RETRY_S * 2 ** tries, MAX_RETRY_S)

    def retry(self, node_id: str) -> bool:
        """Count one more attempt of each listener `node_id` could not bind; False when it
        has none (bound meanwhile, or forgotten)."""
        node = self._nodes.get(node_id)
        if node is None or not node.unbound:
            return False
        for name in node.unbound:
            node.attempts[name] = node.attempts.get(name, 0) + 1
        return True

    def accepted(self, node_id: str) -> None:
        """`node_id` ACKed its listeners: every one of them is bound."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.unbound = {}

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def problems(self) -> list[str]:
        """One sentence per listener a node could not bind (for readiness)."""
        return [f"Envoy node {node_id} has no listener {name} ({why}); trying again"
                for node_id, node in sorted(self._nodes.items())
                for name, why in sorted(node.unbound.items())]

    def marked(self, node_id: str,
               listeners: Mapping[str, Message]) -> dict[str, Message] | None:
        """`listeners` with the attempt number in each that was tried again (the others
        unchanged); None when none of them was."""
        node = self._nodes.get(node_id)
        if node is None or not any(name in listeners for name in node.attempts):
            return None
        out = dict(listeners)
        for name, attempt in node.attempts.items():
            listener = out.get(name)
            if not isinstance(listener, listener_pb2.Listener):
                continue
            copy = listener_pb2.Listener()
            copy.CopyFrom(listener)
            copy.metadata.filter_metadata[METADATA_KEY].fields[ATTEMPT_FIELD].number_value = attempt
            out[name] = copy
        return out
