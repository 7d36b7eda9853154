"""cel-go's strings extension, version 2 as Kubernetes enables it (1.29+): no string reverse() (version 3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.values import type_name


def _range_error(function: str, index: int) -> CelEvaluationError:
    return CelEvaluationError(f"{function}: index out of range: {index}")


def char_at(text: str, index: int) -> str:
    if index < 0 or index > len(text):
        raise _range_error("charAt", index)
    return text[index : index + 1]


def index_of(text: str, sub: str, offset: int = 0) -> int:
    if offset < 0 or offset > len(text):
        raise _range_error("indexOf", offset)
    return text.find(sub, offset)


def last_index_of(text: str, sub: str, offset: int | None = None) -> int:
    if offset is None:
        return text.rfind(sub)
    if offset < 0 or offset > len(text):
        raise _range_error("lastIndexOf", offset)
    return text.rfind(sub, 0, offset + len(sub))


def lower_ascii(text: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def upper_ascii(text: str) -> str:
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in text)


def replace(text: str, old: str, new: str, count: int = -1) -> str:
    return text.replace(old, new, count if count >= 0 else -1)


def split(text: str, separator: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    if separator == "":
        parts = list(text)
        if 0 < limit < len(parts):
            parts = [*parts[: limit - 1], "".join(parts[limit - 1 :])]
        return parts
    return text.split(separator, limit - 1 if limit > 0 else -1)


def substring(text: str, start: int, end: int | None = None) -> str:
    stop = len(text) if end is None else end
    if start < 0 or start > len(text):
        raise _range_error("substring", start)
    if stop < start or stop > len(text):
        raise CelEvaluationError(f"substring: invalid range [{start}, {stop}) of a string of length {len(text)}")
    return text[start:stop]


# Go's unicode.IsSpace (strings.TrimSpace); Python's str.strip() also strips \x1c-\x1f.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


def trim(text: str) -> str:
    return text.strip(_GO_SPACE)


def join(values: list[Any], separator: str = "") -> str:
    for value in values:
        if type(value) is not str:
            raise CelEvaluationError(f"join: list element of type {type_name(value)}, want string")
    return separator.join(values)


def reverse(text: str) -> str:
    return text[::-1]


_S = "string"
STRING_FUNCTIONS: dict[str, tuple[tuple[bool, tuple[Any, ...], Any, Callable[..., Any]], ...]] = {
    "charAt": ((True, (_S, "int"), _S, char_at),),
    "indexOf": ((True, (_S, _S), "int", index_of), (True, (_S, _S, "int"), "int", index_of)),
    "lastIndexOf": ((True, (_S, _S), "int", last_index_of), (True, (_S, _S, "int"), "int", last_index_of)),
    "lowerAscii": ((True, (_S,), _S, lower_ascii),),
    "upperAscii": ((True, (_S,), _S, upper_ascii),),
    "replace": ((True, (_S, _S, _S), _S, replace), (True, (_S, _S, _S, "int"), _S, replace)),
    "split": ((True, (_S, _S), ("list", _S), split), (True, (_S, _S, "int"), ("list", _S), split)),
    "substring": ((True, (_S, "int"), _S, substring), (True, (_S, "int", "int"), _S, substring)),
    "trim": ((True, (_S,), _S, trim),),
    "join": ((True, (("list", _S),), _S, join), (True, (("list", _S), _S), _S, join)),
}
