"""The one way dradriver reads a file a user hands it: claims, classes, slices, profiles, kubeconfigs, state files.

Every input is bounded before it is trusted: a size limit, regular files only (``/dev/zero`` or a FIFO would
never end), UTF-8 with an error that says where it is not, and YAML whose nesting depth and alias expansion are
limited (a "billion laughs" document is refused instead of exhausting memory or the stack). Values load as JSON
would see them, as the API server's YAML-to-JSON conversion does: timestamps and binary stay strings.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Literal

import yaml

from dradriver.errors import ConfigError

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_YAML_DEPTH = 100
# Values after aliases are expanded, summed over a file's documents: far more than any real set of slices.
MAX_YAML_VALUES = 1_000_000


#: What a key twice in one mapping does: refused (as the API server refuses it), or the last value kept (as
#: client-go's lenient YAML reading of a kubeconfig keeps it).
DuplicateKeys = Literal["refuse", "last"]


class InputError(ConfigError):
    """A file cannot be read as the input it should be; the message names the file and the fix."""


def path_exists(path: Path) -> bool:
    """Whether ``path`` exists; a path the system cannot even look up (too long, no permission) is an
    ``InputError`` naming it, where ``Path.exists`` would raise ``OSError``."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        raise InputError(f"{_shown(path)}: cannot look it up: {err.strerror or err}") from None
    except ValueError:
        raise InputError(f"{_shown(path)!r}: a path cannot contain a NUL character") from None
    return True


def _shown(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}…{text[-40:]}"


def read_text(path: Path, *, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``limit`` bytes); ``InputError`` otherwise."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{_shown(path)}: no such file") from None
    except OSError as err:
        raise InputError(f"{_shown(path)}: cannot read: {err.strerror or err}") from None
    except ValueError:
        raise InputError(f"{_shown(path)!r}: a path cannot contain a NUL character") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{path}: is a directory; pass a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path}: not a regular file (a device, pipe or socket); pass a file")
    if info.st_size > limit:
        raise InputError(f"{path}: {info.st_size} bytes is more than the limit of {limit}; split the file")
    try:
        # O_NONBLOCK: should the path have been swapped for a pipe since stat(), open() must not hang.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            data = file.read(limit + 1)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) > limit:
        raise InputError(f"{path}: more than the limit of {limit} bytes; split the file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); save it as UTF-8"
        ) from None


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader that refuses nesting deeper than ``MAX_YAML_DEPTH`` (the composer recurses per level), and
    a key twice in one mapping unless ``duplicate_keys`` is "last"."""

    depth = 0
    duplicate_keys: DuplicateKeys = "refuse"

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise InputError(
                    f"line {mark.line + 1}: nested deeper than {MAX_YAML_DEPTH} levels; "
                    "no Kubernetes object needs that many"
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if self.duplicate_keys == "refuse":
            _refuse_duplicate_keys(node)
        return super().construct_mapping(node, deep=deep)


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
    """A key twice in one mapping: YAML keeps the last value silently, the API server refuses the object (JSON too).
    Most often two objects pasted into one file without ``---`` between them, where the first would be lost."""
    first: dict[tuple[str, str], int] = {}
    for key_node, _value in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<` merges may override by design
        line, key = key_node.start_mark.line + 1, (key_node.tag, key_node.value)
        if key in first:
            raise InputError(
                f'line {line}: duplicate field "{key_node.value}" (first at line {first[key]}); the API server '
                "refuses duplicate fields. Two objects in one file need a line with --- between them"
            )
        first[key] = line


def _as_string(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]


# JSON has neither timestamps nor binary: keep them as the strings the API server would see.
_BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_string)
_BoundedLoader.add_constructor("tag:yaml.org,2002:binary", _as_string)


def parse_yaml(text: str, *, source: str, duplicate_keys: DuplicateKeys = "refuse") -> list[Any]:
    """The documents of YAML (or JSON) ``text``, empty ones dropped; ``InputError`` names ``source``.
    ``duplicate_keys``: a key twice in one mapping refused (the API server's rule), or its last value kept."""
    documents: list[Any] = []
    try:
        # The reader checks the characters as it is built: a control character fails here already.
        loader = _BoundedLoader(text)
    except yaml.YAMLError as err:
        raise InputError(f"{source}: not valid YAML: {_one_line(err)}") from None
    loader.duplicate_keys = duplicate_keys
    try:
        while loader.check_data():  # type: ignore[no-untyped-call]
            document = loader.get_data()
            if document is not None:
                documents.append(document)
    except InputError as err:
        raise InputError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise InputError(f"{source}: not valid YAML: {_one_line(err)}") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply to read") from None
    finally:
        loader.dispose()
    _check_expanded_size(documents, source)
    return documents


def read_stdin(*, limit: int = MAX_FILE_BYTES) -> str:
    """Standard input as UTF-8 text (``-`` for a file name), within the same size limit as a file."""
    data = sys.stdin.buffer.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"standard input: more than the limit of {limit} bytes; split it")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(
            f"standard input: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); send UTF-8"
        ) from None


def load_yaml_file(path: Path, *, limit: int = MAX_FILE_BYTES, duplicate_keys: DuplicateKeys = "refuse") -> list[Any]:
    """The non-empty documents of the YAML or JSON file ``path``, read within every limit above (``duplicate_keys``:
    as :func:`parse_yaml`)."""
    return parse_yaml(read_text(path, limit=limit), source=str(path), duplicate_keys=duplicate_keys)


def _check_expanded_size(documents: list[Any], source: str) -> None:
    """Refuse documents whose aliases expand past ``MAX_YAML_VALUES`` (or refer to themselves)."""
    budget = MAX_YAML_VALUES
    pending: list[Any] = list(documents)
    while pending:
        value = pending.pop()
        budget -= 1
        if budget < 0:
            raise InputError(
                f"{source}: expands to more than {MAX_YAML_VALUES} values (YAML aliases repeating "
                "or containing themselves?); write the objects out"
            )
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)


def _one_line(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else str(problem)


def type_name(value: object) -> str:
    """How a YAML value is named in messages: ``a string``, ``a list``, ``a mapping``…"""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


_REQUIRED: Any = object()


class Fields:
    """Reads one mapping of a strict document (a node profile, the product table) field by field, by the names
    the file uses; :meth:`done` refuses names nobody read. Every problem is a ``ValueError`` whose message starts
    with the field's path (``gpus.0.pciBusId: …``), worded as pydantic words them, which these documents were
    validated with before: pydantic is kept off ``dradriver run``'s path for its memory (docs/reliability.md)."""

    def __init__(self, raw: object, where: str = "") -> None:
        if not isinstance(raw, dict):
            raise ValueError(f"{where or 'the document'}: Input should be a valid dictionary, not {type_name(raw)}")
        self._raw: dict[Any, Any] = raw
        self._where = where
        self._read: set[str] = set()

    def path(self, name: str) -> str:
        """The path of field ``name`` in messages."""
        return f"{self._where}.{name}" if self._where else name

    def value(self, name: str, default: Any = _REQUIRED) -> Any:
        """The raw value of ``name``; ``default`` when it is absent (a ``Field required`` error without one)."""
        self._read.add(name)
        if name not in self._raw:
            if default is _REQUIRED:
                raise ValueError(f"{self.path(name)}: Field required")
            return default
        return self._raw[name]

    def integer(
        self,
        name: str,
        default: Any = _REQUIRED,
        *,
        ge: int | None = None,
        gt: int | None = None,
        le: int | None = None,
    ) -> int:
        value = self.value(name, default)
        if value is default and default is not _REQUIRED:
            return value  # type: ignore[no-any-return]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{self.path(name)}: Input should be a valid integer")
        for bound, holds, words in ((ge, value >= (ge or 0), "greater than or equal to"),
                                    (gt, value > (gt or 0), "greater than"),
                                    (le, value <= (le or 0), "less than or equal to")):  # fmt: skip
            if bound is not None and not holds:
                raise ValueError(f"{self.path(name)}: Input should be {words} {bound}")
        return value

    def string(self, name: str, default: Any = _REQUIRED, *, pattern: re.Pattern[str] | None = None) -> str:
        value = self.value(name, default)
        if value is default and default is not _REQUIRED:
            return value  # type: ignore[no-any-return]
        if not isinstance(value, str):
            raise ValueError(f"{self.path(name)}: Input should be a valid string")
        if pattern is not None and not pattern.search(value):
            raise ValueError(f"{self.path(name)}: String should match pattern '{pattern.pattern}'")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.value(name, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.path(name)}: Input should be a valid boolean")
        return value

    def items(self, name: str, *, min_length: int = 0, max_length: int | None = None) -> list[tuple[str, Any]]:
        """The entries of list ``name`` (absent: none), each with its path (``gpus.0``)."""
        value = self.value(name, [])
        if not isinstance(value, list):
            raise ValueError(f"{self.path(name)}: Input should be a valid tuple")
        if len(value) < min_length:
            raise ValueError(
                f"{self.path(name)}: Tuple should have at least {min_length} item"
                f"{'' if min_length == 1 else 's'} after validation, not {len(value)}"
            )
        if max_length is not None and len(value) > max_length:
            raise ValueError(
                f"{self.path(name)}: Tuple should have at most {max_length} items after validation, not {len(value)}"
            )
        return [(f"{self.path(name)}.{i}", item) for i, item in enumerate(value)]

    def done(self) -> None:
        """Refuse the names no one read."""
        for name in self._raw:
            if name not in self._read:
                raise ValueError(f"{self.path(str(name))}: Extra inputs are not permitted")
