"""Whether a JSON Schema can be used at all: what `keg validate` and the control plane
report at a rule's file:line (an inline `validate` schema), and what the record checks
(interceptors.json_schema) refuse to build."""

from __future__ import annotations

from typing import Any, Final

from jsonschema import exceptions as schema_errors
from jsonschema import validators

RECURSIVE: Final = "the schema's $refs recurse without reading the document"
_MAX_MESSAGE: Final = 200


def schema_problem(schema: Any) -> str | None:
    """None for a usable schema; else why not: not an object, not valid for its draft's
    metaschema, or a `$ref` cycle that reads nothing (`{"$ref": "#"}`: every document
    would recurse to Python's limit)."""
    if not isinstance(schema, (dict, bool)):
        return "a JSON Schema is an object (or true/false)"
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except schema_errors.SchemaError as exc:
        message = exc.message if len(exc.message) <= _MAX_MESSAGE else (
            exc.message[: _MAX_MESSAGE - 3] + "...")
        return f"invalid JSON Schema at {exc.json_path}: {message}"
    if not remote_refs(schema):  # (a probe never fetches anything)
        try:
            cls(schema).is_valid(None)
        except RecursionError:
            return RECURSIVE
        except Exception:  # a document meets such an error when checked, as before
            pass
    return None


def remote_refs(node: Any) -> bool:
    """Whether a `$ref` anywhere in `node` names another document."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return True
        return any(remote_refs(value) for value in node.values())
    if isinstance(node, list):
        return any(remote_refs(value) for value in node)
    return False
