"""Network endpoints in Kafka answers: found from the schemas, rewritten or redacted.

A client that learns a broker's own address connects to it directly and leaves the
gateway. Every response struct with a `Host` string field carries an endpoint; which
ones, at which version, is compiled once per (api key, version) from the schema set,
so an API or version added to the schemas is covered without a list to keep.
What an endpoint means depends on the API (`endpoint_policy`):

- BROKER: a broker, named by its node id (Metadata, FindCoordinator, DescribeCluster,
  and the KIP-951 leader hints `NodeEndpoints` of Produce, Fetch, ShareFetch and
  ShareAcknowledge). It is rewritten to the gateway listener fronting that node.
- NOT_AN_ADDRESS: the schema's `Host` is something else: an ACL's client host
  pattern (DescribeAcls, DeleteAcls) or a Kafka Streams application's own endpoint
  (StreamsGroupHeartbeat, StreamsGroupDescribe). Left alone.
- CONTROLLER (every other API: DescribeQuorum listeners, the KRaft APIs' leader
  endpoints): controllers are not behind the gateway, so their endpoints are
  redacted (array entries removed, a single struct's host emptied and port zeroed).

Broker configurations also carry addresses, in their values (`listeners`,
`advertised.listeners`, `controller.quorum.voters`, ...): `rewrite_config_endpoints`
rewrites a broker's `advertised.listeners` to the gateway's and redacts every other
value that holds a host:port (null value, marked sensitive, as Kafka shows secrets).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from kafka_wire._schema import StructSpec, registry
from kafka_wire.enums import ApiKey
from kafka_wire.errors import UnknownApiError
from kafka_wire.framing import Inspector
from kafka_wire.skim import TagScanner, top_level_tag

# A node id -> the (host, port) clients must use for it instead.
Route = Callable[[int], tuple[str, int]]


class EndpointPolicy(enum.Enum):
    BROKER = "broker"
    CONTROLLER = "controller"
    NOT_AN_ADDRESS = "not-an-address"


BROKER_ENDPOINT_APIS: Final = frozenset({
    ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.PRODUCE,
    ApiKey.FETCH, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE,
})
NOT_ADDRESS_APIS: Final = frozenset({
    ApiKey.DESCRIBE_ACLS, ApiKey.DELETE_ACLS, ApiKey.STREAMS_GROUP_HEARTBEAT,
    ApiKey.STREAMS_GROUP_DESCRIBE,
})
_NODE_ID_FIELDS: Final = ("NodeId", "BrokerId", "LeaderId")


def endpoint_policy(api_key: int) -> EndpointPolicy:
    if api_key in BROKER_ENDPOINT_APIS:
        return EndpointPolicy.BROKER
    if api_key in NOT_ADDRESS_APIS:
        return EndpointPolicy.NOT_AN_ADDRESS
    return EndpointPolicy.CONTROLLER


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where the endpoints of one struct at one version are.

    `endpoint`: this struct has a Host; `node_id`: the field naming its node;
    `subs`: (field, plan, is an array) for nested structs holding endpoints below.
    """

    endpoint: bool
    node_id: str | None
    subs: tuple[tuple[str, _Plan, bool], ...]


def _compile(struct: StructSpec, version: int) -> _Plan | None:
    present = [f for f in struct.fields if f.present(version)]
    names = {f.name for f in present}
    endpoint = any(f.name == "Host" and f.type == "string" for f in present)
    subs = []
    for f in present:
        if f.struct is None:
            continue
        sub = _compile(f.struct, version)
        if sub is not None:
            subs.append((f.name, sub, f.is_array))
    if not endpoint and not subs:
        return None
    node_id = next((n for n in _NODE_ID_FIELDS if n in names), None)
    return _Plan(endpoint, node_id, tuple(subs))


@lru_cache(maxsize=1024)
def _response_plan(api_key: int, version: int) -> _Plan | None:
    try:
        spec = registry().file_for_key(api_key, "response", version).spec()
    except UnknownApiError:
        return None
    return _compile(spec.struct, version)


def carries_endpoints(api_key: int, version: int) -> bool:
    """Whether this response version can hold an endpoint that must be rewritten or
    redacted (its schema has a Host field, and it is an address), or broker configs."""
    if api_key == ApiKey.DESCRIBE_CONFIGS:
        return True
    if endpoint_policy(api_key) is EndpointPolicy.NOT_AN_ADDRESS:
        return False
    return _response_plan(api_key, version) is not None


NODE_ENDPOINTS: Final = "NodeEndpoints"
# What a NodeEndpoints tag becomes in a passing response: a one-byte tag no schema uses
# at that level, so the frame keeps its size and clients skip the field as unknown; its
# bytes (the addresses) are zeroed.
HIDDEN_TAG: Final = 0x7F


@lru_cache(maxsize=1024)
def streamed_endpoints_tag(api_key: int, version: int) -> int | None:
    """The tag of the response's NodeEndpoints when those are its only endpoints, a
    top-level tagged field after everything else (Produce v10+, Fetch v16+): such a
    response need not be held, its leader hints can be hidden as its bytes pass."""
    if endpoint_policy(api_key) is not EndpointPolicy.BROKER:
        return None
    plan = _response_plan(api_key, version)
    if plan is None or plan.endpoint or [s[0] for s in plan.subs] != [NODE_ENDPOINTS]:
        return None
    return top_level_tag(api_key, version, NODE_ENDPOINTS)


def hide_streamed_endpoints(api_key: int, version: int) -> Inspector:
    """An inspector for a passing response (FrameSplitter.inspect_current) that turns its
    NodeEndpoints (KIP-951 leader hints, broker addresses) into an unknown tag: clients
    skip it and learn the new leader from Metadata, through the gateway."""
    tag = streamed_endpoints_tag(api_key, version)
    assert tag is not None
    scanner = TagScanner(api_key, version, frozenset({tag}))
    zeroed: list[tuple[int, int]] = []  # frame byte ranges still to zero: [start, end)

    def inspect(chunk: memoryview, base: int) -> list[tuple[int, int]]:
        seen = len(scanner.found)
        scanner.feed(chunk, base)
        changes = []
        for at, _tag, data, size in scanner.found[seen:]:
            changes.append((at, HIDDEN_TAG))
            zeroed.append((data, data + size))
        end = base + len(chunk)
        for start, stop in zeroed:  # the field's data may reach into later chunks
            changes += [(offset, 0) for offset in range(max(start, base), min(stop, end))]
        zeroed[:] = [(start, stop) for start, stop in zeroed if stop > end]
        return changes

    return inspect


def rewrite_endpoints(api_key: int, version: int, body: dict[str, Any], route: Route) -> bool:
    """Rewrite (brokers) or redact (controllers) every endpoint of a decoded response
    in place; True when something changed."""
    if api_key == ApiKey.DESCRIBE_CONFIGS:
        return rewrite_config_endpoints(body, route)
    policy = endpoint_policy(api_key)
    plan = _response_plan(api_key, version)
    if plan is None or policy is EndpointPolicy.NOT_AN_ADDRESS:
        return False
    visit: _Visit = ((lambda entry, node_id: _route(entry, node_id, route))
                     if policy is EndpointPolicy.BROKER else _redact)
    changed = _walk(plan, body, visit)
    if plan.endpoint:  # the message itself is one (FindCoordinator v0-3)
        changed |= visit(body, plan.node_id)[0]
    return changed


# An endpoint struct -> (changed, keep the entry).
_Visit = Callable[[dict[str, Any], str | None], tuple[bool, bool]]


def _walk(plan: _Plan, value: dict[str, Any], visit: _Visit) -> bool:
    """Visit the endpoint structs below `value` (not `value` itself)."""
    changed = False
    for field, sub, is_array in plan.subs:
        current = value.get(field)
        if current is None:
            continue
        if not is_array:
            changed |= _walk(sub, current, visit)
            if sub.endpoint:
                changed |= visit(current, sub.node_id)[0]
            continue
        kept = []
        for item in current:
            changed |= _walk(sub, item, visit)
            if sub.endpoint:
                item_changed, keep = visit(item, sub.node_id)
                changed |= item_changed
                if not keep:
                    continue
            kept.append(item)
        if len(kept) != len(current):
            value[field] = kept
            changed = True
    return changed


def _route(entry: dict[str, Any], node_id_field: str | None, route: Route) -> tuple[bool, bool]:
    node = entry.get(node_id_field) if node_id_field else None
    if not isinstance(node, int) or node < 0:
        return False, True  # an error answer: no node, no address to give away
    host, port = route(node)
    if entry.get("Host") == host and entry.get("Port") == port:
        return False, True
    entry["Host"], entry["Port"] = host, port
    return True, True


def _redact(entry: dict[str, Any], node_id_field: str | None) -> tuple[bool, bool]:
    changed = bool(entry.get("Host")) or bool(entry.get("Port"))
    entry["Host"], entry["Port"] = "", 0
    return changed, False  # array entries are removed; a single struct stays, emptied


# -- broker configurations ----------------------------------------------------------------

BROKER_RESOURCE: Final = 4  # ConfigResource.Type.BROKER
ADVERTISED_LISTENERS: Final = "advertised.listeners"
DEFAULT_CONFIG: Final = 5  # ConfigSource.DEFAULT_CONFIG
# A host:port, with an optional listener name (`NAME://host:port`) and IPv6 brackets.
_ENDPOINT = re.compile(r"(?:([A-Za-z0-9_]+)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(\d{1,5})\b")


def rewrite_config_endpoints(body: dict[str, Any], route: Route) -> bool:
    """DescribeConfigs: a broker's advertised.listeners become the gateway's listener
    for it; any other config value holding an endpoint is redacted."""
    changed = False
    for resource in body.get("Results") or ():
        broker: int | None = None
        if resource.get("ResourceType") == BROKER_RESOURCE:
            name = resource.get("ResourceName") or ""
            broker = int(name) if name.isdigit() else None
        for config in resource.get("Configs") or ():
            changed |= _rewrite_config(config, broker, route)
            for synonym in config.get("Synonyms") or ():
                changed |= _rewrite_config(synonym, broker, route, name=config.get("Name"))
    return changed


def _rewrite_config(config: dict[str, Any], broker: int | None, route: Route,
                    name: str | None = None) -> bool:
    value = config.get("Value")
    if not isinstance(value, str) or not _ENDPOINT.search(value):
        return False
    if DEFAULT_CONFIG in (config.get("ConfigSource"), config.get("Source")):
        return False  # Kafka's built-in default (`PLAINTEXT://:9092`): no address to hide
    if (name or config.get("Name")) == ADVERTISED_LISTENERS and broker is not None:
        host, port = route(broker)
        new = _ENDPOINT.sub(lambda m: f"{m.group(1)}://{host}:{port}" if m.group(1)
                            else f"{host}:{port}", value)
        if new != value:
            config["Value"] = new
            return True
        return False
    config["Value"] = None
    if "IsSensitive" in config:
        config["IsSensitive"] = True
    return True


__all__ = [
    "EndpointPolicy",
    "Route",
    "carries_endpoints",
    "endpoint_policy",
    "hide_streamed_endpoints",
    "rewrite_config_endpoints",
    "rewrite_endpoints",
    "streamed_endpoints_tag",
]
