"""Field paths compiled to fixed walks: get, set and delete over decoded values."""

from __future__ import annotations

from typing import Any

import pytest

from interceptors.jsonpath import JSON_CODEC, WILDCARD, FieldPath, PathError, delete_locations

DOC: dict[str, Any] = {
    "a": {"b": 1},
    "items": [{"sku": "x"}, {"sku": "y"}, {"other": 3}],
    "lines": [{"price": 10}, {"price": 20}],
    "odd key": "o",
    "m": {"k1": {"v": 1}, "k2": {"v": 2}},
    "$weird-name_1": True,
}


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("$.a.b", ("a", "b")),
        ("$.items[*].sku", ("items", WILDCARD, "sku")),
        ("$.lines[0].price", ("lines", 0, "price")),
        ("$['odd key']", ("odd key",)),
        ("$['123']", ("123",)),
        ("$.$weird-name_1", ("$weird-name_1",)),
        ("$[*]", (WILDCARD,)),
    ],
)
def test_paths_compile_to_steps(path: str, steps: tuple[Any, ...]) -> None:
    assert FieldPath(path).steps == steps


@pytest.mark.parametrize("path", ["a.b", "$", "$..a", "$.a[?(@.x)]", "$.a[-1]", "$[odd]", "$.1a"])
def test_unsupported_paths_are_refused(path: str) -> None:
    with pytest.raises(PathError, match="invalid field path"):
        FieldPath(path)


@pytest.mark.parametrize(
    ("path", "values"),
    [
        ("$.a.b", [1]),
        ("$.items[*].sku", ["x", "y"]),
        ("$.lines[1].price", [20]),
        ("$['odd key']", ["o"]),
        ("$.m[*].v", [1, 2]),
        ("$.a", [{"b": 1}]),
        ("$.missing.b", []),
        ("$.a.b.c", []),  # a step below a number names nothing
        ("$.lines[5].price", []),  # past the end
        ("$.a[0]", []),  # an index on an object
        ("$.items.sku", []),  # a name on a list
        ("$.odd", []),  # only the quoted form names "odd key"
    ],
)
def test_values(path: str, values: list[Any]) -> None:
    assert list(FieldPath(path).values(DOC)) == values


def test_values_of_a_non_container_root() -> None:
    assert list(FieldPath("$.a").values("text")) == []
    assert list(FieldPath("$[*].a").values(None)) == []


def test_set_through_locations() -> None:
    doc = {"items": [{"sku": "x"}, {"sku": "y"}, {}]}
    for container, key in FieldPath("$.items[*].sku").locations(doc):
        container[key] = container[key].upper()
    assert doc == {"items": [{"sku": "X"}, {"sku": "Y"}, {}]}


def test_delete_object_members_and_list_items() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [0, 1, 2, 3], "n": [[1, 2], [3, 4]]}
    delete_locations(FieldPath("$.a.b").locations(doc))
    delete_locations(FieldPath("$.l[*]").locations(doc))
    delete_locations(FieldPath("$.n[*][0]").locations(doc))
    assert doc == {"a": {"c": 2}, "l": [], "n": [[2], [4]]}


def test_delete_one_list_item_shifts_the_rest() -> None:
    doc = {"l": [0, 1, 2]}
    delete_locations(FieldPath("$.l[1]").locations(doc))
    assert doc == {"l": [0, 2]}


# --- the JSON codec ----------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":123456789012345678901234567890,"b":"x"}',
        b'{"a":-9223372036854775809}',
        b'{"a":18446744073709551616,"f":1.5,"s":"\xc3\xa9"}',
        b'{"digits":"12345678901234567890","n":1}',
    ],
)
def test_json_round_trip_keeps_every_number(raw: bytes) -> None:
    assert JSON_CODEC.encode(JSON_CODEC.decode(raw)) == raw


@pytest.mark.parametrize(
    "raw",
    [
        b"NaN",
        b'{"a":Infinity}',
        b"1e400",
        b'{"a":1e4000,"n":12345678901234567890}',
        b"\xff",
        b'{"a":12345678901234567890',
        b"",
    ],
)
def test_json_refuses_what_is_not_json(raw: bytes) -> None:
    with pytest.raises(ValueError):
        JSON_CODEC.decode(raw)
