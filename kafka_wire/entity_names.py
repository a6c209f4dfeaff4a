"""Rename the entities a Kafka message names: topics, groups, transactional ids.

Kafka's message schemas tag the fields that name an entity (`"entityType": "topicName"`,
`"groupId"`, `"transactionalId"`). `rename_entities` walks a decoded body and applies
a function to every such field, at any depth (arrays, nested structs, `[]string`), with
a walk compiled once per (api key, version, kind) from the schema file itself.

The function returns the new name, or None for a name outside the caller's namespace:
the array entry holding it is removed (the whole entry: a Metadata topic, a ListGroups
group), an element of a `[]string` is dropped, a nullable struct holding it becomes
null; elsewhere the name is left as it is. Requests never get None (every name the
client gives is renamed); responses use it to hide what is not the client's.

The schemas do not tag every name; these are handled here too:

- config resources (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs,
  ListConfigResources): the ResourceName of a TOPIC or GROUP resource;
- the consumer protocol's subscribed Topics and ShareGroupHeartbeat's
  SubscribedTopicNames (plain `[]string`s without a tag);
- ACL resources and filters (CreateAcls, DescribeAcls, DeleteAcls): the name of a
  TOPIC, GROUP or TRANSACTIONAL_ID resource. The LITERAL wildcard `*` becomes the
  PREFIXED pattern `rename("")` (the whole namespace) and back. A DeleteAcls filter
  that could reach outside the namespace (any resource type, or every name) is
  refused with `EntityNameError`;
- FindCoordinator keys (Key, CoordinatorKeys, response Coordinators[].Key) by KeyType;
- DescribeGroups member metadata and assignments of "consumer" groups: the topic
  names inside the ConsumerProtocol bytes (`rename_group_payload`, KIP-559).

Topic ids are never renamed (a tenant's id is its broker topic's id); `named_entities`
reports them with the names, for callers that map ids to names. Regular expressions
(ConsumerGroupHeartbeat SubscribedTopicRegex, ListTransactions TransactionalIdPattern)
are not names: the caller decides what to do with them.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal

from kafka_wire._schema import in_versions, parse_versions, registry, strip_comments
from kafka_wire.enums import ApiKey
from kafka_wire.errors import KafkaWireError, UnknownApiError
from kafka_wire.group_protocol import CONSUMER, Kind, decode_assignment, decode_subscription
from kafka_wire.group_protocol import encode_payload as _encode_payload

TOPIC: Final = "topicName"
GROUP: Final = "groupId"
TRANSACTIONAL_ID: Final = "transactionalId"
ENTITY_TYPES: Final = (TOPIC, GROUP, TRANSACTIONAL_ID)

Entity = Literal["topicName", "groupId", "transactionalId"]
MessageKind = Literal["request", "response"]
# A new name, or None: the name is outside the namespace (its entry is removed).
Rename = Callable[[str], str | None]
Renames = Mapping[str, Rename]  # entity type -> its function; absent types are kept

# Kafka's ConfigResource.Type and the ACL ResourceType / PatternType codes.
CONFIG_TOPIC, CONFIG_GROUP = 2, 32
ACL_ANY, ACL_TOPIC, ACL_GROUP, ACL_TRANSACTIONAL_ID = 1, 2, 3, 5
PATTERN_ANY, PATTERN_MATCH, PATTERN_LITERAL, PATTERN_PREFIXED = 1, 2, 3, 4
WILDCARD: Final = "*"
# FindCoordinator KeyType: 0 group, 1 transaction, 2 share group (KIP-932).
_COORDINATOR_ENTITY: Final = {0: GROUP, 1: TRANSACTIONAL_ID, 2: GROUP}
_CONFIG_ENTITY: Final = {CONFIG_TOPIC: TOPIC, CONFIG_GROUP: GROUP}
_ACL_ENTITY: Final = {ACL_TOPIC: TOPIC, ACL_GROUP: GROUP, ACL_TRANSACTIONAL_ID: TRANSACTIONAL_ID}


class EntityNameError(KafkaWireError):
    """A request whose names cannot be confined to the namespace: refuse it."""


# -- the compiled walk -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where the entity fields of one struct at one version are.

    `names`: (field, entity type, is a []string); `ids`: (field, is an array) of the
    topic-id (uuid `TopicId`) fields; `structs`: (field, plan, is an array, nullable)
    for nested structs that hold entity or topic-id fields somewhere below.
    """

    names: tuple[tuple[str, str, bool], ...]
    structs: tuple[tuple[str, _Plan, bool, bool], ...]
    ids: tuple[tuple[str, bool], ...] = ()

    @property
    def entities(self) -> frozenset[str]:
        found = {entity for _, entity, _ in self.names}
        for _, sub, _, _ in self.structs:
            found |= sub.entities
        return frozenset(found)


_EMPTY = _Plan((), ())
# Kafka's schemas tag topic names but not topic ids; every topic id field has this name.
_TOPIC_ID_FIELD: Final = "TopicId"


# Names Kafka's schemas leave untagged: (schema, top-level field) -> entity type.
_UNTAGGED: Final = {
    ("ConsumerProtocolSubscription", "Topics"): TOPIC,
    ("ShareGroupHeartbeatRequest", "SubscribedTopicNames"): TOPIC,
}


def _compile(fields: list[dict[str, Any]], common: Mapping[str, list[dict[str, Any]]],
             version: int, schema: str = "") -> _Plan:
    names: list[tuple[str, str, bool]] = []
    structs: list[tuple[str, _Plan, bool, bool]] = []
    ids: list[tuple[str, bool]] = []
    for f in fields:
        if not in_versions(version, parse_versions(f.get("versions"))):
            continue
        ftype: str = f["type"]
        is_array = ftype.startswith("[]")
        elem = ftype[2:] if is_array else ftype
        entity = f.get("entityType") or _UNTAGGED.get((schema, f["name"]))
        if entity in ENTITY_TYPES and elem == "string":
            names.append((f["name"], entity, is_array))
            continue
        if elem == "uuid" and f["name"] == _TOPIC_ID_FIELD:
            ids.append((f["name"], is_array))
            continue
        inner = f.get("fields") if "fields" in f else common.get(elem)
        if inner is None:
            continue
        sub = _compile(inner, common, version)
        if sub.names or sub.structs or sub.ids:
            nullable = in_versions(version, parse_versions(f.get("nullableVersions")))
            structs.append((f["name"], sub, is_array, nullable))
    return _Plan(tuple(names), tuple(structs), tuple(ids))


def _document(resource: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(strip_comments(resource.read_text("utf-8")))
    return doc


@lru_cache(maxsize=2048)
def _message_plan(api_key: int, version: int, kind: str) -> _Plan:
    try:
        schema = registry().file_for_key(api_key, kind, version)
    except UnknownApiError:
        return _EMPTY
    doc = _document(schema.resource)
    common = {c["name"]: c["fields"] for c in doc.get("commonStructs", [])}
    return _compile(doc["fields"], common, version, doc["name"])


@lru_cache(maxsize=64)
def _struct_plan(name: str, version: int) -> _Plan:
    doc = _document(registry().file_for(name, version).resource)
    common = {c["name"]: c["fields"] for c in doc.get("commonStructs", [])}
    return _compile(doc["fields"], common, version, doc["name"])


def _walk(plan: _Plan, value: dict[str, Any], renames: Renames) -> tuple[bool, bool]:
    """Rename in place; returns (changed, keep): keep is False when one of the
    struct's own names is outside the namespace."""
    changed, keep = False, True
    if not plan.names and not plan.structs:
        return changed, keep
    for field, entity, is_array in plan.names:
        fn = renames.get(entity)
        current = value.get(field)
        if fn is None or current is None:
            continue
        if is_array:
            renamed = [n for n in map(fn, current) if n is not None]
            if renamed != current:
                value[field] = renamed
                changed = True
            continue
        new = fn(current)
        if new is None:
            keep = False
        elif new != current:
            value[field] = new
            changed = True
    for field, sub, is_array, nullable in plan.structs:
        current = value.get(field)
        if current is None:
            continue
        if is_array:
            kept = []
            for item in current:
                item_changed, item_keep = _walk(sub, item, renames)
                changed |= item_changed
                if item_keep:
                    kept.append(item)
            if len(kept) != len(current):
                value[field] = kept
                changed = True
        else:
            sub_changed, sub_keep = _walk(sub, current, renames)
            changed |= sub_changed
            if not sub_keep and nullable:
                value[field] = None
                changed = True
    return changed, keep


# -- public entry points -------------------------------------------------------------------


def entity_types(api_key: int, version: int, kind: MessageKind) -> frozenset[str]:
    """The entity types a message may name (schema-tagged or special-cased)."""
    found = _message_plan(api_key, version, kind).entities
    return found | _SPECIAL_ENTITIES.get(api_key, frozenset())


def names_topic_ids(api_key: int, version: int, kind: MessageKind) -> bool:
    """Whether a message version names topics by id anywhere."""
    def has_ids(plan: _Plan) -> bool:
        return bool(plan.ids) or any(has_ids(sub) for _, sub, _, _ in plan.structs)

    return has_ids(_message_plan(api_key, version, kind))


def names_entities(api_key: int, version: int) -> bool:
    """Whether the request or the response of this API version names any entity."""
    return bool(entity_types(api_key, version, "request")
                or entity_types(api_key, version, "response"))


def rename_entities(api_key: int, version: int, kind: MessageKind, body: dict[str, Any],
                    renames: Renames) -> bool:
    """Apply `renames` to every entity name of a decoded body, in place; True if changed.

    Raises EntityNameError for a request that cannot be confined (see the module doc).
    """
    changed, _ = _walk(_message_plan(api_key, version, kind), body, renames)
    special = _SPECIAL.get(api_key)
    if special is not None:
        changed |= special(version, kind, body, renames)
    return changed


@dataclass(slots=True)
class Named:
    """The entities one message names, in the order they appear (repeats kept)."""

    topics: list[str] = dataclasses.field(default_factory=list)
    topic_ids: list[uuid.UUID] = dataclasses.field(default_factory=list)
    groups: list[str] = dataclasses.field(default_factory=list)
    transactional_ids: list[str] = dataclasses.field(default_factory=list)

    def add(self, entity: str, name: Any) -> None:
        if isinstance(name, str):
            self._of(entity).append(name)

    def _of(self, entity: str) -> list[str]:
        if entity == TOPIC:
            return self.topics
        return self.groups if entity == GROUP else self.transactional_ids


def named_entities(api_key: int, version: int, kind: MessageKind,
                   body: dict[str, Any]) -> Named:
    """Every topic (name or id), group and transactional id a decoded body names,
    without changing it: the schema-tagged fields, topic-id fields, and the names
    the schemas leave untagged (config and ACL resources, FindCoordinator keys)."""
    found = Named()
    _collect(_message_plan(api_key, version, kind), body, found)
    collect = _COLLECT_SPECIAL.get(api_key)
    if collect is not None:
        collect(kind, body, found)
    return found


def topic_id_pairs(api_key: int, version: int, kind: MessageKind,
                   body: dict[str, Any]) -> list[tuple[str, uuid.UUID]]:
    """(name, id) for every struct of a decoded body that names a topic both ways
    (Metadata, CreateTopics, DescribeTopicPartitions, DeleteTopics answers)."""
    pairs: list[tuple[str, uuid.UUID]] = []
    _pair(_message_plan(api_key, version, kind), body, pairs)
    return pairs


def _items(value: dict[str, Any], field_name: str, is_array: bool) -> Sequence[Any]:
    """A field's values: an array's items, a single value, none when null or absent."""
    current = value.get(field_name)
    if current is None:
        return ()
    return current if is_array else (current,)


def _pair(plan: _Plan, value: dict[str, Any], pairs: list[tuple[str, uuid.UUID]]) -> None:
    name = next((value.get(f) for f, entity, is_array in plan.names
                 if entity == TOPIC and not is_array), None)
    topic_id = next((value.get(f) for f, is_array in plan.ids if not is_array), None)
    if isinstance(name, str) and isinstance(topic_id, uuid.UUID) and topic_id.int:
        pairs.append((name, topic_id))
    for field_name, sub, is_array, _ in plan.structs:
        for item in _items(value, field_name, is_array):
            _pair(sub, item, pairs)


def _collect(plan: _Plan, value: dict[str, Any], found: Named) -> None:
    for name, entity, is_array in plan.names:
        for item in _items(value, name, is_array):
            found.add(entity, item)
    for name, is_array in plan.ids:
        for item in _items(value, name, is_array):
            if isinstance(item, uuid.UUID) and item.int:
                found.topic_ids.append(item)
    for name, sub, is_array, _ in plan.structs:
        for item in _items(value, name, is_array):
            _collect(sub, item, found)


def rename_struct(name: str, version: int, value: dict[str, Any], renames: Renames) -> bool:
    """`rename_entities` for a non-message schema (ConsumerProtocolSubscription, ...)."""
    changed, _ = _walk(_struct_plan(name, version), value, renames)
    return changed


_PAYLOAD_SCHEMAS: Final = {"subscription": "ConsumerProtocolSubscription",
                           "assignment": "ConsumerProtocolAssignment"}


def rename_group_payload(protocol_type: str | None, kind: Kind, data: Any,
                         renames: Renames) -> bytes | None:
    """The bytes of a group subscription/assignment with its topics renamed, or None
    when nothing changed (no topic renaming, not a "consumer" group, empty bytes, or
    bytes that do not decode: they are left as the members wrote them)."""
    if protocol_type != CONSUMER or TOPIC not in renames or not data:
        return None
    decode = decode_subscription if kind == "subscription" else decode_assignment
    try:
        payload = decode(CONSUMER, data)
        schema_version = min(payload.version, 3)
        if not rename_struct(_PAYLOAD_SCHEMAS[kind], schema_version, payload.fields,
                             {TOPIC: renames[TOPIC]}):
            return None
        return _encode_payload(payload)
    except KafkaWireError:
        return None


# -- what the schemas do not tag -------------------------------------------------------------


def _rename_one(fn: Rename | None, name: Any) -> tuple[Any, bool]:
    """(new name, keep) for a single special-cased name."""
    if fn is None or not isinstance(name, str):
        return name, True
    new = fn(name)
    return (name, False) if new is None else (new, True)


def _filter_entries(entries: list[dict[str, Any]] | None,
                    rename: Callable[[dict[str, Any]], bool]) -> tuple[list[Any] | None, bool]:
    """Rename each entry in place (rename returns keep); (kept entries, changed)."""
    if entries is None:
        return None, False
    kept = [e for e in entries if rename(e)]
    return kept, len(kept) != len(entries)


def _config_resources(version: int, kind: str, body: dict[str, Any], renames: Renames) -> bool:
    field = "Resources" if kind == "request" else next(
        (f for f in ("Results", "Responses", "ConfigResources") if f in body), "Results")
    changed = False

    def one(resource: dict[str, Any]) -> bool:
        nonlocal changed
        entity = _CONFIG_ENTITY.get(resource.get("ResourceType", -1))
        name = resource.get("ResourceName")
        new, keep = _rename_one(renames.get(entity) if entity else None, name)
        if new != name:
            resource["ResourceName"] = new
            changed = True
        return keep

    kept, dropped = _filter_entries(body.get(field), one)
    if dropped:
        body[field] = kept
    return changed or dropped


def _acl_resource(renames: Renames, entry: dict[str, Any], type_f: str, name_f: str,
                  pattern_f: str, kind: str) -> tuple[bool, bool]:
    """Rename one ACL resource (or filter); returns (changed, keep)."""
    entity = _ACL_ENTITY.get(entry.get(type_f, -1))
    fn = renames.get(entity) if entity else None
    name = entry.get(name_f)
    if fn is None or not isinstance(name, str):
        return False, True
    pattern = entry.get(pattern_f, PATTERN_LITERAL)
    if kind == "request":
        if name == WILDCARD and pattern == PATTERN_LITERAL:
            entry[name_f], entry[pattern_f] = fn(""), PATTERN_PREFIXED
            return True, True
        entry[name_f] = fn(name)
        return True, True
    new = fn(name)
    if new is None:
        return False, False
    if new == "" and pattern == PATTERN_PREFIXED:
        entry[name_f], entry[pattern_f] = WILDCARD, PATTERN_LITERAL
    else:
        entry[name_f] = new
    return True, True


def _create_acls(version: int, kind: str, body: dict[str, Any], renames: Renames) -> bool:
    if kind != "request":
        return False
    if version == 0:
        # v0 has no pattern type: a LITERAL `*` cannot become PREFIXED.
        for c in body.get("Creations") or []:
            if c.get("ResourceName") == WILDCARD and _ACL_ENTITY.get(c.get("ResourceType")):
                raise EntityNameError(
                    "CreateAcls v0 cannot express a namespaced wildcard; use v1+")
    changed = False
    for c in body.get("Creations") or []:
        c_changed, _ = _acl_resource(renames, c, "ResourceType", "ResourceName",
                                     "ResourcePatternType", kind)
        changed |= c_changed
    return changed


def _acl_filter_request(version: int, entry: dict[str, Any], renames: Renames,
                        deleting: bool) -> bool:
    rtype = entry.get("ResourceTypeFilter", -1)
    entity = _ACL_ENTITY.get(rtype)
    renamed_any = any(renames.get(e) is not None for e in _ACL_ENTITY.values())
    if deleting and renamed_any:
        if rtype == ACL_ANY:
            raise EntityNameError("virtual topics: DeleteAcls filters name one resource type "
                                  "(TOPIC, GROUP, TRANSACTIONAL_ID, ...), not ANY")
        if entity and renames.get(entity) and entry.get("ResourceNameFilter") is None:
            raise EntityNameError("virtual topics: DeleteAcls filters name a resource "
                                  "(a null name would reach every tenant's ACLs)")
    if rtype == ACL_ANY:
        # A name given with ANY type is a topic, group and transactional id at once.
        fn = next((renames[e] for e in (TOPIC, GROUP, TRANSACTIONAL_ID) if e in renames), None)
        name = entry.get("ResourceNameFilter")
        if fn is not None and isinstance(name, str):
            entry["ResourceNameFilter"] = fn(name)
            return True
        return False
    if version == 0 and entry.get("ResourceNameFilter") == WILDCARD and entity and \
            renames.get(entity):
        raise EntityNameError("ACL filters v0 cannot express a namespaced wildcard; use v1+")
    changed, _ = _acl_resource(renames, entry, "ResourceTypeFilter", "ResourceNameFilter",
                               "PatternTypeFilter", "request")
    return changed


def _response_acls(renames: Renames, container: dict[str, Any], field: str) -> bool:
    """The ACL resources a response lists in container[field]: renamed for the tenant,
    other tenants' dropped; whether anything changed."""
    changed = False

    def one(resource: dict[str, Any]) -> bool:
        nonlocal changed
        c, keep = _acl_resource(renames, resource, "ResourceType", "ResourceName",
                                "PatternType", "response")
        changed |= c
        return keep

    kept, dropped = _filter_entries(container.get(field), one)
    if dropped:
        container[field] = kept
    return changed or dropped


def _describe_acls(version: int, kind: str, body: dict[str, Any], renames: Renames) -> bool:
    if kind == "request":
        return _acl_filter_request(version, body, renames, deleting=False)
    return _response_acls(renames, body, "Resources")


def _delete_acls(version: int, kind: str, body: dict[str, Any], renames: Renames) -> bool:
    changed = False
    if kind == "request":
        for f in body.get("Filters") or []:
            changed |= _acl_filter_request(version, f, renames, deleting=True)
        return changed
    for result in body.get("FilterResults") or []:
        changed |= _response_acls(renames, result, "MatchingAcls")
    return changed


def _find_coordinator(version: int, kind: str, body: dict[str, Any], renames: Renames) -> bool:
    key_type = body.get("KeyType", 0)
    changed = False
    if kind == "request":
        fn = renames.get(_COORDINATOR_ENTITY.get(key_type, ""))
        if fn is None:
            return False
        if isinstance(body.get("Key"), str) and version <= 3:
            body["Key"] = fn(body["Key"])
            changed = True
        keys = body.get("CoordinatorKeys")
        if keys:
            body["CoordinatorKeys"] = [fn(k) for k in keys]
            changed = True
        return changed
    # The response does not say the key type; every key of one request has the same,
    # so an answer key is stripped by whichever function knows it.
    coordinators = body.get("Coordinators")
    if not coordinators:
        return False
    fns = [renames[e] for e in (GROUP, TRANSACTIONAL_ID) if e in renames]
    for c in coordinators:
        key = c.get("Key")
        for fn in fns:
            new = fn(key) if isinstance(key, str) else None
            if new is not None:
                c["Key"] = new
                changed = True
                break
    return changed


def _describe_groups(version: int, kind: str, body: dict[str, Any], renames: Renames) -> bool:
    if kind != "response" or TOPIC not in renames:
        return False
    changed = False
    for group in body.get("Groups") or []:
        protocol_type = group.get("ProtocolType")
        for member in group.get("Members") or []:
            for field, payload_kind in (("MemberMetadata", "subscription"),
                                        ("MemberAssignment", "assignment")):
                new = rename_group_payload(protocol_type, payload_kind,  # type: ignore[arg-type]
                                           member.get(field), renames)
                if new is not None:
                    member[field] = new
                    changed = True
    return changed


def _collect_config_resources(kind: str, body: dict[str, Any], found: Named) -> None:
    field = "Resources" if kind == "request" else next(
        (f for f in ("Results", "Responses", "ConfigResources") if f in body), "Results")
    for resource in body.get(field) or ():
        entity = _CONFIG_ENTITY.get(resource.get("ResourceType", -1))
        if entity is not None:
            found.add(entity, resource.get("ResourceName"))


def _collect_acls(entries: Any, type_f: str, name_f: str, found: Named) -> None:
    for entry in entries or ():
        entity = _ACL_ENTITY.get(entry.get(type_f, -1))
        if entity is not None:  # a null filter name (every resource) names nothing
            found.add(entity, entry.get(name_f))


def _collect_create_acls(kind: str, body: dict[str, Any], found: Named) -> None:
    if kind == "request":
        _collect_acls(body.get("Creations"), "ResourceType", "ResourceName", found)


def _collect_describe_acls(kind: str, body: dict[str, Any], found: Named) -> None:
    if kind == "request":
        _collect_acls((body,), "ResourceTypeFilter", "ResourceNameFilter", found)
    else:
        _collect_acls(body.get("Resources"), "ResourceType", "ResourceName", found)


def _collect_delete_acls(kind: str, body: dict[str, Any], found: Named) -> None:
    if kind == "request":
        _collect_acls(body.get("Filters"), "ResourceTypeFilter", "ResourceNameFilter", found)
        return
    for result in body.get("FilterResults") or ():
        _collect_acls(result.get("MatchingAcls"), "ResourceType", "ResourceName", found)


def _collect_coordinator_keys(kind: str, body: dict[str, Any], found: Named) -> None:
    if kind != "request":
        return
    entity = _COORDINATOR_ENTITY.get(body.get("KeyType", 0))
    if entity is None:
        return
    found.add(entity, body.get("Key"))
    for key in body.get("CoordinatorKeys") or ():
        found.add(entity, key)


_Collect = Callable[[str, dict[str, Any], Named], None]
_COLLECT_SPECIAL: Final[dict[int, _Collect]] = {
    ApiKey.DESCRIBE_CONFIGS: _collect_config_resources,
    ApiKey.ALTER_CONFIGS: _collect_config_resources,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _collect_config_resources,
    ApiKey.LIST_CONFIG_RESOURCES: _collect_config_resources,
    ApiKey.DESCRIBE_ACLS: _collect_describe_acls,
    ApiKey.CREATE_ACLS: _collect_create_acls,
    ApiKey.DELETE_ACLS: _collect_delete_acls,
    ApiKey.FIND_COORDINATOR: _collect_coordinator_keys,
}

_Special = Callable[[int, str, dict[str, Any], Renames], bool]
_SPECIAL: Final[dict[int, _Special]] = {
    ApiKey.DESCRIBE_CONFIGS: _config_resources,
    ApiKey.ALTER_CONFIGS: _config_resources,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _config_resources,
    ApiKey.LIST_CONFIG_RESOURCES: _config_resources,
    ApiKey.DESCRIBE_ACLS: _describe_acls,
    ApiKey.CREATE_ACLS: _create_acls,
    ApiKey.DELETE_ACLS: _delete_acls,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.DESCRIBE_GROUPS: _describe_groups,
}
_ALL: Final = frozenset(ENTITY_TYPES)
_SPECIAL_ENTITIES: Final[dict[int, frozenset[str]]] = {
    ApiKey.DESCRIBE_CONFIGS: frozenset({TOPIC, GROUP}),
    ApiKey.ALTER_CONFIGS: frozenset({TOPIC, GROUP}),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: frozenset({TOPIC, GROUP}),
    ApiKey.LIST_CONFIG_RESOURCES: frozenset({TOPIC, GROUP}),
    ApiKey.DESCRIBE_ACLS: _ALL,
    ApiKey.CREATE_ACLS: _ALL,
    ApiKey.DELETE_ACLS: _ALL,
    ApiKey.FIND_COORDINATOR: frozenset({GROUP, TRANSACTIONAL_ID}),
    ApiKey.DESCRIBE_GROUPS: frozenset({TOPIC, GROUP}),
}


__all__ = [
    "ENTITY_TYPES",
    "GROUP",
    "TOPIC",
    "TRANSACTIONAL_ID",
    "Entity",
    "EntityNameError",
    "Named",
    "Rename",
    "Renames",
    "entity_types",
    "named_entities",
    "names_entities",
    "rename_entities",
    "rename_group_payload",
    "rename_struct",
    "topic_id_pairs",
]
