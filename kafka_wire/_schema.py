"""Kafka's JSON message schemas: loading, and the registry merged from three schema sets.

`schemas/kafka-4.1.1/*.json` is Apache Kafka 4.1.1's own set, the broker keg runs
(share groups, Produce v13, Fetch v18; no versions 4.0 removed); `schemas/newer/*.json`
comes from kafka-python 3.x; `schemas/*.json` is Apache Kafka's set of late 2024
(every pre-4.0 version). For a given version the first set whose file's validVersions
contain it wins, in that order: the codec follows the broker, and still reads the
versions older clients and brokers speak.

Only the heads of the files (name, apiKey, type, versions) are read to build the
registry; a file's fields are parsed the first time one of its versions is needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, TypedDict

from kafka_wire.errors import UnknownApiError

# Open-ended ranges ("3+") end here: Kafka versions are int16.
MAX_VERSION = 0x7FFF
NO_VERSIONS: tuple[int, int] = (0, -1)

PRIMITIVES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "float64",
        "string",
        "bytes",
        "records",
        "uuid",
    }
)

# A JSON string literal, or a // comment running to the end of its line. Matching the
# strings too keeps a "//" inside one (a URL in an "about") from being taken as a comment.
_STRING_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*')
_HEAD_KEY = re.compile(
    r'"(apiKey|type|name|validVersions|flexibleVersions)"\s*:\s*("(?:\\.|[^"\\])*"|-?\d+)'
)

Versions = tuple[int, int]
BROKER_SET = "kafka-4.1.1"  # the schema set of the broker keg runs, preferred over the others


def strip_comments(text: str) -> str:
    """Remove // comments from a schema file, leaving string literals intact."""
    return _STRING_OR_COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "", text)


def parse_versions(spec: str | None) -> Versions:
    """ "3+" -> (3, MAX_VERSION), "0-11" -> (0, 11), "5" -> (5, 5), "none"/None -> empty."""
    if spec is None:
        return NO_VERSIONS
    spec = spec.strip()
    if spec == "none":
        return NO_VERSIONS
    if spec.endswith("+"):
        return (int(spec[:-1]), MAX_VERSION)
    if "-" in spec:
        lo, hi = spec.split("-", 1)
        return (int(lo), int(hi))
    return (int(spec), int(spec))


def in_versions(version: int, versions: Versions) -> bool:
    return versions[0] <= version <= versions[1]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    type: str  # as in the JSON: "int32", "[]string", "[]MetadataResponseTopic", "Cursor"
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    # Field-level override of compactness (RequestHeader.ClientId: "none").
    flexible: Versions | None
    ignorable: bool
    default: Any  # raw "default" of the JSON (str, bool or None)
    struct: StructSpec | None  # element struct for "[]Struct" and "Struct" types

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem_type(self) -> str:
        """The element type for arrays, the type itself otherwise."""
        return self.type[2:] if self.type.startswith("[]") else self.type

    def present(self, version: int) -> bool:
        return in_versions(version, self.versions)

    def is_tagged(self, version: int) -> bool:
        return self.tag is not None and in_versions(version, self.tagged)


@dataclass(frozen=True, slots=True)
class StructSpec:
    name: str
    fields: tuple[FieldSpec, ...]


@dataclass(slots=True)
class MessageSpec:
    """One schema file fully parsed."""

    name: str
    kind: str  # "request", "response", "header" or "data"
    api_key: int | None
    valid: Versions
    flexible: Versions
    struct: StructSpec


@dataclass(slots=True)
class SchemaFile:
    """The head of a schema file; `spec()` parses the rest on first use."""

    name: str
    kind: str
    api_key: int | None
    valid: Versions
    flexible: Versions
    resource: Traversable
    source: str  # "kafka-4.1.1", "newer" or "2024"
    _spec: MessageSpec | None = field(default=None, repr=False)

    def spec(self) -> MessageSpec:
        if self._spec is None:
            text = strip_comments(self.resource.read_text("utf-8"))
            self._spec = _parse_message(json.loads(text))
        return self._spec


class _StructResolver:
    """Resolves struct type names of one file: inline definitions and commonStructs."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.common = {c["name"]: c["fields"] for c in doc.get("commonStructs", [])}
        self.done: dict[str, StructSpec] = {}

    def struct(self, name: str, fields: list[dict[str, Any]] | None) -> StructSpec:
        if fields is None:
            if name in self.done:
                return self.done[name]
            if name not in self.common:
                raise ValueError(f"struct type {name} has no definition")
            fields = self.common[name]
        spec = StructSpec(name, tuple(self.field(f) for f in fields))
        self.done.setdefault(name, spec)
        return spec

    def field(self, f: dict[str, Any]) -> FieldSpec:
        ftype: str = f["type"]
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        struct = None if elem in PRIMITIVES else self.struct(elem, f.get("fields"))
        flexible = f.get("flexibleVersions")
        tag = f.get("tag")  # an int, but a string in a few files ("tag": "0")
        return FieldSpec(
            name=f["name"],
            type=ftype,
            versions=parse_versions(f["versions"]),
            nullable=parse_versions(f.get("nullableVersions")),
            tagged=parse_versions(f.get("taggedVersions")),
            tag=None if tag is None else int(tag),
            flexible=None if flexible is None else parse_versions(flexible),
            ignorable=bool(f.get("ignorable", False)),
            default=f.get("default"),
            struct=struct,
        )


class _Head(TypedDict):
    """The top-level keys of a schema file, as MessageSpec and SchemaFile both hold them."""

    name: str
    kind: str
    api_key: int | None
    valid: Versions
    flexible: Versions


def _head(keys: dict[str, Any]) -> _Head:
    """The head of a whole parsed file or of the keys a head scan found."""
    return _Head(name=keys["name"], kind=keys["type"], api_key=keys.get("apiKey"),
                 valid=parse_versions(keys["validVersions"]),
                 flexible=parse_versions(keys.get("flexibleVersions")))


def _parse_message(doc: dict[str, Any]) -> MessageSpec:
    resolver = _StructResolver(doc)
    return MessageSpec(**_head(doc), struct=resolver.struct(doc["name"], doc["fields"]))


_REQUIRED_HEAD = ("name", "type", "validVersions")


def _head_keys(text: str) -> dict[str, Any]:
    # Top-level keys precede "fields" in every Kafka schema; the nested "name"s come after.
    end = text.find('"fields"')
    head = text if end < 0 else text[:end]
    return {m.group(1): json.loads(m.group(2)) for m in _HEAD_KEY.finditer(head)}


def _read_head(resource: Traversable, source: str) -> SchemaFile:
    raw = resource.read_text("utf-8")
    # Stripping comments from the head only is much cheaper; if the cut fell inside a
    # comment and lost a key, strip the whole file.
    cut = raw.find('"fields"')
    keys = _head_keys(strip_comments(raw if cut < 0 else raw[:cut]))
    if not all(k in keys for k in _REQUIRED_HEAD):
        keys = _head_keys(strip_comments(raw))
    return SchemaFile(**_head(keys), resource=resource, source=source)


class Registry:
    """Every schema file by name and by (api_key, kind), newer files first.

    An API can change its schema name between the sets (api key 74 is
    ListClientMetricsResources in 2024 and ListConfigResources later), so lookups by
    api key span names.
    """

    def __init__(self, sources: list[tuple[str, Traversable]]) -> None:
        self.by_name: dict[str, list[SchemaFile]] = {}
        self.by_key: dict[tuple[int, str], list[SchemaFile]] = {}
        for source, directory in sources:
            for resource in sorted(directory.iterdir(), key=lambda r: r.name):
                if not resource.name.endswith(".json"):
                    continue
                head = _read_head(resource, source)
                if head.valid == NO_VERSIONS:  # an API the set removed ("validVersions": "none")
                    continue
                self.by_name.setdefault(head.name, []).append(head)
                if head.api_key is not None:
                    self.by_key.setdefault((head.api_key, head.kind), []).append(head)

    def files(self, name: str) -> list[SchemaFile]:
        try:
            return self.by_name[name]
        except KeyError:
            raise UnknownApiError(f"no schema named {name!r}") from None

    def key_files(self, api_key: int, kind: str) -> list[SchemaFile]:
        try:
            return self.by_key[(api_key, kind)]
        except KeyError:
            raise UnknownApiError(f"no {kind} schema for api key {api_key}") from None

    def file_for(self, name: str, version: int) -> SchemaFile:
        """The file describing `name` at `version`, preferring the newer set."""
        return _pick(self.files(name), version, name)

    def file_for_key(self, api_key: int, kind: str, version: int) -> SchemaFile:
        return _pick(self.key_files(api_key, kind), version, f"api key {api_key} {kind}")

    def key_range(self, api_key: int, kind: str) -> Versions:
        files = self.key_files(api_key, kind)
        return (min(f.valid[0] for f in files), max(f.valid[1] for f in files))


def _pick(files: list[SchemaFile], version: int, what: str) -> SchemaFile:
    for f in files:
        if in_versions(version, f.valid):
            return f
    raise UnknownApiError(f"{what} has no version {version}")


_registry: Registry | None = None


def registry() -> Registry:
    global _registry
    if _registry is None:
        base = resources.files("kafka_wire").joinpath("schemas")
        _registry = Registry([(BROKER_SET, base.joinpath(BROKER_SET)),
                              ("newer", base.joinpath("newer")), ("2024", base)])
    return _registry
