"""MatchContext: what the data path knows about a frame when it asks which rules apply."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
FrameDirection = Literal["request", "response"]


def normalize_principal(principal: str) -> str:
    """Kafka's "Type:name" form: "alice" -> "User:alice"; "User:alice" stays."""
    return principal if ":" in principal else f"User:{principal}"


def parse_host(host: str) -> IPAddress | None:
    """The address of "10.0.0.1", "10.0.0.1:5555", "[::1]:5555" or "::ffff:10.0.0.1".

    An IPv4-mapped IPv6 address becomes the IPv4 address, so 10.0.0.0/8 matches a client
    seen by a dual-stack listener. None when `host` is not an address.
    """
    text = host.strip()
    address: IPAddress
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        if text.startswith("["):
            text = text[1:].partition("]")[0]
        elif text.count(":") == 1:
            text = text.partition(":")[0]
        else:
            return None
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True, kw_only=True)
class MatchContext:
    """The connection and frame a rule is matched against.

    Unknown facts are None; a rule that matches on one of them does not match (and
    its `not` does). `principal` is normalized to "Type:name" ("alice" becomes
    "User:alice"); `client_host` may carry a port, `client_ip` is its parsed address.
    Build one per connection and derive per-frame contexts with `for_frame`, which
    copies without parsing again.
    """

    api_key: int
    api_version: int
    direction: FrameDirection = "request"
    principal: str | None = None
    client_id: str | None = None
    client_host: str | None = None
    listener: str | None = None
    broker_id: int | None = None
    client_ip: IPAddress | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.principal is not None:
            object.__setattr__(self, "principal", normalize_principal(self.principal))
        if self.client_host is not None:
            object.__setattr__(self, "client_ip", parse_host(self.client_host))

    def for_frame(
        self, api_key: int, api_version: int, direction: FrameDirection = "request"
    ) -> MatchContext:
        """This connection's context for another frame (no re-parsing)."""
        clone = object.__new__(MatchContext)
        setter = object.__setattr__
        setter(clone, "api_key", api_key)
        setter(clone, "api_version", api_version)
        setter(clone, "direction", direction)
        setter(clone, "principal", self.principal)
        setter(clone, "client_id", self.client_id)
        setter(clone, "client_host", self.client_host)
        setter(clone, "listener", self.listener)
        setter(clone, "broker_id", self.broker_id)
        setter(clone, "client_ip", self.client_ip)
        return clone
