"""A client of Confluent-compatible schema registries, for the `schema` record rule.

Two questions are asked, each answer cached so the registry is never called per record:

- `schema(id)`: the schema an id names (`GET /schemas/ids/{id}`, with the schemas it
  references, `GET /subjects/{subject}/versions/{version}`), compiled into a checker:
  Avro (fastavro), JSON Schema (jsonschema + fastjsonschema, as `validate`), Protobuf
  (protoc, interceptors/protobuf_schema.py). An id names one schema forever, so a found
  schema is kept while it is used (least recently used out past `cache_size`); an
  unknown id is remembered for a short while (`NEGATIVE_TTL_S`).
- `subjects(id)`: the subjects the id is registered under
  (`GET /schemas/ids/{id}/versions`), believed for `cache_ttl_s`; a subject found
  missing is asked about again (the rule does so at most once a second per topic and
  id: a registry gives the same schema registered under a new subject the same id).
  When the registry cannot be asked again, the last answer is kept (a schema deleted
  meanwhile is still accepted until the registry answers again: availability over
  freshness).

Every call is bounded (interceptors/remote.py): a stalled registry costs a record at
most `timeout_ms`, then ServiceUnavailable, and for a short back-off none at all.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from filter_rules.files import check_regular_file
from filter_rules.record_actions import SchemaRegistryRef
from interceptors.avro import AvroCodec, AvroDecodeError
from interceptors.contract import BuildContext, InterceptorConfigError, ServiceUnavailable
from interceptors.jsonpath import JSON_CODEC
from interceptors.keys import read_secret
from interceptors.protobuf_schema import PayloadError, ProtobufSchema, ProtobufSchemaError
from interceptors.remote import ServiceCaller, ServiceFailure, TtlCache

log = logging.getLogger(__name__)

SchemaType = Literal["AVRO", "JSON", "PROTOBUF"]
CONFLUENT_MAGIC: Final = 0
PREFIX: Final = 5  # magic byte + 4-byte schema id
NEGATIVE_TTL_S: Final = 10.0
MAX_REFERENCES: Final = 64  # schemas one schema may pull in, transitively
_MAX_ANSWER: Final = 8 * 1024 * 1024
_SCHEMA_TYPES: Final[dict[str, SchemaType]] = {"AVRO": "AVRO", "JSON": "JSON",
                                               "PROTOBUF": "PROTOBUF"}
_ACCEPT: Final = "application/vnd.schemaregistry.v1+json, application/json"


class NotRegistered(Exception):
    """The registry does not know this id (or subject version): a verdict, not a failure."""


@dataclass(frozen=True, slots=True)
class Reference:
    name: str
    subject: str
    version: int


class RegisteredSchema:
    """The schema an id names, compiled: its type, record name and a payload check.

    A schema that does not compile is kept with its `error`: records naming it are
    refused with that reason (the registry will not change what the id means).
    """

    __slots__ = ("_avro", "_json", "_proto", "error", "id", "native_json", "record_name",
                 "type")

    def __init__(self, schema_id: int, schema_type: SchemaType, text: str,
                 references: list[tuple[Reference, SchemaType, str]]) -> None:
        self.id = schema_id
        self.type: SchemaType = schema_type
        self.error: str | None = None
        self.record_name: str | None = None
        # The JSON Schema keg's Kafka filter may check payloads against itself (a JSON
        # Schema without references, within `native_subset`), as text; else None.
        self.native_json: str | None = None
        self._avro: AvroCodec | None = None
        self._json: Any = None
        self._proto: ProtobufSchema | None = None
        try:
            if schema_type == "AVRO":
                self._compile_avro(text, references)
            elif schema_type == "JSON":
                self._compile_json(text, references)
            else:
                self._proto = ProtobufSchema(text, {r.name: t for r, _kind, t in references})
                self.record_name = self._proto.first_message
        except (InterceptorConfigError, ProtobufSchemaError, ValueError) as exc:
            self.error = f"schema id {schema_id} ({schema_type}) cannot be used: {exc}"[:200]

    def _compile_avro(self, text: str, references: list[tuple[Reference, SchemaType, str]]
                      ) -> None:
        named: dict[str, Any] = {}
        for _ref, _kind, ref_text in references:  # dependencies first
            AvroCodec.of_schema(_json_doc(ref_text), named_schemas=named)
        codec = AvroCodec.of_schema(_json_doc(text), named_schemas=named)
        self._avro = codec
        schema = codec.schema
        self.record_name = (str(schema["name"]) if isinstance(schema, dict) and "name" in schema
                            else codec.name)

    def _compile_json(self, text: str, references: list[tuple[Reference, SchemaType, str]]
                      ) -> None:
        from interceptors.json_schema import JsonSchemaCheck, native_subset

        doc = _json_doc(text)
        registry = None
        if references:
            from referencing import Registry, Resource
            from referencing.jsonschema import DRAFT202012

            registry = Registry().with_resources(
                (ref.name, Resource.from_contents(_json_doc(ref_text),
                                                  default_specification=DRAFT202012))
                for ref, _kind, ref_text in references)
        self._json = JsonSchemaCheck(doc, registry)
        if registry is None and native_subset(doc):
            self.native_json = orjson.dumps(doc).decode()
        title = doc.get("title") if isinstance(doc, dict) else None
        self.record_name = title if isinstance(title, str) else None

    def record_name_of(self, data: bytes | memoryview) -> str | None:
        """The record name a serializer named its subject after: for Protobuf, the full
        name of the message the value's indexes select."""
        if self._proto is None:
            return self.record_name
        try:
            indexes = read_indexes(data)
            return self._proto.full_name(indexes)
        except PayloadError:
            return None

    def check(self, data: bytes | memoryview) -> str | None:
        """None when the value (with its 5-byte prefix) is valid for the schema."""
        if self.error is not None:
            return self.error
        if self._avro is not None:
            try:
                self._avro.decode(bytes(data[PREFIX:]))
            except AvroDecodeError as exc:
                return str(exc)
            return None
        if self._json is not None:
            payload = data[PREFIX:]
            try:
                # orjson straight from the view: nothing is written back, so the exact
                # reading of very long numbers (JSON_CODEC's) is only needed where orjson
                # refuses them (beyond 64 bits), and for the error message.
                doc = orjson.loads(payload)
            except orjson.JSONDecodeError:
                try:
                    doc = JSON_CODEC.decode(bytes(payload))
                except ValueError as exc:
                    return f"not valid JSON: {exc}"
            return self._json.reason(doc)
        assert self._proto is not None
        return self._proto.check(data, PREFIX)


def read_indexes(data: bytes | memoryview) -> tuple[int, ...]:
    from interceptors.protobuf_schema import read_message_indexes

    return read_message_indexes(data, PREFIX)[0]


def _json_doc(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the schema is not JSON: {exc}") from None


# --- the client -----------------------------------------------------------------------


_UNKNOWN: Final = object()  # a cached "not registered"


class RegistryClient:
    """One registry: its bounded caller and its caches (see the module's docstring)."""

    def __init__(self, url: str, *, authorization: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, timeout_s: float = 0.5,
                 ttl_s: float = 300.0, cache_size: int = 10_000,
                 opener: Callable[..., Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Accept": _ACCEPT, "User-Agent": "keg"}
        if authorization is not None:
            self._headers["Authorization"] = authorization
        self._ssl = ssl_context
        # The socket's own timeout: a call abandoned by its record still ends.
        self._socket_timeout = max(5.0, 10 * timeout_s)
        self._open = opener or urllib.request.urlopen
        self.caller = ServiceCaller(f"schema registry {self.url}", timeout_s)
        self._schemas: TtlCache[int, Any] = TtlCache(cache_size)
        self._subjects: TtlCache[int, Any] = TtlCache(cache_size, ttl_s)
        self._stale_warned = False

    # -- the questions ------------------------------------------------------------------

    def schema(self, schema_id: int, fail_open: bool = False) -> RegisteredSchema | None:
        """The compiled schema of `schema_id`, None when the registry does not know it."""
        found = self._schemas.get(schema_id)
        if found is None:
            found = self.caller.call(("schema", schema_id),
                                     lambda: self._fetch_schema(schema_id), fail_open)
        return None if found is _UNKNOWN else found

    def subjects(self, schema_id: int, fail_open: bool = False,
                 recheck: bool = False) -> frozenset[str]:
        """The subjects `schema_id` is registered under (empty: none). `recheck`: ask
        the registry even when the answer is cached (the caller found its subject
        missing: the same schema registered under another subject keeps its id)."""
        cached = self._subjects.get_any(schema_id)
        if cached is not None and cached[1] and not recheck:
            return cached[0]
        try:
            return self.caller.call(("subjects", schema_id),
                                    lambda: self._fetch_subjects(schema_id), fail_open)
        except ServiceUnavailable:
            if cached is None:
                raise
            if not self._stale_warned:
                self._stale_warned = True
                log.warning("%s: using the last known subjects of schema ids until it "
                            "answers again", self.caller.name)
            return cached[0]

    # -- the calls (in the caller's threads) -------------------------------------------------

    def _fetch_schema(self, schema_id: int) -> Any:
        try:
            answer = self._get(f"/schemas/ids/{schema_id}")
        except NotRegistered:
            self._schemas.put(schema_id, _UNKNOWN, NEGATIVE_TTL_S)
            return _UNKNOWN
        schema_type, text, refs = _schema_answer(answer)
        references = self._resolve(refs, set())
        compiled = RegisteredSchema(schema_id, schema_type, text, references)
        if compiled.error:
            log.warning("%s: %s", self.caller.name, compiled.error)
        self._schemas.put(schema_id, compiled)
        return compiled

    def _resolve(self, refs: list[Reference], seen: set[tuple[str, int]]
                 ) -> list[tuple[Reference, SchemaType, str]]:
        """The referenced schemas, transitively, each after those it references."""
        out: list[tuple[Reference, SchemaType, str]] = []
        for ref in refs:
            key = (ref.subject, ref.version)
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > MAX_REFERENCES:
                raise ServiceFailure(f"more than {MAX_REFERENCES} schema references")
            subject = urllib.parse.quote(ref.subject, safe="")
            try:
                answer = self._get(f"/subjects/{subject}/versions/{ref.version}")
            except NotRegistered:
                raise ServiceFailure(f"referenced schema {ref.subject} version "
                                     f"{ref.version} is missing") from None
            kind, text, nested = _schema_answer(answer)
            out.extend(self._resolve(nested, seen))
            out.append((ref, kind, text))
        return out

    def _fetch_subjects(self, schema_id: int) -> frozenset[str]:
        try:
            answer = self._get(f"/schemas/ids/{schema_id}/versions")
        except NotRegistered:
            subjects: frozenset[str] = frozenset()
        else:
            if not isinstance(answer, list):
                raise ServiceFailure("unexpected answer to /schemas/ids/{id}/versions")
            subjects = frozenset(str(entry.get("subject")) for entry in answer
                                 if isinstance(entry, dict) and entry.get("subject"))
        self._subjects.put(schema_id, subjects)
        return subjects

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers=self._headers)
        try:
            with self._open(request, timeout=self._socket_timeout, context=self._ssl) as answer:
                body = answer.read(_MAX_ANSWER + 1)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                raise NotRegistered(path) from None
            raise ServiceFailure(f"HTTP {err.code} for {path}") from None
        if len(body) > _MAX_ANSWER:
            raise ServiceFailure(f"answer to {path} larger than {_MAX_ANSWER} bytes")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ServiceFailure(f"answer to {path} is not JSON") from None

    def close(self) -> None:
        self.caller.close()


def _schema_answer(answer: Any) -> tuple[SchemaType, str, list[Reference]]:
    if not isinstance(answer, dict) or not isinstance(answer.get("schema"), str):
        raise ServiceFailure("unexpected answer: no schema")
    named = answer.get("schemaType") or "AVRO"
    kind = _SCHEMA_TYPES.get(named) if isinstance(named, str) else None
    if kind is None:
        raise ServiceFailure(f"unknown schema type {named!r}")
    refs = []
    for ref in answer.get("references") or ():
        try:
            refs.append(Reference(str(ref["name"]), str(ref["subject"]), int(ref["version"])))
        except (KeyError, TypeError, ValueError):
            raise ServiceFailure("malformed schema reference") from None
    return kind, answer["schema"], refs


def basic_authorization(username: str, password: str) -> str:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return f"Basic {token}"


def bearer_authorization(token: str) -> str:
    return f"Bearer {token}"


def registry_client(spec: SchemaRegistryRef, ctx: BuildContext) -> RegistryClient:
    """The client for these settings, shared through `ctx.services` by every rule
    naming the same registry with the same settings (its cache with them)."""
    authorization = None
    if spec.auth is not None and spec.auth.basic is not None:
        password = read_secret(spec.auth.basic.password, ctx, "registry password")
        authorization = basic_authorization(spec.auth.basic.username, password)
    elif spec.auth is not None and spec.auth.bearer is not None:
        authorization = bearer_authorization(
            read_secret(spec.auth.bearer, ctx, "registry bearer token"))
    ca_file = str(ctx.resolve(spec.ca_file)) if spec.ca_file else None
    digest = hashlib.sha256((authorization or "").encode()).hexdigest()
    key = ("registry", spec.url, digest, ca_file, spec.timeout_ms, spec.cache_ttl_s,
           spec.cache_size)

    def make() -> RegistryClient:
        return RegistryClient(spec.url, authorization=authorization,
                              ssl_context=_ssl_context(ca_file),
                              timeout_s=spec.timeout_ms / 1000,
                              ttl_s=spec.cache_ttl_s, cache_size=spec.cache_size)

    return ctx.services.client(key, make)


def _ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    try:
        check_regular_file(ca_file)  # OpenSSL would block on a FIFO, read /dev/zero forever
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise InterceptorConfigError(f"cannot use CA file {ca_file}: {exc}") from None
