"""No Kafka API key is written as a bare integer outside kafka_wire: it is `ApiKey.X`.

An AST check over the whole tree (kafka_wire itself, generated from the schemas, is
the one place numbers are allowed). It flags an integer that is a real API key where
the code means an API key:

- tested for equality with, or membership in, something named `api_key`
  (`header.api_key == 3`, `api_key in {0, 1}`);
- passed as an `api_key=` keyword, or positionally where a function defined in the
  tree takes its `api_key` parameter (`RequestHeader(3, ...)`, `decode_body(0, ...)`);
- assigned to a name that says it is an API (`PRODUCE_API = 0`, `_TOPIC_APIS =
  frozenset({21, 23})`, `DESCRIBE_ACLS, CREATE_ACLS = 29, 30`);
- iterated as `api_key` (`for api_key in (4, 5)`) or parametrized as `api_key`.

Integers that name no API (999 for "an unknown key") are fine.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_wire import ApiKey

ROOT = Path(__file__).resolve().parents[3]
SKIPPED = {".venv", "build", "kafka_wire", ".git", "envoy", "node_modules"}
KEYS = {int(k) for k in ApiKey}
API_NAME = re.compile(r"(^|_)APIS?$|API_KEY|^HOLD_KEY$")  # PRODUCE_API, _TOPIC_APIS
KEY_WORDS = {"api_key", "api_keys"}
BUILTINS = set(dir(builtins))
EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)  # not range checks (api_key < 0)


def python_files() -> list[Path]:
    def walk(folder: Path) -> Iterator[Path]:
        for path in sorted(folder.iterdir()):
            if path.is_dir():
                if path.name not in SKIPPED and not path.name.startswith("."):
                    yield from walk(path)
            elif path.suffix == ".py":
                yield path

    return list(walk(ROOT))


def _ints(node: ast.AST) -> list[ast.Constant]:
    """API-key integers in a literal: 3, (0, 1), {0: ...}, frozenset({21, 23})."""
    if (isinstance(node, ast.Constant) and isinstance(node.value, int)
            and not isinstance(node.value, bool) and node.value in KEYS):
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [k for e in node.elts for k in _ints(e)]
    if isinstance(node, ast.Dict):
        return [k for e in node.keys if e is not None for k in _ints(e)]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in {"frozenset", "set", "tuple", "list"} and node.args):
        return _ints(node.args[0])
    return []


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _names_an_api(node: ast.AST) -> bool:
    name = _name(node)
    return name is not None and (name in KEY_WORDS or bool(API_NAME.search(name))
                                 or name in ApiKey.__members__)


def api_key_parameters(trees: list[ast.Module]) -> dict[str, int]:
    """Callable name -> the position of its `api_key` parameter, over every tree."""
    positions: dict[str, int] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]
                if params and params[0] in {"self", "cls"}:
                    params = params[1:]
                if "api_key" in params:
                    positions[node.name] = params.index("api_key")
            elif isinstance(node, ast.ClassDef):  # dataclasses: fields in order
                fields = [s.target.id for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                if "api_key" in fields:
                    positions[node.name] = fields.index("api_key")
    return positions


Found = tuple[ast.Constant, str]  # the integer (its .value an int), and where it stands


def literals(tree: ast.Module, positions: dict[str, int]) -> Iterator[Found]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(isinstance(op, EQUALITY) for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(_names_an_api(o) for o in operands):
                for o in operands:
                    for key in _ints(o):
                        yield key, "compared with an API key"
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in KEY_WORDS:
                    for key in _ints(kw.value):
                        yield key, f"as {kw.arg}="
            callee = _name(node.func)
            at = None if callee in BUILTINS else positions.get(callee or "")
            if at is not None and at < len(node.args):
                for key in _ints(node.args[at]):
                    yield key, f"as the api_key of {callee}()"
            if callee == "parametrize" and len(node.args) >= 2:
                yield from _parametrized(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            for target in targets:
                named = ([e for e in target.elts] if isinstance(target, ast.Tuple)
                         else [target])
                if any(_names_an_api(t) for t in named):
                    for key in _ints(node.value):
                        yield key, f"assigned to {ast.unparse(target)}"
        elif isinstance(node, ast.For) and _names_an_api(node.target):
            for key in _ints(node.iter):
                yield key, "iterated as an API key"


def _parametrized(node: ast.Call) -> Iterator[Found]:
    argnames = node.args[0]
    if not (isinstance(argnames, ast.Constant) and isinstance(argnames.value, str)):
        if isinstance(argnames, ast.Tuple | ast.List):
            names = [e.value for e in argnames.elts if isinstance(e, ast.Constant)]
        else:
            return
    else:
        names = [n.strip() for n in argnames.value.split(",")]
    if "api_key" not in names:
        return
    at = names.index("api_key")
    values = node.args[1]
    if not isinstance(values, ast.List | ast.Tuple):
        return
    for case in values.elts:
        value = case.elts[at] if isinstance(case, ast.Tuple) and len(names) > 1 else case
        if len(names) == 1 or isinstance(case, ast.Tuple):
            for key in _ints(value):
                yield key, "parametrized as api_key"


def test_no_api_key_integer_outside_kafka_wire() -> None:
    files = python_files()
    assert len(files) > 100, "the walk found too few files"
    trees = {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in files}
    positions = api_key_parameters([*trees.values(), *kafka_wire_trees()])
    found = [f"{path.relative_to(ROOT)}:{key.lineno}: {key.value!r} {what}: "
             f"write ApiKey.{_api(key).name}"
             for path, tree in trees.items() for key, what in literals(tree, positions)]
    assert not found, "\n".join(found)


def _api(node: ast.Constant) -> ApiKey:
    assert isinstance(node.value, int)
    return ApiKey(node.value)


def kafka_wire_trees() -> list[ast.Module]:
    return [ast.parse(p.read_text(encoding="utf-8")) for p in (ROOT / "kafka_wire").rglob("*.py")]


@pytest.mark.parametrize(("source", "flagged"), [
    ("if header.api_key == 3: pass", True),
    ("ok = api_key in {0, 1}", True),
    ("PRODUCE_API = 0", True),
    ("DESCRIBE_ACLS, CREATE_ACLS = 29, 30", True),
    ("_TOPIC_APIS = frozenset({21, 23})", True),
    ("h = RequestHeader(3, 12, 1, 'c')", True),
    ("e = event(api_key=3)", True),
    ("for api_key in (4, 5, 999): pass", True),
    ("if api_key == 999: pass", False),  # no such API
    ("if header.api_key == ApiKey.METADATA: pass", False),
    ("h = RequestHeader(key, 12, 1, 'c')", False),
    ("partitions = {0, 1}", False),
    ("api_version = 0", False),
    ("if head.api_key < 0: pass", False),
    ("mask = bytes([0, 4])", False),
])
def test_the_check_flags_what_it_should(source: str, flagged: bool) -> None:
    positions = {"RequestHeader": 0}
    assert bool(list(literals(ast.parse(source), positions))) is flagged
