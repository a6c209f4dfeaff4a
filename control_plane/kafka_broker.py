"""Envoy's contrib `kafka_broker` network filter, for nodes whose Envoy build has it.

Neither xds-protos nor envoy-data-plane ships the contrib v3 message, so it is
defined here from its proto (envoy/extensions/filters/network/kafka_broker/v3):

    message KafkaBroker {
      string stat_prefix = 1;
      bool force_response_rewrite = 2;
      oneof broker_address_rewrite_spec {
        IdBasedBrokerRewriteSpec id_based_broker_address_rewrite_spec = 3; }
      repeated uint32 api_keys_allowed = 4;
      repeated uint32 api_keys_denied = 5;
    }
    message IdBasedBrokerRewriteSpec { repeated IdBasedBrokerRewriteRule rules = 1; }
    message IdBasedBrokerRewriteRule { uint32 id = 1; string host = 2; uint32 port = 3; }

With it in the chain, Envoy itself rewrites broker addresses and refuses API keys
(a rule set's global `allow_apis`/`deny_apis`) before the ext_proc service is asked;
the ext_proc service does the same for nodes without it, so behaviour is the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

FILTER_NAME = "envoy.filters.network.kafka_broker"
PACKAGE = "envoy.extensions.filters.network.kafka_broker.v3"

_F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: int, repeated: bool = False,
           type_name: str | None = None) -> descriptor_pb2.FieldDescriptorProto:
    field = _F(name=name, number=number, type=kind,
               label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = f".{PACKAGE}.{type_name}"
    return field


@cache
def _classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(
        name="keg/contrib/kafka_broker.proto", package=PACKAGE, syntax="proto3")
    file.message_type.add(name="IdBasedBrokerRewriteRule", field=[
        _field("id", 1, _F.TYPE_UINT32), _field("host", 2, _F.TYPE_STRING),
        _field("port", 3, _F.TYPE_UINT32)])
    file.message_type.add(name="IdBasedBrokerRewriteSpec", field=[
        _field("rules", 1, _F.TYPE_MESSAGE, True, "IdBasedBrokerRewriteRule")])
    broker = file.message_type.add(name="KafkaBroker", field=[
        _field("stat_prefix", 1, _F.TYPE_STRING),
        _field("force_response_rewrite", 2, _F.TYPE_BOOL),
        _field("id_based_broker_address_rewrite_spec", 3, _F.TYPE_MESSAGE, False,
               "IdBasedBrokerRewriteSpec"),
        _field("api_keys_allowed", 4, _F.TYPE_UINT32, True),
        _field("api_keys_denied", 5, _F.TYPE_UINT32, True)])
    broker.oneof_decl.add(name="broker_address_rewrite_spec")
    broker.field[2].oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in ("KafkaBroker", "IdBasedBrokerRewriteSpec", "IdBasedBrokerRewriteRule")}


def kafka_broker_config(stat_prefix: str, routes: Mapping[int, tuple[str, int]],
                        allowed: Iterable[int] = (), denied: Iterable[int] = ()) -> Any:
    """A KafkaBroker message: address rewrite per broker id, API key allow/deny lists."""
    classes = _classes()
    rules = [classes["IdBasedBrokerRewriteRule"](id=node, host=host, port=port)
             for node, (host, port) in sorted(routes.items())]
    return classes["KafkaBroker"](
        stat_prefix=stat_prefix,
        id_based_broker_address_rewrite_spec=classes["IdBasedBrokerRewriteSpec"](rules=rules),
        api_keys_allowed=sorted(allowed), api_keys_denied=sorted(denied),
    )


def global_api_lists(rules: Iterable[Any]) -> tuple[frozenset[int], frozenset[int]]:
    """API keys Envoy can allow/deny for everyone: from enforced `allow_apis`/`deny_apis`
    rules that match nothing but APIs (any other condition needs the ext_proc service).
    `rules` are filter_rules CompiledRules; returns (allowed, denied), empty = no list."""
    allowed: frozenset[int] | None = None
    denied: set[int] = set()
    for rule in rules:
        if rule.dry_run or rule.kind not in ("allow_apis", "deny_apis"):
            continue
        match = rule.rule.match
        if any(getattr(match, f) is not None for f in
               ("versions", "topics", "groups", "client_ids", "principals",
                "client_addresses", "listeners", "brokers", "not_")):
            continue
        if rule.kind == "deny_apis":
            denied |= set(rule.api_keys or ())
        elif match.apis is None:  # allow list for every API
            keys = frozenset(rule.excluded_api_keys)
            allowed = keys if allowed is None else allowed & keys
    return allowed or frozenset(), frozenset(denied)
