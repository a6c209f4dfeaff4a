"""Rules as the API receives them: one rule as JSON, a rule file, a directory's files.

Everything goes through filter_rules' loader, so errors carry file, line, column and
field exactly as `keg validate` prints them. JSON is read as YAML (its superset) for
line numbers; when the two readings disagree, the errors of the JSON reading (field
paths, no lines) are reported.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from control_plane.api.body_guard import check_json_depth, repeated_key
from control_plane.api.problems import Problem
from filter_rules import Rule, RuleError, RuleSet, RuleSetInvalid, load_rule_data, load_rule_text

BODY: Final = "request body"


def parse_rule(raw: bytes, rule_id: str) -> Rule:
    """One rule from a JSON body; its `id` may be left out (the URL's) or must agree."""
    text = _text(raw, BODY)
    check_json_depth(raw)  # whatever its Content-Type says, this body is read as JSON
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise _invalid(err.lineno, err.colno, "", f"not valid JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise _invalid(1, 1, "", "a rule is a JSON object")
    if (repeated := repeated_key(text)) is not None:
        # The decoder kept the last copy; read as YAML, the text says where the key is.
        field, key = repeated
        raise _with_lines(RuleSetInvalid([RuleError(BODY, None, None, field,
                                                    f"duplicate key {key!r}")]), text,
                          require_id="id" in data) from None
    id_from_url = "id" not in data
    if id_from_url:
        data = {"id": rule_id, **data}
    elif data["id"] != rule_id:
        raise _invalid(None, None, "id",
                       f"the rule's id {data['id']!r} is not the URL's {rule_id!r}")
    try:
        ruleset = load_rule_data([data], BODY)
    except RuleSetInvalid as err:
        raise _with_lines(err, text, require_id=not id_from_url) from None
    return ruleset.rules[0]


def _with_lines(plain: RuleSetInvalid, text: str, require_id: bool) -> RuleSetInvalid:
    """The same errors with line and column, read from the JSON text as YAML. Without
    `require_id` the text leaves the id out (the URL gives it): the YAML reading's
    complaint about the missing id is not one of `plain`'s."""
    located: tuple[RuleError, ...] = ()
    try:
        load_rule_text(f"[{text}]", BODY)  # a list of one rule; line 1 is one column off
    except RuleSetInvalid as err:
        located = tuple(e for e in err.errors
                        if require_id or _unwrap(e).field_path != "id")
    if [_unwrap(e).field_path for e in located] != [_unwrap(e).field_path for e in plain.errors]:
        located = plain.errors
    return RuleSetInvalid(_unwrap(e) for e in located)


def _unwrap(error: RuleError) -> RuleError:
    field = error.field_path
    if field.startswith("rules[0]"):
        field = field.removeprefix("rules[0]").removeprefix(".")
    column = error.column
    if error.line == 1 and column is not None and column > 1:
        column -= 1
    return RuleError(error.file, error.line, column, field, error.message)


def parse_rule_file(raw: bytes, name: str = BODY) -> RuleSet:
    """A rule file's content (YAML, or JSON): RuleSetInvalid with every problem."""
    return load_rule_text(_text(raw, name), name)


def parse_files(files: Mapping[str, str]) -> RuleSet:
    """A rule directory's files (name -> content), in name order, as `load_rule_dir`
    reads a directory: rule ids must be unique across the files."""
    rules = []
    sources = {}
    errors: list[RuleError] = []
    first: dict[str, str] = {}
    for name in sorted(files):
        try:
            part = load_rule_text(files[name], name)
        except RuleSetInvalid as err:
            errors.extend(err.errors)
            continue
        for rule in part.rules:
            source = part.sources[rule.id]
            if rule.id in first:
                errors.append(RuleError(source.file, source.line, source.column, "id",
                                        f"duplicate rule id '{rule.id}' (first defined at "
                                        f"{first[rule.id]})"))
                continue
            first[rule.id] = str(source)
            rules.append(rule)
            sources[rule.id] = source
    if errors:
        raise RuleSetInvalid(errors)
    return RuleSet(rules=rules, sources=sources)


# Reading and checking a large rule input costs seconds of CPU (an 8 MiB file of 94,000
# rules took 57 s), all of it holding the GIL: four at once took 200 s each and slowed
# every other request of the API (/healthz answered in 3.7 s). One large input is read
# at a time; another meanwhile is answered 429 with Retry-After.
LARGE_INPUT_BYTES: Final = 256 << 10
_LARGE_INPUT = threading.Semaphore(1)


@contextmanager
def reading(size: int) -> Iterator[None]:
    """Around the reading and checking of an input of `size` bytes: Problem 429 while
    another large one is being read."""
    if size < LARGE_INPUT_BYTES:
        yield
        return
    if not _LARGE_INPUT.acquire(blocking=False):
        raise Problem(429, "Too Many Requests", "another large rule input is being read; "
                      "send this one again in a few seconds", kind="busy",
                      headers={"Retry-After": "5"})
    try:
        yield
    finally:
        _LARGE_INPUT.release()


def parse_ruleset_value(value: Any, name: str = BODY) -> RuleSet:
    """A rule set given inside a JSON request: YAML/JSON text, a document or a list."""
    if isinstance(value, str):
        return load_rule_text(value, name)
    return load_rule_data(value, name)


def _text(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise RuleSetInvalid([RuleError(name, None, None, "",
                                        f"not valid UTF-8 at byte {err.start}")]) from None


def _invalid(line: int | None, column: int | None, field: str, message: str) -> RuleSetInvalid:
    return RuleSetInvalid([RuleError(BODY, line, column, field, message)])
