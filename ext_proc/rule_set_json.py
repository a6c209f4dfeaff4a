"""A rule set as JSON, written and read a rule at a time.

`json.dumps`, `json.loads` and pydantic's whole-model calls each hold the GIL from
start to end: over 100,000 rules (40-50 MB) that is seconds during which no other
thread of the process runs -- not the event loop of the data path, whose Envoy closes
connections it waits 2 s for, nor the control plane's REST API. The functions here
produce and read exactly the same JSON as those calls, in pieces of one rule (or one
source) each, so a worker thread doing it gives the loop its turns.

    dumps_rule_set(ruleset)   # == json.dumps(ruleset.model_dump(mode="json",
                              #    by_alias=True), sort_keys=True, separators=(",", ":"))
    loads_pieces(text)        # == json.loads(text), containers near the top read
                              #    element by element
    rule_set_from(data)       # == RuleSet.model_validate(data), a rule at a time
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

from filter_rules import Rule, RuleSet, RuleSource

# Containers down to this depth are read element by element; deeper values (a rule,
# a source) in one call each.
_PIECE_DEPTH: Final = 3
_SPACE: Final = re.compile(r"[ \t\n\r]*")
_decoder: Final = json.JSONDecoder()
_dump: Callable[[Any], str] = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode

if set(RuleSet.model_fields) != {"rules", "sources"}:  # what dumps_rule_set writes
    raise ImportError("RuleSet has fields rule_set_json does not know: "
                      f"{sorted(RuleSet.model_fields)}")


def dumps_rule_set(ruleset: RuleSet) -> bytes:
    """The rule set's JSON, byte for byte what json.dumps of its model_dump gives."""
    rules = ",".join(_dump(rule.model_dump(mode="json", by_alias=True))
                     for rule in ruleset.rules)
    sources = ",".join(f"{_dump(rule_id)}:{_dump(source.model_dump(mode='json', by_alias=True))}"
                       for rule_id, source in sorted(ruleset.sources.items()))
    return f'{{"rules":[{rules}],"sources":{{{sources}}}}}'.encode()


def loads_pieces(text: str | bytes) -> Any:
    """json.loads(text), with the arrays and objects of the first levels read one
    element at a time. ValueError (json.JSONDecodeError) for text that is not JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    value, end = _value(text, _SPACE.match(text, 0).end(), 0)  # type: ignore[union-attr]
    end = _SPACE.match(text, end).end()  # type: ignore[union-attr]
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def rule_set_from(data: Any) -> RuleSet:
    """RuleSet.model_validate(data), validating one rule (one source) per call.
    ValueError (pydantic's ValidationError) when it does not validate."""
    if not isinstance(data, dict):
        return RuleSet.model_validate(data)  # the same error as before
    pieces = dict(data)
    rules, sources = data.get("rules"), data.get("sources")
    if isinstance(rules, list):
        pieces["rules"] = [Rule.model_validate(rule) for rule in rules]
    if isinstance(sources, dict):
        pieces["sources"] = {rule_id: RuleSource.model_validate(source)
                             for rule_id, source in sources.items()}
    # Models are taken as they are: this checks the rest (unknown keys, unique ids).
    return RuleSet.model_validate(pieces)


def _value(text: str, pos: int, depth: int) -> tuple[Any, int]:
    opening = text[pos:pos + 1]
    if depth >= _PIECE_DEPTH or opening not in ("[", "{"):
        return _decoder.raw_decode(text, pos)
    closing = "]" if opening == "[" else "}"
    items: list[Any] = []
    entries: dict[str, Any] = {}
    pos = _skip(text, pos + 1)
    if text[pos:pos + 1] == closing:
        return (items if opening == "[" else entries), pos + 1
    while True:
        if opening == "{":
            key, pos = _decoder.raw_decode(text, pos)
            if not isinstance(key, str):
                raise json.JSONDecodeError("Expecting property name", text, pos)
            pos = _expect(text, _skip(text, pos), ":")
            entries[key], pos = _value(text, _skip(text, pos), depth + 1)
        else:
            item, pos = _value(text, pos, depth + 1)
            items.append(item)
        pos = _skip(text, pos)
        if text[pos:pos + 1] == ",":
            pos = _skip(text, pos + 1)
            continue
        pos = _expect(text, pos, closing)
        return (items if opening == "[" else entries), pos


def _skip(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]


def _expect(text: str, pos: int, char: str) -> int:
    if text[pos:pos + 1] != char:
        raise json.JSONDecodeError(f"Expecting '{char}'", text, pos)
    return pos + 1
