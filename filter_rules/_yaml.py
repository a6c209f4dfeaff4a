"""YAML documents as plain data plus the line and column of every key and item.

PyYAML composes a node tree whose nodes carry marks; this module turns each
document's tree into dicts, lists and scalars while recording, for every path
(`("rules", 0, "match")`), where its key (or list item) starts. The loader maps a
validation error's location to that position. Duplicate keys, which PyYAML would
silently overwrite, are reported; so are aliases that refer to themselves and
documents that expand into more nodes than a rule file could sensibly hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Path = tuple[str | int, ...]
Position = tuple[int, int]  # line, column; both from 1

MAX_DEPTH: Final = 64
MAX_NODES: Final = 200_000
# libyaml reads this much in about 0.05 s (1,000 simple rules: 110 KB), holding the GIL.
FAST_MAX_CHARS: Final = 256 * 1024

_MAP_TAG: Final = "tag:yaml.org,2002:map"
_SEQ_TAG: Final = "tag:yaml.org,2002:seq"


class YamlProblem(Exception):
    """A document cannot be read; `line`, `column` from 1 (None when unknown)."""

    def __init__(
        self,
        message: str,
        line: int | None = None,
        column: int | None = None,
        path: Path = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.path = path


@dataclass
class Document:
    """One YAML document: its data, its start and the position of every path in it."""

    data: Any
    start: Position
    positions: dict[Path, Position] = field(default_factory=dict)
    problems: list[YamlProblem] = field(default_factory=list)

    def locate(self, path: Path) -> Position:
        """The position of the longest prefix of `path` that the document has."""
        for end in range(len(path), 0, -1):
            position = self.positions.get(path[:end])
            if position is not None:
                return position
        return self.start


class _Loader(yaml.SafeLoader):
    """SafeLoader: only YAML's standard tags, nothing executable."""


# The same with libyaml's parser, when PyYAML was built with it.
_FAST_LOADER: Final[Any] = getattr(yaml, "CSafeLoader", None)


def _position(node: Node) -> Position:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _problem_from(exc: yaml.YAMLError) -> YamlProblem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        text = exc.problem or exc.context or str(exc).splitlines()[0]
        context = exc.context_mark
        if exc.problem and exc.context and context is not None and context is not mark:
            text += f" ({exc.context} at line {context.line + 1}, column {context.column + 1})"
        elif exc.problem and exc.context:
            text = f"{exc.context}: {text}"
        if mark is not None:
            return YamlProblem(f"invalid YAML: {text}", mark.line + 1, mark.column + 1)
        return YamlProblem(f"invalid YAML: {text}")
    return YamlProblem(f"invalid YAML: {exc}".splitlines()[0])


class _Converter:
    def __init__(self, loader: _Loader, start: Position, prefix: Path) -> None:
        self.loader = loader
        self.document = Document(data=None, start=start)
        self.prefix = prefix
        self.nodes = 0
        self.open: set[int] = set()  # collections being converted: an alias to one loops
        self.own_keys: dict[int, set[int]] = {}  # mapping node -> its own (unmerged) keys
        self.distinct: set[int] = set()  # nodes converted; fewer than `nodes`: aliases

    def _too_many_nodes(self) -> str:
        written = len(self.distinct)
        if written < self.nodes:  # some node was converted more than once: an alias
            return (f"document expands to more than {MAX_NODES} values through aliases "
                    f"(it writes {written}; each alias repeats what it names)")
        return (f"document holds more than {MAX_NODES} values (mappings, lists and "
                "scalars): split its rules into several files")

    def problem(self, node: Node, message: str, path: Path) -> None:
        line, column = _position(node)
        self.document.problems.append(YamlProblem(message, line, column, path))

    def convert(self, node: Node, path: Path, depth: int) -> Any:
        self.nodes += 1
        self.distinct.add(id(node))
        if self.nodes > MAX_NODES:
            line, column = _position(node)
            raise YamlProblem(self._too_many_nodes(), line, column)
        if depth > MAX_DEPTH:
            line, column = _position(node)
            raise YamlProblem(f"document is nested deeper than {MAX_DEPTH} levels", line, column)
        if isinstance(node, ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.open:
            self.problem(node, "an alias refers to the node that contains it", path)
            return None
        self.open.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self.mapping(node, path, depth)
            if isinstance(node, SequenceNode):
                return self.sequence(node, path, depth)
        finally:
            self.open.discard(id(node))
        self.problem(node, "unsupported YAML node", path)
        return None

    def scalar(self, node: ScalarNode, path: Path) -> Any:
        try:
            return self.loader.construct_object(node)
        except yaml.YAMLError as exc:
            problem = _problem_from(exc)
            self.problem(node, problem.message.removeprefix("invalid YAML: "), path)
        except Exception as exc:  # a malformed !!int, !!timestamp, !!binary ... value
            self.problem(node, f"cannot read {node.tag} value {node.value!r}: {exc}", path)
        return None

    def mapping(self, node: MappingNode, path: Path, depth: int) -> dict[str, Any]:
        if node.tag != _MAP_TAG:
            self.problem(
                node, f"unsupported YAML tag {node.tag} (rule files use plain mappings)", path
            )
            return {}
        own = self.own_keys.get(id(node))
        if own is None:  # first visit: remember the keys written here, then merge
            own = self.own_keys[id(node)] = {id(key) for key, _ in node.value}
            self.loader.flatten_mapping(node)  # merge keys (<<: *anchor) come first
        result: dict[str, Any] = {}
        written: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.problem(key_node, "a mapping key must be a plain name", path)
                continue
            key = str(key_node.value)
            if id(key_node) in own:  # a key written twice is an error; merged ones yield
                if key in written:
                    self.problem(key_node, f"duplicate key '{key}'", (*path, key))
                    continue
                written.add(key)
            key_path = (*path, key)
            self.document.positions[key_path] = _position(key_node)
            result[key] = self.convert(value_node, key_path, depth + 1)
        return result

    def sequence(self, node: SequenceNode, path: Path, depth: int) -> list[Any]:
        if node.tag != _SEQ_TAG:
            self.problem(
                node, f"unsupported YAML tag {node.tag} (rule files use plain lists)", path
            )
            return []
        result: list[Any] = []
        for index, item in enumerate(node.value):
            item_path = (*path, index)
            self.document.positions[item_path] = _position(item)
            result.append(self.convert(item, item_path, depth + 1))
        return result


def documents(text: str, list_key: str = "rules") -> Iterator[Document]:
    """The documents of a YAML stream, in order; YamlProblem if the stream is invalid.

    A document whose root is a list is read as `{list_key: <the list>}`, and its paths
    are recorded under `list_key` so error locations line up.

    libyaml (PyYAML's C parser, five times faster) reads streams up to
    FAST_MAX_CHARS when it is there; a stream it refuses is read again by PyYAML's own
    parser, whose error messages are the ones reported. Bigger streams are read by
    PyYAML's parser alone: libyaml holds the GIL for a whole document, and other
    threads (an event loop serving requests) would wait that long.
    """
    fast = _compose_fast(text) if len(text) <= FAST_MAX_CHARS else None
    if fast is None:
        yield from _documents(text, list_key)
        return
    loader, nodes = fast
    try:
        for node in nodes:
            yield _convert(loader, node, list_key)
            loader.constructed_objects = {}
    finally:
        loader.dispose()


def _compose_fast(text: str) -> tuple[Any, list[Node]] | None:
    """Every document's node tree, read by libyaml; None if it is not installed or
    refuses the stream."""
    if _FAST_LOADER is None:
        return None
    loader = _FAST_LOADER(text)
    nodes: list[Node] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                nodes.append(node)
    except (yaml.YAMLError, RecursionError):
        loader.dispose()
        return None
    return loader, nodes


def _documents(text: str, list_key: str) -> Iterator[Document]:
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:  # the reader refuses control characters up front
        raise _reader_problem(exc, text) from None
    try:
        while True:
            try:
                if not loader.check_node():
                    return
                node = loader.get_node()
            except yaml.YAMLError as exc:
                raise _reader_problem(exc, text) from None
            except RecursionError:
                raise YamlProblem("document is nested too deeply") from None
            if node is None:
                continue
            yield _convert(loader, node, list_key)
            loader.constructed_objects = {}
    finally:
        loader.dispose()


def _reader_problem(exc: yaml.YAMLError, text: str) -> YamlProblem:
    if isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        line = before.count("\n") + 1
        column = exc.position - (before.rfind("\n") + 1) + 1
        character = exc.character
        shown = f"U+{character:04X}" if isinstance(character, int) else repr(character)
        return YamlProblem(f"invalid YAML: {exc.reason} ({shown})", line, column)
    return _problem_from(exc)


def _convert(loader: _Loader, root: Node, list_key: str) -> Document:
    start = _position(root)
    is_list = isinstance(root, SequenceNode) and root.tag == _SEQ_TAG
    prefix: Path = (list_key,) if is_list else ()
    converter = _Converter(loader, start, prefix)
    try:
        data = converter.convert(root, prefix, 0)
    except yaml.YAMLError as exc:  # a bad merge key
        raise _problem_from(exc) from None
    except RecursionError:
        raise YamlProblem("document is nested too deeply", *start) from None
    converter.document.data = {list_key: data} if is_list else data
    if is_list:
        converter.document.positions[prefix] = start
    return converter.document
