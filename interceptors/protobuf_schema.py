"""Protobuf schemas given as .proto text (a schema registry's), turned into message classes.

A registry holds Protobuf schemas as .proto source. To read a payload the gateway needs
descriptors: the text (and the files it imports, the schema's references) is compiled
with protoc, the reference compiler, as `grpcio-tools` ships it in-process
(`grpc_tools.protoc`: `--descriptor_set_out --include_imports`, Google's well-known types
included), once per schema id; docs/dependencies.md says why. Each schema gets its own
`DescriptorPool`, so two versions of one message never clash.

The Confluent wire format puts the message indexes between the schema id and the
payload: which message of the file (and of its nested messages) the payload is, as
zigzag varints: a count, then the indexes; a single 0 byte means [0], the first
message of the file.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

MAX_INDEXES: Final = 16  # nesting depth of a message the indexes may name
_PROTOC_LOCK: Final = threading.Lock()  # protoc keeps global state: one compile at a time
_MAIN_FILE: Final = "keg_schema.proto"


class ProtobufSchemaError(ValueError):
    """The .proto text does not compile, or names no message."""


class PayloadError(ValueError):
    """A payload that is not the schema's Protobuf (or has malformed message indexes)."""


def read_message_indexes(data: bytes | memoryview, pos: int) -> tuple[tuple[int, ...], int]:
    """The message indexes at `pos` and where the payload starts."""
    count, pos = _zigzag_varint(data, pos)
    if count == 0:
        return (0,), pos
    if count < 0 or count > MAX_INDEXES:
        raise PayloadError(f"message indexes: bad count {count}")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag_varint(data, pos)
        if index < 0:
            raise PayloadError(f"message indexes: negative index {index}")
        indexes.append(index)
    return tuple(indexes), pos


def _zigzag_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise PayloadError("message indexes run past the end of the value")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise PayloadError("message indexes: varint longer than 10 bytes")


class ProtobufSchema:
    """One .proto file (with the files it imports), compiled: messages by index path."""

    __slots__ = ("_classes", "_file", "_lock")

    def __init__(self, text: str, imports: Mapping[str, str] | None = None) -> None:
        fds = compile_proto(text, imports or {})
        pool = descriptor_pool.DescriptorPool()
        for proto in fds.file:
            try:
                pool.Add(proto)
            except (TypeError, ValueError) as exc:
                raise ProtobufSchemaError(f"descriptor {proto.name}: {exc}") from None
        self._file = pool.FindFileByName(_MAIN_FILE)
        if not self._file.message_types_by_name:
            raise ProtobufSchemaError("the schema defines no message")
        self._classes: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()

    @property
    def first_message(self) -> str:
        return str(self._file.message_types_by_name[
            next(iter(self._file.message_types_by_name))].full_name)

    def message_class(self, indexes: tuple[int, ...]) -> Any:
        """The generated class of the message `indexes` name; PayloadError if none."""
        cls = self._classes.get(indexes)
        if cls is not None:
            return cls
        messages = list(self._file.message_types_by_name.values())
        descriptor = None
        for index in indexes:
            if index >= len(messages):
                raise PayloadError(f"message indexes {list(indexes)} name no message of the "
                                   "schema")
            descriptor = messages[index]
            messages = list(descriptor.nested_types)
        assert descriptor is not None
        with self._lock:
            cls = message_factory.GetMessageClass(descriptor)
            if len(self._classes) < 1024:
                self._classes[indexes] = cls
        return cls

    def full_name(self, indexes: tuple[int, ...]) -> str:
        return str(self.message_class(indexes).DESCRIPTOR.full_name)

    def check(self, data: bytes | memoryview, pos: int) -> str | None:
        """None when the value (message indexes at `pos`, then the payload) parses as the
        message the indexes name; else why not."""
        try:
            indexes, start = read_message_indexes(data, pos)
            self.message_class(indexes).FromString(bytes(data[start:]))
        except PayloadError as exc:
            return str(exc)
        except DecodeError as exc:
            return f"not valid Protobuf: {exc}"
        return None


def compile_proto(text: str, imports: Mapping[str, str]) -> descriptor_pb2.FileDescriptorSet:
    """The FileDescriptorSet of `text` and everything it imports (`imports`: file name ->
    .proto text; Google's well-known types come with grpc_tools). ProtobufSchemaError
    when protoc refuses it (protoc writes its diagnostics to the process's stderr)."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:  # pragma: no cover - a dependency of keg
        raise ProtobufSchemaError("Protobuf schemas need grpcio-tools (pip install "
                                  "grpcio-tools)") from None
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="keg-proto-") as tmp:
        root = Path(tmp)
        for name, source in {**imports, _MAIN_FILE: text}.items():
            path = (root / name).resolve()
            if root.resolve() not in path.parents:
                raise ProtobufSchemaError(f"import name {name!r} leaves the schema's directory")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source, encoding="utf-8")
        out = root / "out.pb"
        with _PROTOC_LOCK:
            status = protoc.main(["protoc", f"-I{root}", f"-I{well_known}",
                                  f"--descriptor_set_out={out}", "--include_imports",
                                  _MAIN_FILE])
        if status != 0 or not out.exists():
            raise ProtobufSchemaError("protoc could not compile the schema (its message is "
                                      "in the gateway's log)")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
