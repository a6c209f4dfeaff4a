"""Avro record values: a schema loaded once, read and written with fastavro.

A value is the Avro binary body, or with `framing: confluent` the Confluent wire
format: magic byte 0, a 4-byte schema id, then the body. The 5-byte prefix is kept as
it was when a value is written back. Here the schema id is not looked up: the rule's
schema is the writer's schema (the `schema` action asks a registry, builtin/schema.py).

Reading must consume the exact bytes: trailing bytes make the value invalid.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Final

import fastavro
import orjson

from filter_rules.files import read_regular_file
from filter_rules.record_actions import AvroSchemaRef
from interceptors.contract import BuildContext, InterceptorConfigError
from interceptors.jsonpath import WILDCARD, FieldPath

CONFLUENT_MAGIC: Final = 0
CONFLUENT_PREFIX: Final = 5
_PRIMITIVES: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)


class AvroDecodeError(ValueError):
    """A value that is not the schema's Avro encoding."""


class AvroCodec:
    """One parsed writer schema and the framing of values."""

    __slots__ = ("_named", "framing", "name", "schema")

    def __init__(self, ref: AvroSchemaRef, ctx: BuildContext) -> None:
        self._setup(_load_schema(ref, ctx), ref.framing, None)

    @classmethod
    def of_schema(cls, raw: Any, framing: str = "none",
                  named_schemas: dict[str, Any] | None = None) -> AvroCodec:
        """A codec of a schema already loaded (e.g. from a registry); `named_schemas`
        holds the named types it may refer to (parsed before it, fastavro's way)."""
        codec = cls.__new__(cls)
        codec._setup(raw, framing, named_schemas)
        return codec

    def _setup(self, raw: Any, framing: str, named_schemas: dict[str, Any] | None) -> None:
        try:
            self.schema: Any = fastavro.parse_schema(raw, named_schemas=named_schemas)
        except Exception as exc:  # fastavro raises several unrelated types here
            raise InterceptorConfigError(f"invalid Avro schema: {exc}") from None
        self._named: dict[str, Any] = (
            self.schema.get("__named_schemas", {}) if isinstance(self.schema, dict) else {}
        )
        self.framing = framing
        self.name = _schema_name(self.schema)

    def decode(self, data: bytes) -> Any:
        body = memoryview(data)
        if self.framing == "confluent":
            if len(data) < CONFLUENT_PREFIX or data[0] != CONFLUENT_MAGIC:
                raise AvroDecodeError("not in Confluent wire format (magic byte 0 + schema id)")
            body = body[CONFLUENT_PREFIX:]
        stream = io.BytesIO(body)
        try:
            doc = fastavro.schemaless_reader(stream, self.schema, None)
        except Exception as exc:  # malformed input surfaces as EOFError, IndexError, ...
            raise AvroDecodeError(f"not valid Avro for {self.name}: {_describe(exc)}") from None
        rest = len(body) - stream.tell()
        if rest:
            raise AvroDecodeError(f"not valid Avro for {self.name}: {rest} trailing bytes")
        return doc

    def encode(self, doc: Any, like: bytes) -> bytes:
        """`doc` written with the schema, behind the prefix `like` had."""
        out = io.BytesIO()
        if self.framing == "confluent":
            out.write(like[:CONFLUENT_PREFIX])
        fastavro.schemaless_writer(out, self.schema, doc)
        return out.getvalue()

    def types_at(self, path: FieldPath) -> tuple[frozenset[str], str]:
        """The Avro type names a path can hold and what holds it (record, map, array).

        Raises InterceptorConfigError when the schema has no such field, so a typo in
        a rule is found when it is loaded, not by never matching.
        """
        nodes = [self.schema]
        holder = "record"
        for step in path.steps:
            found: list[Any] = []
            holders: set[str] = set()
            for node in self._branches(nodes):
                kind = node.get("type") if isinstance(node, dict) else None
                if kind == "record" and isinstance(step, str):
                    for field in node["fields"]:
                        if field["name"] == step:
                            found.append(field["type"])
                            holders.add("record")
                elif kind == "map" and (isinstance(step, str) or step is WILDCARD):
                    found.append(node["values"])
                    holders.add("map")
                elif kind == "array" and not isinstance(step, str):
                    found.append(node["items"])
                    holders.add("array")
            if not found:
                raise InterceptorConfigError(
                    f"field path {path.text} does not exist in the Avro schema {self.name}"
                )
            nodes = found
            holder = "record" if "record" in holders else holders.pop()
        return frozenset(_type_name(n) for n in self._branches(nodes)), holder

    def _branches(self, nodes: list[Any]) -> list[Any]:
        """Named references resolved and unions flattened."""
        out: list[Any] = []
        for node in nodes:
            if isinstance(node, list):
                out.extend(self._branches(node))
            elif isinstance(node, str) and node not in _PRIMITIVES:
                out.extend(self._branches([self._lookup(node)]))
            elif (isinstance(node, dict) and isinstance(node.get("type"), (list, dict))) or (
                isinstance(node, dict)
                and isinstance(node.get("type"), str)
                and node["type"] not in _PRIMITIVES | {"record", "enum", "fixed", "map", "array"}
            ):
                out.extend(self._branches([node["type"]]))
            else:
                out.append(node)
        return out

    def _lookup(self, name: str) -> Any:
        if name in self._named:
            return self._named[name]
        for full, schema in self._named.items():
            if full.rsplit(".", 1)[-1] == name:
                return schema
        raise InterceptorConfigError(f"Avro schema {self.name} names unknown type {name}")


def _type_name(node: Any) -> str:
    if isinstance(node, str):
        return node
    return str(node.get("type")) if isinstance(node, dict) else "unknown"


def _schema_name(schema: Any) -> str:
    if isinstance(schema, dict) and "name" in schema:
        return str(schema["name"])
    return _type_name(schema) if not isinstance(schema, list) else "union"


def _load_schema(ref: AvroSchemaRef, ctx: BuildContext) -> Any:
    if ref.file is not None:
        path: Path = ctx.resolve(ref.file)
        try:
            return orjson.loads(read_regular_file(path))
        except OSError as exc:
            raise InterceptorConfigError(
                f"cannot read Avro schema {path}: {exc.strerror}"
            ) from None
        except orjson.JSONDecodeError as exc:
            raise InterceptorConfigError(f"Avro schema {path} is not JSON: {exc}") from None
    schema = ref.schema_
    if isinstance(schema, str) and schema.lstrip()[:1] in ("{", "[", '"'):
        try:
            return orjson.loads(schema)
        except orjson.JSONDecodeError as exc:
            raise InterceptorConfigError(f"inline Avro schema is not JSON: {exc}") from None
    return schema  # a mapping, or a type name such as "string"


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
