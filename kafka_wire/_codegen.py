"""Compile one schema at one version into a reader and a writer function.

The schema is interpreted once: this module writes the Python source of one function
per struct (`_r<n>(buf, off) -> (dict, off)` and `_w<n>(out, value) -> None`), with
consecutive fixed-size fields read and written by a single precompiled struct.Struct,
and execs it. `tools/codec_source.py` prints the generated source.

Tagged fields follow Kafka's rules: a decoded struct holds every field of its version
(absent tagged fields take their default), and a tagged field is written only when it
differs from its default. Tags the schema does not know stay as raw bytes under
"_unknown_tags" and are written back in tag order among the known ones.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka_wire import _prims
from kafka_wire._schema import FieldSpec, MessageSpec, StructSpec, in_versions
from kafka_wire.errors import DecodeError, EncodeError

StructReader = Callable[[Any, int], tuple[dict[str, Any], int]]
StructWriter = Callable[[bytearray, Any], None]

_FIXED = {
    "bool": "?",
    "int8": "b",
    "int16": "h",
    "uint16": "H",
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "float64": "d",
}
_INTS = frozenset({"int8", "int16", "uint16", "int32", "uint32", "int64"})

_MISSING = object()

_BASE_NS: dict[str, Any] = {
    "_DE": DecodeError,
    "_EE": EncodeError,
    "_I16": _prims.INT16,
    "_I32": _prims.INT32,
    "_ruv": _prims.read_uvarint,
    "_uv": _prims.uvarint,
    "_UV1": _prims.UV1,
    "_to_uuid": _prims.to_uuid,
    "_ub": _prims.uuid_bytes,
    "_rec": _prims.records_slice,
    "_rfa": _prims.read_fixed_array,
    "_pfa": _prims.pack_fixed_array,
    "_rtags": _prims.read_tags,
    "_wtags": _prims.write_tags,
    "_MISSING": _MISSING,
    "_ED": {},
}


@dataclass(frozen=True, slots=True)
class _Ty:
    """A field's type resolved at one version."""

    kind: str  # fixed, uuid, string, bytes, records, array, struct
    code: str = ""  # struct-module code of a fixed type
    nullable: bool = False
    compact: bool = False
    elem: _Ty | None = None
    struct: StructSpec | None = None


def field_default(f: FieldSpec, version: int) -> Any:
    """Kafka's default for a scalar field; containers are handled by the callers."""
    raw = f.default
    nullable = in_versions(version, f.nullable)
    t = f.type
    if t.startswith("[]"):
        return None if raw == "null" and nullable else []
    if t in _INTS:
        if raw is None or raw == "":
            return 0
        text = str(raw).strip().lower()
        neg = text.startswith("-")
        digits = text.lstrip("-")
        value = int(digits, 16) if digits.startswith("0x") else int(digits)
        return -value if neg else value
    if t == "float64":
        return float(raw) if raw not in (None, "") else 0.0
    if t == "bool":
        return raw is True or str(raw).lower() == "true"
    if t == "string":
        if raw == "null":
            return None if nullable else ""
        return "" if raw is None else str(raw)
    if t in ("bytes", "records"):
        return None if nullable and (raw == "null" or t == "records") else b""
    if t == "uuid":
        return _prims.ZERO_UUID
    # A struct: None when null by default, else the caller builds the default struct.
    return None if raw == "null" and nullable else _MISSING


def _fixed_size(code: str) -> int:
    return struct.calcsize(">" + code)


class _Compiler:
    def __init__(self, msg: MessageSpec, version: int) -> None:
        self.msg = msg
        self.version = version
        self.flexible = in_versions(version, msg.flexible)
        self.where = f"{msg.name} v{version}"
        self.ns: dict[str, Any] = dict(_BASE_NS)
        self.src: list[str] = []
        self.counter = 0
        self.readers: dict[int, str] = {}
        self.writers: dict[int, str] = {}
        self.min_sizes: dict[int, int] = {}
        # Bound after exec, when the generated functions exist:
        # (const name, struct writer name) of default struct encodings, and
        # (const name, {tag: (field name, reader name)}) of tag tables.
        self.default_encodings: list[tuple[str, str]] = []
        self.tag_tables: list[tuple[str, dict[int, tuple[str, str]]]] = []

    # -- helpers ---------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def struct_function(self, names: dict[int, str], s: StructSpec,
                        prefix: str) -> tuple[str, bool]:
        """The name of the reader or writer (`names`, `prefix`) of struct `s`, and whether
        it is new (then the caller generates it). A struct is named before its body is
        generated, so a struct holding itself refers to its own function."""
        name = names.get(id(s))
        if name is not None:
            return name, False
        name = names[id(s)] = self.fresh(prefix)
        return name, True

    def const(self, value: Any, prefix: str = "_k") -> str:
        name = self.fresh(prefix)
        self.ns[name] = value
        return name

    def short_arrays(self, code: str) -> str:
        name = "_SA_" + code.replace("?", "o")
        self.ns[name] = _prims.short_array_structs(code)
        return name

    def packer(self, codes: str) -> str:
        """A namespace name bound to struct.Struct(">" + codes), shared by equal formats."""
        name = "_S_" + codes.replace("?", "o").replace("16s", "U")
        if name not in self.ns:
            self.ns[name] = struct.Struct(">" + codes)
        return name

    def ty(self, f: FieldSpec) -> _Ty:
        v = self.version
        compact = self.flexible if f.flexible is None else in_versions(v, f.flexible)
        nullable = in_versions(v, f.nullable)
        elem = f.elem_type
        if f.is_array:
            item = self._elem_ty(elem, f, compact)
            return _Ty("array", nullable=nullable, compact=compact, elem=item)
        return self._elem_ty(elem, f, compact, nullable)

    def _elem_ty(self, t: str, f: FieldSpec, compact: bool, nullable: bool = False) -> _Ty:
        if t in _FIXED:
            return _Ty("fixed", code=_FIXED[t])
        if t == "uuid":
            return _Ty("uuid", code="16s")
        if t in ("string", "bytes", "records"):
            return _Ty(t, nullable=nullable, compact=compact)
        return _Ty("struct", nullable=nullable, compact=compact, struct=f.struct)

    def default_expr(self, f: FieldSpec, ty: _Ty, for_write: bool) -> str:
        value = field_default(f, self.version)
        if ty.kind == "array":
            if value is None:
                return "None"
            return "()" if for_write else "[]"
        if ty.kind == "struct":
            if value is None:
                return "None"
            if for_write:
                return "_ED"
            assert f.struct is not None
            return self.struct_default_expr(f.struct)
        if isinstance(value, (bool, int, str)) or value is None:
            return repr(value)
        return self.const(value)  # floats (repr(inf) is no literal), uuids, bytes

    def struct_default_expr(self, s: StructSpec) -> str:
        items = []
        for sub in s.fields:
            if sub.present(self.version):
                items.append(f"{sub.name!r}: {self.default_expr(sub, self.ty(sub), False)}")
        return "{" + ", ".join(items) + "}"

    def min_size(self, ty: _Ty) -> int:
        """The fewest bytes a value of this type takes, for array count checks."""
        if ty.kind in ("fixed", "uuid"):
            return _fixed_size(ty.code)
        if ty.kind == "string":
            return 1 if ty.compact else 2
        if ty.kind == "struct":
            assert ty.struct is not None
            size = self.struct_min_size(ty.struct)
            return 1 if ty.nullable else size
        return 1 if ty.compact else 4  # bytes, records, arrays

    def struct_min_size(self, s: StructSpec) -> int:
        key = id(s)
        if key not in self.min_sizes:
            size = 1 if self.flexible else 0
            for f in s.fields:
                if f.present(self.version) and not f.is_tagged(self.version):
                    size += self.min_size(self.ty(f))
            self.min_sizes[key] = size
        return self.min_sizes[key]

    # -- readers ---------------------------------------------------------------------

    def read_len(self, ty: _Ty, var: str, wide: bool) -> list[str]:
        """Lines reading a length into `var`; -1 (or less, non-compact) means null."""
        if ty.compact:
            return [
                f"{var} = buf[off]",
                "off += 1",
                f"if {var} & 0x80: {var}, off = _ruv(buf, off, {var})",
                f"{var} -= 1",
            ]
        if wide:
            return [f"{var}, = _I32.unpack_from(buf, off)", "off += 4"]
        return [f"{var}, = _I16.unpack_from(buf, off)", "off += 2"]

    def read_null(self, ty: _Ty, var: str, target: str, label: str) -> list[str]:
        """Lines for the `if var < 0:` branch, before an `else:` reading the value."""
        if ty.nullable:
            return [
                f"if {var} < 0:",
                f"    if {var} != -1: raise _DE({label!r} + ': bad length ' + str({var}))",
                f"    {target} = None",
            ]
        return [f"if {var} < 0:", f"    raise _DE({label!r} + ': null in a non-nullable field')"]

    def read_value(self, ty: _Ty, target: str, label: str, depth: int) -> list[str]:
        n = f"n{depth}"
        if ty.kind == "fixed":
            s = self.packer(ty.code)
            return [f"{target}, = {s}.unpack_from(buf, off)", f"off += {_fixed_size(ty.code)}"]
        if ty.kind == "uuid":
            return [f"{target} = _to_uuid(bytes(buf[off:off + 16]))", "off += 16"]
        if ty.kind == "struct":
            assert ty.struct is not None
            fn = self.reader(ty.struct)
            if not ty.nullable:
                return [f"{target}, off = {fn}(buf, off)"]
            m = f"m{depth}"
            return [
                f"{m} = buf[off]",
                "off += 1",
                f"if {m} == 255: {target} = None",
                f"elif {m} == 1: {target}, off = {fn}(buf, off)",
                f"else: raise _DE({label!r} + ': bad null marker ' + str({m}))",
            ]
        lines = self.read_len(ty, n, wide=ty.kind != "string")
        lines += self.read_null(ty, n, target, label)
        if ty.kind == "string":
            body = [f"{target} = str(buf[off:off + {n}], 'utf-8')", f"off += {n}"]
        elif ty.kind == "bytes":
            body = [f"{target} = bytes(buf[off:off + {n}])", f"off += {n}"]
        elif ty.kind == "records":
            body = [f"{target} = _rec(buf, off, off + {n})", f"off += {n}"]
        else:
            body = self.read_array_items(ty, target, label, depth)
        if not ty.nullable:  # the null branch raised
            return lines + body
        return [*lines, "else:", *("    " + line for line in body)]

    def read_array_items(self, ty: _Ty, target: str, label: str, depth: int) -> list[str]:
        n = f"n{depth}"
        elem = ty.elem
        assert elem is not None
        size = max(self.min_size(elem), 1)
        # A hostile count must not make the loop (or array) run past the bytes left.
        check = [
            f"if {n} * {size} > len(buf) - off:",
            f"    raise _DE({label!r} + ': ' + str({n}) + ' elements cannot fit')",
        ]
        if elem.kind == "fixed":
            # Short arrays (replica lists) through a precompiled Struct per length, which
            # checks the bounds itself.
            table = self.short_arrays(elem.code)
            return [
                f"if {n} < {_prims.SHORT_ARRAY}:",
                f"    {target} = [*{table}[{n}].unpack_from(buf, off)]",
                "else:",
                *("    " + line for line in check),
                f"    {target} = _rfa(buf, off, {n}, {elem.code!r})",
                f"off += {n} * {size}",
            ]
        lines = check
        if elem.kind == "uuid":
            return [
                *lines,
                f"{target} = [_to_uuid(bytes(buf[o:o + 16]))",
                f"    for o in range(off, off + 16 * {n}, 16)]",
                f"off += 16 * {n}",
            ]
        e = f"e{depth}"
        lines += [f"{target} = []", f"for _ in range({n}):"]
        lines += ["    " + line for line in self.read_value(elem, e, label, depth + 1)]
        lines.append(f"    {target}.append({e})")
        return lines

    def reader(self, s: StructSpec) -> str:
        fn, new = self.struct_function(self.readers, s, "_r")
        if not new:
            return fn
        v = self.version
        body: list[str] = []
        entries: list[str] = []
        tagged: dict[int, tuple[str, str]] = {}
        group: list[tuple[str, str]] = []  # (local, code) of consecutive fixed fields

        def flush() -> None:
            if not group:
                return
            codes = "".join(code for _, code in group)
            s_name = self.packer(codes)
            names = ", ".join(local for local, _ in group)
            body.append(f"{names}, = {s_name}.unpack_from(buf, off)")
            body.append(f"off += {struct.calcsize('>' + codes)}")
            for local, code in group:
                if code == "16s":
                    body.append(f"{local} = _to_uuid({local})")
            group.clear()

        for i, f in enumerate(s.fields):
            if not f.present(v):
                continue
            ty = self.ty(f)
            label = f"{self.where} {s.name}.{f.name}"
            if f.is_tagged(v):
                assert f.tag is not None
                entries.append(f"{f.name!r}: {self.default_expr(f, ty, False)}")
                tagged[f.tag] = (f.name, self.tag_reader(ty, label))
                continue
            local = f"f{i}"
            entries.append(f"{f.name!r}: {local}")
            if ty.kind in ("fixed", "uuid"):
                group.append((local, ty.code))
                continue
            flush()
            body += self.read_value(ty, local, label, 0)
        flush()
        body.append("d = {" + ", ".join(entries) + "}")
        if self.flexible:
            known = "None"
            if tagged:
                known = self.fresh("_K")
                self.tag_tables.append((known, tagged))
            body += [
                "t = buf[off]",
                "off += 1",
                "if t:",
                "    if t & 0x80: t, off = _ruv(buf, off, t)",
                f"    off = _rtags(buf, off, t, d, {known})",
            ]
        body.append("return d, off")
        self.emit(fn, "buf, off", body)
        return fn

    def tag_reader(self, ty: _Ty, label: str) -> str:
        fn = self.fresh("_t")
        body = self.read_value(ty, "v", label, 0)
        body.append("return v, off")
        self.emit(fn, "buf, off", body)
        return fn

    # -- writers ---------------------------------------------------------------------

    def write_len(self, ty: _Ty, out: str, length: str, wide: bool) -> list[str]:
        if ty.compact:
            return [
                f"n = {length} + 1",
                f"{out} += _UV1[n] if n < 128 else _uv(n)",
            ]
        packer = "_I32" if wide else "_I16"
        return [f"{out} += {packer}.pack({length})"]

    def write_null(self, ty: _Ty, out: str, label: str) -> str:
        if not ty.nullable:
            return f"raise _EE({label!r} + ': None in a non-nullable field')"
        if ty.compact:
            return f"{out} += b'\\x00'"
        minus_one = b"\xff\xff" if ty.kind == "string" else b"\xff\xff\xff\xff"
        return f"{out} += {minus_one!r}"

    def write_value(self, ty: _Ty, x: str, out: str, label: str, depth: int) -> list[str]:
        if ty.kind == "fixed":
            return [f"{out} += {self.packer(ty.code)}.pack({x})"]
        if ty.kind == "uuid":
            return [f"{out} += _ub({x})"]
        if ty.kind == "struct":
            assert ty.struct is not None
            fn = self.writer(ty.struct)
            if not ty.nullable:
                return [f"{fn}({out}, {x})"]
            return [
                f"if {x} is None: {out} += b'\\xff'",
                "else:",
                f"    {out} += b'\\x01'",
                f"    {fn}({out}, {x})",
            ]
        lines = [f"if {x} is None:", "    " + self.write_null(ty, out, label), "else:"]
        if ty.kind == "string":
            b = f"b{depth}"
            body = [f"{b} = {x}.encode('utf-8')"]
            body += self.write_len(ty, out, f"len({b})", wide=False)
            body.append(f"{out} += {b}")
        elif ty.kind in ("bytes", "records"):
            body = self.write_len(ty, out, f"len({x})", wide=True)
            body.append(f"{out} += {x}")
        else:
            k = f"k{depth}"
            body = [f"{k} = len({x})", *self.write_len(ty, out, k, wide=True)]
            elem = ty.elem
            assert elem is not None
            if elem.kind == "fixed":
                table = self.short_arrays(elem.code)
                body.append(
                    f"{out} += {table}[{k}].pack(*{x}) if {k} < {_prims.SHORT_ARRAY} "
                    f"else _pfa({elem.code!r}, {x})"
                )
            else:
                y = f"y{depth}"
                body.append(f"for {y} in {x}:")
                body += ["    " + line for line in self.write_value(elem, y, out, label, depth + 1)]
        return lines + ["    " + line for line in body]

    def writer(self, s: StructSpec) -> str:
        fn, new = self.struct_function(self.writers, s, "_w")
        if not new:
            return fn
        v = self.version
        body = ["g = v.get"]
        group: list[tuple[str, str]] = []  # (value expression, code)
        tagged: list[tuple[int, FieldSpec, _Ty]] = []

        def flush() -> None:
            if not group:
                return
            codes = "".join(code for _, code in group)
            s_name = self.packer(codes)
            body.append(f"out += {s_name}.pack({', '.join(expr for expr, _ in group)})")
            group.clear()

        for f in s.fields:
            label = f"{self.where} {s.name}.{f.name}"
            if not f.present(v):
                flush()
                body += self.absent_check(f, label)
                continue
            ty = self.ty(f)
            if f.is_tagged(v):
                assert f.tag is not None
                tagged.append((f.tag, f, ty))
                continue
            get = f"g({f.name!r}, {self.default_expr(f, ty, True)})"
            if ty.kind == "fixed":
                group.append((get, ty.code))
            elif ty.kind == "uuid":
                group.append((f"_ub({get})", ty.code))
            else:
                flush()
                body.append(f"x = {get}")
                body += self.write_value(ty, "x", "out", label, 0)
        flush()
        if self.flexible:
            body += self.write_tag_section(sorted(tagged, key=lambda t: t[0]))
        self.emit(fn, "out, v", body)
        return fn

    def absent_check(self, f: FieldSpec, label: str) -> list[str]:
        """Kafka refuses to drop a non-default, non-ignorable field the version lacks."""
        if f.ignorable or (f.struct is not None and not f.is_array):
            return []
        # The default at the field's first version: absent versions have no nullability.
        default = field_default(f, f.versions[0])
        differs = "x" if f.is_array else f"x != {self.const(default)}"  # "x": a non-empty list
        return [
            f"x = g({f.name!r}, _MISSING)",
            f"if x is not _MISSING and x is not None and {differs}:",
            f"    raise _EE({label + ' is not in this version and not ignorable'!r})",
        ]

    def write_tag_section(self, tagged: list[tuple[int, FieldSpec, _Ty]]) -> list[str]:
        if not tagged:
            return [
                f"ut = g({_prims.UNKNOWN_TAGS!r})",
                "if ut: _wtags(out, None, ut)",
                "else: out += b'\\x00'",
            ]
        lines = ["tg = []"]
        for tag, f, ty in tagged:
            label = f"{self.where} {f.name}"
            lines.append(f"x = g({f.name!r}, {self.default_expr(f, ty, True)})")
            write = self.write_value(ty, "x", "t", label, 0)
            if ty.kind == "struct" and field_default(f, self.version) is not None:
                # A struct is default when it encodes like the default struct.
                assert ty.struct is not None
                enc = self.fresh("_D")
                self.default_encodings.append((enc, self.writer(ty.struct)))
                lines += ["t = bytearray()", *write, f"if t != {enc}: tg.append(({tag}, t))"]
            else:
                if ty.kind == "array" and field_default(f, self.version) == []:
                    differs = "x is None or len(x) != 0"
                elif ty.kind == "array":
                    differs = "x is not None"
                else:
                    differs = f"x != {self.default_expr(f, ty, False)}"
                lines += [f"if {differs}:", "    t = bytearray()"]
                lines += ["    " + line for line in write]
                lines.append(f"    tg.append(({tag}, t))")
        reserved = self.const(frozenset(tag for tag, _, _ in tagged))
        lines += [
            f"ut = g({_prims.UNKNOWN_TAGS!r})",
            f"if tg or ut: _wtags(out, tg, ut, {reserved})",
            "else: out += b'\\x00'",
        ]
        return lines

    # -- assembly --------------------------------------------------------------------

    def emit(self, fn: str, args: str, body: list[str]) -> None:
        self.src.append(f"def {fn}({args}):\n" + "\n".join("    " + line for line in body))

    def source(self) -> str:
        return "\n\n".join(self.src) + "\n"

    def run(self) -> dict[str, Any]:
        exec(compile(self.source(), f"<kafka_wire {self.where}>", "exec"), self.ns)
        for known, table in self.tag_tables:
            self.ns[known] = {tag: (name, self.ns[r]) for tag, (name, r) in table.items()}
        for enc, writer in self.default_encodings:
            out = bytearray()
            self.ns[writer](out, {})
            self.ns[enc] = bytes(out)
        return self.ns


def compile_reader(msg: MessageSpec, version: int) -> StructReader:
    c = _Compiler(msg, version)
    fn = c.reader(msg.struct)
    reader: StructReader = c.run()[fn]
    return reader


def compile_writer(msg: MessageSpec, version: int) -> StructWriter:
    c = _Compiler(msg, version)
    fn = c.writer(msg.struct)
    writer: StructWriter = c.run()[fn]
    return writer


def generated_source(msg: MessageSpec, version: int) -> str:
    """The Python source of the reader and writer, for tools and debugging."""
    c = _Compiler(msg, version)
    c.reader(msg.struct)
    c.writer(msg.struct)
    return c.source()
