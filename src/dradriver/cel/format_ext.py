"""``string.format(list)`` as cel-go's strings extension versions 1-3 define it (Kubernetes enables
version 2): clauses %s %d %f %e %b %o %x %X with an optional precision (``%.3f``), and ``%%``.

Version 4's rewritten formatter (different output for doubles, lists and maps) is not what the API
server runs. Localised digit grouping, which the version-1 formatter takes from the en_US locale, is not
reproduced: a %f or %e of a number of 1,000 or more may differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dradriver.cel.conversions import to_string
from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.semver import Semver
from dradriver.cel.time_ext import Duration, Timestamp, duration_string, timestamp_string
from dradriver.cel.values import CelType, Uint, map_items, type_name
from dradriver.quantity import Quantity

DEFAULT_PRECISION = 6
MAX_PRECISION = 1000
_SPECIAL = ("NaN", "Infinity", "-Infinity")


def _go_float_word(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return None


def _string(value: Any) -> str:
    """%s: the value converted to a string, lists and maps spelled out."""
    kind = type(value)
    if isinstance(value, list):
        return "[" + ", ".join(_quoted(v, _element(v)) for v in value) + "]"
    if isinstance(value, dict):
        return _map(value)
    if value is None:
        return "null"
    if kind is CelType:
        return str(value.name)
    if kind is Timestamp:
        return timestamp_string(value)
    if kind is Duration:
        return duration_string(value)
    if kind in (Quantity, Semver):
        raise CelEvaluationError(
            "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, "
            f"durations, and timestamps, was given {type_name(value)}"
        )
    return to_string(value)


def _element(value: Any) -> str:
    """A list element or map value as the version-1 formatter prints it (doubles with %.6f)."""
    if type(value) is float:
        word = _go_float_word(value)
        return word if word is not None else f"{value:.{DEFAULT_PRECISION}f}"
    if type(value) in (int, Uint):
        return str(int(value))
    if type(value) is Timestamp:
        return f'timestamp("{timestamp_string(value)}")'
    if type(value) is Duration:
        return f'duration("{duration_string(value)}")'
    return _string(value)


def _quoted(value: Any, text: str) -> str:
    kind = type(value)
    if kind is str:
        return _go_quote(text)
    if kind is bytes:
        return "b" + _go_quote(text)
    if kind is float and _go_float_word(value) is not None:
        return _go_quote(text)
    return text


def _go_quote(text: str) -> str:
    """Go's %q for a string: double quotes, with backslash escapes for quotes and control characters."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char in "\a\b\f\n\r\t\v":
            out.append(
                {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}[char]
            )
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _map(value: dict[Any, Any]) -> str:
    pairs = []
    for key, item in map_items(value):
        if type(key) in (str, bool):
            key_text = _string(key)
        elif type(key) in (int, Uint):
            key_text = str(int(key))
        else:
            raise CelEvaluationError(f"no formatting function for map key of type {type_name(key)}")
        pairs.append((_quoted(key, key_text), _quoted(item, _element(item))))
    pairs.sort(key=lambda pair: pair[0])
    return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"


def _decimal(value: Any) -> str:
    if type(value) in (int, Uint):
        return str(int(value))
    raise CelEvaluationError(f"decimal clause can only be used on integers, was given {type_name(value)}")


def _float_argument(value: Any, clause: str) -> float:
    if type(value) is float:
        return float(value)
    if type(value) is str and value in _SPECIAL:
        return float(value.replace("Infinity", "inf"))
    raise CelEvaluationError(f"{clause} clause can only be used on doubles, was given {type_name(value)}")


def _fixed(precision: int) -> Callable[[Any], str]:
    def fixed(value: Any) -> str:
        number = _float_argument(value, "fixed-point")
        word = _go_float_word(number)
        return word if word is not None else f"{number:.{precision}f}"

    return fixed


def _scientific(value: Any) -> str:
    # the version-1 formatter writes "%<precision>e": the precision is a width, the digits stay at 6
    number = _float_argument(value, "scientific")
    word = _go_float_word(number)
    return word if word is not None else f"{number:e}"


def _binary(value: Any) -> str:
    if type(value) is bool:
        return "1" if value else "0"
    if type(value) in (int, Uint):
        return format(int(value), "b")
    raise CelEvaluationError(f"only integers and bools can be formatted as binary, was given {type_name(value)}")


def _octal(value: Any) -> str:
    if type(value) in (int, Uint):
        return format(int(value), "o")
    raise CelEvaluationError(f"octal clause can only be used on integers, was given {type_name(value)}")


def _hex(upper: bool) -> Callable[[Any], str]:
    def hexadecimal(value: Any) -> str:
        if type(value) is str:
            text = value.encode("utf-8").hex()
        elif type(value) is bytes:
            text = value.hex()
        elif type(value) in (int, Uint):
            text = format(int(value), "x")
        else:
            raise CelEvaluationError(
                f"only integers, byte buffers, and strings can be formatted as hex, was given {type_name(value)}"
            )
        return text.upper() if upper else text

    return hexadecimal


def format_string(template: str, arguments: list[Any]) -> str:
    """``template.format(arguments)``."""
    out: list[str] = []
    i, used, n = 0, 0, len(template)
    while i < n:
        char = template[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        if template[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if i + 1 >= n:
            raise CelEvaluationError("format: unexpected end of string")
        if used >= len(arguments):
            raise CelEvaluationError(f"format: index {used} out of range")
        i += 1
        precision: int | None = None
        if template[i] == ".":
            j = i + 1
            while j < n and template[j].isdigit():
                j += 1
            if j == i + 1 or j >= n:
                raise CelEvaluationError(
                    "format: could not parse formatting clause: unable to find end of precision specifier"
                )
            precision = int(template[i + 1 : j])
            if precision > MAX_PRECISION:
                # version 2 sets no limit (version 5 caps at 100); an unbounded one could build a string
                # of any length, so this evaluator refuses it
                raise CelEvaluationError(f"format: precision {precision} is more than {MAX_PRECISION}")
            i = j
        verb = template[i]
        clauses: dict[str, Callable[[Any], str]] = {
            "s": _string,
            "d": _decimal,
            "f": _fixed(DEFAULT_PRECISION if precision is None else precision),
            "e": _scientific,
            "b": _binary,
            "o": _octal,
            "x": _hex(upper=False),
            "X": _hex(upper=True),
        }
        if verb not in clauses:
            raise CelEvaluationError(
                f"format: could not parse formatting clause: unrecognized formatting clause {verb!r}"
            )
        out.append(clauses[verb](arguments[used]))
        used += 1
        i += 1
    return "".join(out)
