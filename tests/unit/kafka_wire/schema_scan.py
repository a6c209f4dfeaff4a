"""Scan Kafka's raw JSON schemas, independently of kafka_wire's compiled walks.

Generated tests use this as their oracle: what the schema file itself says a message
version holds, found without the code under test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kafka_wire._catalog import message_file
from kafka_wire._schema import in_versions, parse_versions, strip_comments

FieldTest = Callable[[dict[str, Any]], bool]


def has_field(api_key: int, version: int, kind: str, test: FieldTest) -> bool:
    """Whether any field present at `version`, at any depth, passes `test`."""
    doc = json.loads(strip_comments(message_file(api_key, version, kind).resource
                                    .read_text("utf-8")))
    common = {c["name"]: c["fields"] for c in doc.get("commonStructs", [])}

    def walk(fields: list[dict[str, Any]]) -> bool:
        for f in fields:
            if not in_versions(version, parse_versions(f.get("versions"))):
                continue
            if test(f):
                return True
            inner = f.get("fields") or common.get(f["type"].removeprefix("[]"))
            if inner and walk(inner):
                return True
        return False

    return walk(doc["fields"])
