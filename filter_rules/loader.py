"""Load rule files into a RuleSet, or report every problem with its file:line:column.

A rule directory holds `*.yaml` / `*.yml` files (not its subdirectories, not hidden
files), read in name order. A file holds one or more YAML documents; each is either
a mapping `{apiVersion: keg/v1, kind: RuleSet, rules: [...]}` or a bare list of rules.
An empty file or document holds no rules. A rule file is a regular file (a symlink to
one is fine) of at most MAX_FILE_BYTES: a FIFO, a device or a directory named `*.yaml`
is an error of its own (filter_rules.files), never read.

Whatever the input, these functions return a RuleSet or raise RuleSetInvalid, never
anything else: YAML, decoding, I/O and validation errors are all translated.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from filter_rules import _yaml, model
from filter_rules._base import _Model
from filter_rules.diagnostics import RuleError, RuleSetInvalid
from filter_rules.files import MAX_FILE_BYTES, read_regular_file
from filter_rules.model import ACTION_KINDS, Rule, RuleFile, RuleSet, RuleSource

#: The rule files keg loads when given no directory: `filter_rules/rules/`.
DEFAULT_RULES_DIR: Final = Path(__file__).resolve().parent / "rules"
RULE_FILE_SUFFIXES: Final = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class _Loaded:
    rule: Rule | None  # None: a rule of a document that did not validate (its id alone)
    source: RuleSource
    field_path: str  # "rules[3]"
    rule_id: str


def load_rule_dir(path: str | os.PathLike[str] | None = None) -> RuleSet:
    """Every rule of the rule files in `path` (default: DEFAULT_RULES_DIR).

    Raises RuleSetInvalid listing every problem of every file, and rule ids used twice
    (across files too), with the location of both.
    """
    directory = Path(path) if path is not None else DEFAULT_RULES_DIR
    name = str(directory)
    try:
        if not directory.exists():
            raise RuleSetInvalid([RuleError(name, None, None, "", "rule directory does not exist")])
        if not directory.is_dir():
            raise RuleSetInvalid([RuleError(name, None, None, "", "not a directory")])
        files = sorted(
            entry
            for entry in directory.iterdir()
            if entry.suffix in RULE_FILE_SUFFIXES and not entry.name.startswith(".")
        )
    except OSError as exc:
        raise RuleSetInvalid([RuleError(name, None, None, "", _os_message(exc))]) from None
    loaded: list[_Loaded] = []
    errors: list[RuleError] = []
    for file in files:
        _load_path(file, loaded, errors)
    return _assemble(loaded, errors)


def load_rule_file(path: str | os.PathLike[str]) -> RuleSet:
    """The rules of one file; RuleSetInvalid with every problem."""
    loaded: list[_Loaded] = []
    errors: list[RuleError] = []
    _load_path(Path(path), loaded, errors)
    return _assemble(loaded, errors)


def load_rule_text(text: str | bytes, source_name: str = "<text>") -> RuleSet:
    """The rules of one file's content; errors name `source_name` as the file."""
    loaded: list[_Loaded] = []
    errors: list[RuleError] = []
    _load_text(text, source_name, loaded, errors)
    return _assemble(loaded, errors)


def load_rule_data(data: Any, source_name: str = "<data>") -> RuleSet:
    """The rules of an already-parsed document (a dict or list, e.g. from JSON).

    Errors carry field paths but no line numbers.
    """
    loaded: list[_Loaded] = []
    errors: list[RuleError] = []
    document = _yaml.Document(data=data, start=(1, 1))
    if isinstance(data, list):
        document.data = {"rules": data}
    try:
        _validate(document, source_name, loaded, errors, lines=False)
    except Exception as exc:  # pragma: no cover - the last safety net, see _load_text
        errors.append(_internal(source_name, exc))
    return _assemble(loaded, errors)


# --- one file ----------------------------------------------------------------------


def _load_path(path: Path, loaded: list[_Loaded], errors: list[RuleError]) -> None:
    name = str(path)
    try:
        # A regular file only, at most MAX_FILE_BYTES of it: a FIFO would block the
        # reload forever, /dev/zero (st_size 0) never end.
        raw = read_regular_file(path, MAX_FILE_BYTES)
    except OSError as exc:  # UnusableFile too: "cannot read: not a regular file (a FIFO)"
        errors.append(RuleError(name, None, None, "", _os_message(exc)))
        return
    _load_text(raw, name, loaded, errors)


def _load_text(
    text: str | bytes, name: str, loaded: list[_Loaded], errors: list[RuleError]
) -> None:
    try:
        if isinstance(text, bytes):
            text = _decode(text)
        for document in _yaml.documents(text):
            if document.problems:
                errors.extend(
                    RuleError(name, p.line, p.column, format_path(p.path), p.message)
                    for p in document.problems
                )
                continue
            _validate(document, name, loaded, errors, lines=True)
    except _yaml.YamlProblem as problem:
        errors.append(RuleError(name, problem.line, problem.column, "", problem.message))
    except RecursionError:
        errors.append(RuleError(name, None, None, "", "document is nested too deeply"))
    except Exception as exc:  # the last safety net: the loader raises RuleSetInvalid only
        errors.append(_internal(name, exc))


def _internal(name: str, exc: Exception) -> RuleError:
    return RuleError(
        name, None, None, "", f"internal error while loading (please report): "
        f"{type(exc).__name__}: {exc}"
    )


class _DecodeProblem(_yaml.YamlProblem):
    pass


def _decode(raw: bytes) -> str:
    encoding = "utf-16" if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8-sig"
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        if encoding != "utf-8-sig":
            raise _DecodeProblem(f"not valid UTF-16: {exc.reason}") from None
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before) - (before.rfind(b"\n") + 1) + 1
        raise _DecodeProblem(
            f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}", line, column
        ) from None


def _os_message(exc: OSError) -> str:
    return f"cannot read: {exc.strerror or exc}"


# --- validation and error translation ----------------------------------------------


def _validate(
    document: _yaml.Document,
    name: str,
    loaded: list[_Loaded],
    errors: list[RuleError],
    *,
    lines: bool,
) -> None:
    data = document.data
    if data is None:
        return
    if not isinstance(data, dict):
        line, column = document.start if lines else (None, None)
        errors.append(RuleError(
            name, line, column, "",
            "a rule file holds a mapping (apiVersion, kind, rules) or a list of rules, "
            f"not {_describe(data)}",
        ))
        return
    def source_of(index: int) -> RuleSource:
        if not lines:
            return RuleSource(file=name)
        line, column = document.locate(("rules", index, "id"))
        return RuleSource(file=name, line=line, column=column)

    try:
        parsed = RuleFile.model_validate(data)
    except ValidationError as exc:
        errors.extend(_translate(error, document, name, lines) for error in exc.errors())
        # Its ids still count: a duplicate among them is reported with the other errors,
        # not only once they are fixed.
        raw = data.get("rules")
        for index, entry in enumerate(raw if isinstance(raw, list) else ()):
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                loaded.append(_Loaded(None, source_of(index), f"rules[{index}]", entry["id"]))
        return
    for index, rule in enumerate(parsed.rules):
        loaded.append(_Loaded(rule, source_of(index), f"rules[{index}]", rule.id))


def _translate(error: ErrorDetails, document: _yaml.Document, name: str, lines: bool) -> RuleError:
    loc = _strip_tags(tuple(error["loc"]))
    line: int | None
    column: int | None
    if lines:
        line, column = document.locate(loc)
    else:
        line = column = None
    return RuleError(name, line, column, format_path(loc), _message(error, loc))


def _strip_tags(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Drop the tag pydantic inserts for the action union: action.deny.deny -> action.deny."""
    out: list[str | int] = []
    for index, element in enumerate(loc):
        if (
            element in ACTION_KINDS
            and index + 1 < len(loc)
            and loc[index + 1] == element
        ):
            continue
        out.append(element)
    return tuple(out)


def format_path(loc: tuple[str | int, ...]) -> str:
    """("rules", 0, "match", "topics") -> "rules[0].match.topics"."""
    text = ""
    for element in loc:
        if isinstance(element, int):
            text += f"[{element}]"
        else:
            text += f".{element}" if text else str(element)
    return text


def _message(error: ErrorDetails, loc: tuple[str | int, ...]) -> str:
    kind = error["type"]
    field = str(loc[-1]) if loc else ""
    if kind == "missing":
        return f"missing required field '{field}'"
    if kind == "string_pattern_mismatch" and field == "id":
        return (
            "a rule id is lowercase letters, digits, '.', '_' and '-', starting with a letter "
            f"or digit ([a-z0-9][a-z0-9._-]*), got {_describe(error.get('input'))}"
        )
    if kind == "extra_forbidden":
        # (a name valid elsewhere, `topic` of a route, is no hint for `match.topic`)
        others = [name for name in _field_names() if name != field]
        close = difflib.get_close_matches(field, others, n=1, cutoff=0.7)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown field '{field}'{hint}"
    message = error["msg"]
    if kind in ("value_error", "assertion_error"):
        return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = error.get("input")
    expected = _EXPECTED.get(kind)
    if expected is not None:
        hint = ""
        if value is None and expected in ("a mapping", "a list"):
            hint = " (write {} for an empty one)" if expected == "a mapping" else " (write [])"
        return f"expected {expected}, got {_describe(value)}{hint}"
    return f"{message}, got {_describe(value)}"


_EXPECTED: Final = {
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "list_type": "a list",
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
}


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean; quote it to make it a string)"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})" if not isinstance(value, str) else text


@cache
def _field_names() -> tuple[str, ...]:
    """Every field name a rule file may use: those of every rule model, wherever it is
    defined (only filter_rules.model's were: `mask: {methd: hash}` got no hint)."""
    names: set[str] = set()
    for value in vars(model).values():
        if isinstance(value, type) and issubclass(value, BaseModel):
            for field_name, info in value.model_fields.items():
                names.add(info.alias or field_name)
    pending: list[type[BaseModel]] = [_Model]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        names.update(info.alias or name for name, info in cls.model_fields.items())
    return tuple(sorted(names))


# --- locations after loading --------------------------------------------------------


def locate_in_rule(source: RuleSource, path: tuple[str | int, ...]) -> RuleSource:
    """Where a field of a loaded rule was written: `path` leads from the rule (written
    at `source`, the position of its `id`) to the field, e.g. ("action", "encrypt",
    "key", "secret", "env"). For problems found after loading (a key that is not set).

    The loader keeps no positions, so the file is read again; when it cannot be, or no
    longer holds that rule there, the rule's own position is the answer.
    """
    if source.line is None:
        return source
    try:
        text = _decode(read_regular_file(source.file, MAX_FILE_BYTES))
        documents = list(_yaml.documents(text))
    except (OSError, _yaml.YamlProblem, RecursionError):
        return source
    for document in documents:
        rules = document.data.get("rules") if isinstance(document.data, dict) else None
        for index in range(len(rules) if isinstance(rules, list) else 0):
            if document.positions.get(("rules", index, "id")) == (source.line, source.column):
                line, column = document.locate(("rules", index, *path))
                return RuleSource(file=source.file, line=line, column=column)
    return source


# --- the set -----------------------------------------------------------------------


def _assemble(loaded: list[_Loaded], errors: list[RuleError]) -> RuleSet:
    first: dict[str, _Loaded] = {}
    for item in loaded:
        previous = first.get(item.rule_id)
        if previous is None:
            first[item.rule_id] = item
            continue
        errors.append(RuleError(
            item.source.file, item.source.line, item.source.column, f"{item.field_path}.id",
            f"duplicate rule id '{item.rule_id}' (first defined at {previous.source})",
        ))
    rules = [item.rule for item in loaded if item.rule is not None]
    if errors or len(rules) < len(loaded):
        raise RuleSetInvalid(errors)
    return RuleSet(rules=rules, sources={item.rule_id: item.source for item in loaded})
