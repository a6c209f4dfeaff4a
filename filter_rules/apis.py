"""Kafka API references in rule files: a schema name ("Produce") or a numeric key (0)."""

from __future__ import annotations

import difflib
from functools import cache
from types import MappingProxyType
from typing import Final

import kafka_wire

#: API keys are an int16 on the wire: numeric references must fit.
MAX_API_KEY: Final = 32767


@cache
def api_keys_by_name() -> MappingProxyType[str, int]:
    """Every API kafka_wire knows, by the name of its schema: {"Produce": 0, ...}."""
    names: dict[str, int] = {}
    for key in kafka_wire.known_api_keys():
        name = kafka_wire.api_name(key)
        if name is not None:
            names[name] = key
    return MappingProxyType(names)


def resolve_api(ref: str | int) -> int:
    """The API key a reference names. ValueError, with a suggestion, if there is none.

    A name must be one of Kafka's schema names, spelled exactly ("Produce",
    "CreateTopics"). A number may be any key from 0 to 32767, known or not, so a rule
    can name an API newer than keg's schemas.
    """
    if isinstance(ref, bool):
        raise ValueError(f"an API is a name or a number, not {ref!r}")
    if isinstance(ref, int):
        if not 0 <= ref <= MAX_API_KEY:
            raise ValueError(f"API key {ref} is out of range 0..{MAX_API_KEY}")
        return ref
    if not isinstance(ref, str):
        raise ValueError(f"an API is a name or a number, not {type(ref).__name__}")
    by_name = api_keys_by_name()
    key = by_name.get(ref)
    if key is not None:
        return key
    raise ValueError(f"unknown API '{ref}'{_suggest(ref)}")


def _suggest(ref: str) -> str:
    names = api_keys_by_name()
    folded = {name.lower(): name for name in names}
    exact_case = folded.get(ref.lower().replace("_", "").replace("-", ""))
    if exact_case is not None:
        return f"; did you mean '{exact_case}'?"
    close = difflib.get_close_matches(ref, list(names), n=1, cutoff=0.75)
    if close:
        return f"; did you mean '{close[0]}'?"
    return " (API names are Kafka's schema names, e.g. 'Produce', 'CreateTopics')"
