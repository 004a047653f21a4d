"""YAML loading that keeps the file, line and column of every node.

Documents are composed (not constructed) with ruamel.yaml, then turned into plain
Python values by hand so that every mapping key and value keeps its position and a
duplicate key is reported as a problem instead of silently overwriting the first.

Only regular files of at most `MAX_FILE_BYTES` are read: a FIFO, a device or a
socket (`/dev/urandom`, `<(...)` by mistake) would block or never end, and a huge
file is not a policy, so each is one problem naming the file, and is not read.

A small file can still be a large or deep tree: nesting is bounded while composing
(`MAX_DEPTH`), and each document's tree is measured before it is built, up to
`MAX_NODES` values in all, since aliases expand a few hundred bytes into billions.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.reader import ReaderError

from controlplane.policy.problems import Problem

PathKey = tuple[str | int, ...]

MAX_FILE_BYTES = 16 << 20  # 16 MiB: far above any real policy, far below a memory problem
# A policy document nests about 5 levels and holds a few hundred values; these bounds are
# far above that, and far below Python's recursion limit and a memory problem.
MAX_DEPTH = 100
MAX_NODES = 1_000_000
# How the problems start that leave some of a file's documents unread, so that the
# compiler claims nothing about what they might hold ("no Topology", say).
UNREAD_PREFIXES = ("YAML does not parse", "cannot read")


@dataclass(frozen=True)
class Pos:
    line: int  # 1-based
    column: int  # 1-based


@dataclass
class RawDocument:
    """One YAML document as plain data, with positions of every value and key by path."""

    file: str
    data: Any
    values: dict[PathKey, Pos] = field(default_factory=dict)
    keys: dict[PathKey, Pos] = field(default_factory=dict)

    def pos(self, path: PathKey, *, key: bool = False) -> Pos:
        """The position of the node at `path` (its key when `key`), else its nearest parent."""
        table = self.keys if key else self.values
        p = path
        while p:
            if p in table:
                return table[p]
            if p in self.values:
                return self.values[p]
            p = p[:-1]
        return self.values.get((), Pos(1, 1))

    def problem(self, path: PathKey, message: str, *, key: bool = False) -> Problem:
        where = self.pos(path, key=key)
        return Problem(self.file, where.line, where.column, message)


_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"


def _scalar(node: ScalarNode) -> Any:
    tag, text = node.tag, node.value
    tag_s = str(getattr(tag, "value", tag))
    try:
        if tag_s == _INT:
            return (
                int(text.replace("_", ""), 0)
                if text[:2].lower() in ("0x", "0o")
                else int(text.replace("_", ""))
            )
        if tag_s == _FLOAT:
            return float(text.replace("_", ""))
    except ValueError:
        return text
    if tag_s == _BOOL:
        return text.lower() in ("true", "yes", "on")
    if tag_s == _NULL:
        return None
    return text


def _mark(node: Node) -> Pos:
    return Pos(node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    def __init__(self, file: str) -> None:
        self.doc = RawDocument(file=file, data=None)
        self.problems: list[Problem] = []

    def build(self, node: Node, path: PathKey) -> Any:
        self.doc.values[path] = _mark(node)
        if isinstance(node, MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self.build_key(key_node)
                if key in out:
                    first = self.doc.keys[(*path, key)]
                    self.problems.append(
                        Problem(
                            self.doc.file,
                            _mark(key_node).line,
                            _mark(key_node).column,
                            f"duplicate key {key!r} (first given on line {first.line})",
                        )
                    )
                    continue
                self.doc.keys[(*path, key)] = _mark(key_node)
                out[key] = self.build(value_node, (*path, key))
                if _empty(value_node):
                    # A value left empty (`transfer:` and nothing after) has no text of
                    # its own: the parser marks it at the next token, lines below maybe.
                    self.doc.values[(*path, key)] = _mark(key_node)
            return out
        if isinstance(node, SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        if isinstance(node, ScalarNode):
            return _scalar(node)
        return None

    def build_key(self, node: Node) -> str:
        if isinstance(node, ScalarNode):
            return str(node.value)
        return str(self.build(node, ("<key>",)))


def _empty(node: Node) -> bool:
    """An empty or comment-only document (a trailing `---`, say): well formed, and
    ignored. An explicit `~` or `null` is a document, and not a mapping."""
    tag = str(getattr(node.tag, "value", node.tag))
    return isinstance(node, ScalarNode) and tag == _NULL and node.value == ""


def load_file(path: Path, display: str | None = None) -> tuple[list[RawDocument], list[Problem]]:
    """Every document of one file, and the problems met while reading it."""
    name = display or str(path)
    try:
        text = _read_policy_file(path)
    except _RefusedFileError as exc:
        return [], [Problem(name, 1, 1, str(exc))]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [Problem(name, 1, 1, f"cannot read the file: {exc}")]
    return load_text(text, name)


class _RefusedFileError(Exception):
    """The path is not something a policy file can be; the message says what it is.
    It starts "cannot read the file" like any read error, which the compiler takes to
    mean that the file's documents are unknown (so no "no Topology" is claimed)."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(mode: int, size: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((k for is_kind, k in _KINDS if is_kind(mode)), "not a regular file")
        raise _RefusedFileError(f"cannot read the file: it is {kind}, not a regular file")
    if size > MAX_FILE_BYTES:
        raise _RefusedFileError(_too_large(size))


def _too_large(size: int | None) -> str:
    limit = f"{MAX_FILE_BYTES >> 20} MiB"
    what = f"more than {limit}" if size is None else f"{size / (1 << 20):.1f} MiB"
    return f"cannot read the file: it is {what}, over the {limit} limit of a policy file"


def _read_policy_file(path: Path) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES, read without blocking on
    anything else: the path is checked before it is opened (opening a device can have
    effects of its own), and the open file again, in case the path changed between."""
    _check_regular(*_mode_and_size(os.stat(path)))
    # O_NONBLOCK: should a FIFO have taken the path's place since, open does not wait
    # for a writer (and fstat then refuses it); it changes nothing for regular files.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        _check_regular(*_mode_and_size(os.fstat(f.fileno())))
        data = f.read(MAX_FILE_BYTES + 1)  # a file that grew meanwhile is still bounded
    if len(data) > MAX_FILE_BYTES:
        raise _RefusedFileError(_too_large(None))
    return data.decode("utf-8")


def _mode_and_size(st: os.stat_result) -> tuple[int, int]:
    return st.st_mode, st.st_size


class _TooDeepError(Exception):
    """Nesting past MAX_DEPTH, at `mark`: the rest of the file is not read."""

    def __init__(self, mark: Pos) -> None:
        super().__init__(mark)
        self.mark = mark


class _DepthLimitedComposer(Composer):
    """ruamel composes nested collections recursively, so 3,000 `[` in a row would
    exhaust Python's stack (and lose every other file's problems): stop at MAX_DEPTH."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                start = self.parser.peek_event().start_mark
                raise _TooDeepError(Pos(start.line + 1, start.column + 1))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _TooLargeError(Exception):
    """A composed document whose tree, aliases expanded, must not be built; when
    `rest_unread`, neither must the rest of the file."""

    def __init__(self, node: Node, message: str, *, rest_unread: bool = False) -> None:
        super().__init__(message)
        self.node = node
        self.rest_unread = rest_unread


def _tree_size(root: Node, at_most: int) -> int:
    """The number of values in the tree that `_Builder` would make of `root`; raise
    _TooLargeError when that is over `at_most`, deeper than MAX_DEPTH, or infinite.

    An alias is the node it names, so a document is a graph: each node is measured once
    (in time linear in the file), and a node met again while still being measured is an
    alias inside the node it names, which would be an infinite tree."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (values, levels) of its tree
    open_: set[int] = set()

    def measure(node: Node) -> tuple[int, int]:
        if id(node) in measured:
            return measured[id(node)]
        if id(node) in open_:
            raise _TooLargeError(
                node,
                f"cannot read the document: alias *{node.anchor} is used inside the node "
                "it names, so it never ends",
            )
        open_.add(id(node))
        values, levels = 1, 1
        for child in _children(node):
            child_values, child_levels = measure(child)
            values, levels = values + child_values, max(levels, child_levels + 1)
            if values > at_most:
                raise _TooLargeError(
                    node,
                    "cannot read the file past here: it holds more than "
                    f"{MAX_NODES:,} values (aliases expanded)",
                    rest_unread=True,
                )
        if levels > MAX_DEPTH:
            raise _TooLargeError(
                node,
                f"cannot read the document: its aliases nest this node deeper than "
                f"{MAX_DEPTH} levels",
            )
        open_.discard(id(node))
        measured[id(node)] = (values, levels)
        return values, levels

    return measure(root)[0]


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def load_text(text: str, name: str) -> tuple[list[RawDocument], list[Problem]]:
    yaml = YAML(typ="rt")
    yaml.Composer = _DepthLimitedComposer
    docs: list[RawDocument] = []
    problems: list[Problem] = []
    values_left = MAX_NODES  # for the whole file: each of its documents can hold a bomb
    try:
        for node in yaml.compose_all(text):
            if node is None or _empty(node):
                continue
            try:
                values_left -= _tree_size(node, values_left)
            except _TooLargeError as exc:
                # "cannot read": the compiler then claims nothing about this document.
                where = _mark(exc.node)
                problems.append(Problem(name, where.line, where.column, str(exc)))
                if exc.rest_unread:
                    break
                continue
            builder = _Builder(name)
            builder.doc.data = builder.build(node, ())
            docs.append(builder.doc)
            problems.extend(builder.problems)
    except _TooDeepError as exc:
        problems.append(
            Problem(
                name,
                exc.mark.line,
                exc.mark.column,
                f"cannot read the file past here: it nests deeper than {MAX_DEPTH} levels",
            )
        )
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        # Where the parser gave up can be past the end of the text (an unclosed bracket
        # or quote): then the place it opened (the context) is the offending node.
        if exc.context_mark is not None and (mark is None or mark.line >= len(text.splitlines())):
            mark = exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        problems.append(Problem(name, line, col, f"YAML does not parse: {what}"))
    except ReaderError as exc:
        problems.append(_reader_problem(exc, text, name))
    except YAMLError as exc:
        problems.append(Problem(name, 1, 1, f"YAML does not parse: {' '.join(str(exc).split())}"))
    return docs, problems


def _reader_problem(exc: ReaderError, text: str, name: str) -> Problem:
    """A character YAML does not allow (a NUL, say), at its place, in one sentence."""
    position = exc.position if isinstance(exc.position, int) else 0
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    code = exc.character if isinstance(exc.character, int) else None
    what = f"the character U+{code:04X}" if code is not None else "a character"
    return Problem(name, line, column, f"YAML does not parse: {what} is not allowed in YAML")
