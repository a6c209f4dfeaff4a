"""What the schema set knows: API names and versions, header versions, compiled codecs.

Everything is computed on first use and cached: the registry scans the schema heads
once (~20 ms); a message's reader or writer is compiled the first time that
(api key, version, kind) is decoded or encoded.
"""

from __future__ import annotations

from functools import cache

from kafka_wire._codegen import StructReader, StructWriter, compile_reader, compile_writer
from kafka_wire._schema import MAX_VERSION, SchemaFile, in_versions, registry
from kafka_wire.enums import ApiKey
from kafka_wire.errors import UnknownApiError

KINDS = ("request", "response")

_header_versions: dict[tuple[int, int, str], int] = {}


def api_name(api_key: int) -> str | None:
    """The API's name as in the newest schema, without the suffix: 3 -> "Metadata"."""
    files = registry().by_key.get((api_key, "request"))
    if files is None:
        return None
    return max(files, key=lambda f: f.valid[1]).name.removesuffix("Request")


def known_api_keys() -> list[int]:
    return sorted(key for key, kind in registry().by_key if kind == "request")


def supported_versions(api_key: int) -> tuple[int, int] | None:
    """(min, max) request versions over both schema sets, None for an unknown key."""
    if (api_key, "request") not in registry().by_key:
        return None
    return registry().key_range(api_key, "request")


def message_file(api_key: int, api_version: int, kind: str) -> SchemaFile:
    if kind not in KINDS:
        raise UnknownApiError(f"kind must be 'request' or 'response', not {kind!r}")
    return registry().file_for_key(api_key, kind, api_version)


def _is_flexible(api_key: int, api_version: int, kind: str) -> bool:
    files = registry().key_files(api_key, kind)
    if not 0 <= api_version <= MAX_VERSION:
        raise UnknownApiError(f"api key {api_key} has no version {api_version}")
    for f in files:
        if in_versions(api_version, f.valid):
            return in_versions(api_version, f.flexible)
    # A version newer than the schemas: flexibleVersions are open-ended ("9+"), so the
    # newest file still tells whether its headers are flexible.
    newest = max(files, key=lambda f: f.valid[1])
    if api_version < newest.valid[1]:
        raise UnknownApiError(f"api key {api_key} has no version {api_version}")
    return in_versions(api_version, newest.flexible)


def request_header_version(api_key: int, api_version: int) -> int:
    """Kafka's rule: flexible requests use header v2, others v1 (ControlledShutdown v0: v0).

    Versions above the schema set's maximum are answered from the newest schema, so a
    frame of a newer client can still be routed by its header.
    """
    key = (api_key, api_version, "request")
    hv = _header_versions.get(key)
    if hv is None:
        if _is_flexible(api_key, api_version, "request"):
            hv = 2
        elif api_key == ApiKey.CONTROLLED_SHUTDOWN and api_version == 0:
            hv = 0
        else:
            hv = 1
        _header_versions[key] = hv
    return hv


def response_header_version(api_key: int, api_version: int) -> int:
    """Flexible responses use header v1, others v0; ApiVersionsResponse always v0.

    (A client must read an ApiVersionsResponse before it knows the broker's versions.)
    """
    key = (api_key, api_version, "response")
    hv = _header_versions.get(key)
    if hv is None:
        flexible = _is_flexible(api_key, api_version, "response")
        hv = 1 if flexible and api_key != ApiKey.API_VERSIONS else 0
        _header_versions[key] = hv
    return hv


# The compiled codecs, by message (api key, version, kind) or by named struct (the
# schemas' common structs, e.g. the consumer protocol's): compiled once, then cached.


@cache
def reader_for(api_key: int, api_version: int, kind: str) -> StructReader:
    return compile_reader(message_file(api_key, api_version, kind).spec(), api_version)


@cache
def writer_for(api_key: int, api_version: int, kind: str) -> StructWriter:
    return compile_writer(message_file(api_key, api_version, kind).spec(), api_version)


@cache
def named_reader(name: str, version: int) -> StructReader:
    return compile_reader(registry().file_for(name, version).spec(), version)


@cache
def named_writer(name: str, version: int) -> StructWriter:
    return compile_writer(registry().file_for(name, version).spec(), version)
