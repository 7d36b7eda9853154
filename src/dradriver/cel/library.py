"""The functions a DRA selector may call, with their signatures (for the checker) and implementations.

What is here mirrors the Kubernetes CEL environment for device selectors (docs/explain.md has the table
per Kubernetes version): CEL's standard functions, timestamps and durations, optional types, cel-go's
strings (v2), sets and lists (v3) extensions, and the Kubernetes libraries quantity, semver, regex, lists,
IP, CIDR, URL and named formats. UNSUPPORTED names functions of other CEL environments (cel-go's math and
encoders extensions, admission policies' authorizer and jsonpatch) that the API server refuses in a selector
too, with the reason a compile error gives.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import re2  # type: ignore[import-untyped]

from dradriver.cel.conversions import to_bool, to_bytes, to_double, to_int, to_string, to_uint
from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.format_ext import format_string
from dradriver.cel.named_formats import FORMAT_FUNCTIONS
from dradriver.cel.net_ext import NET_FUNCTIONS
from dradriver.cel.semver import Semver, SemverError, is_semver
from dradriver.cel.strings_ext import STRING_FUNCTIONS
from dradriver.cel.time_ext import TIME_FUNCTIONS
from dradriver.cel.url_ext import URL_FUNCTIONS
from dradriver.cel.values import (
    INT64_MAX,
    INT64_MIN,
    NONE,
    CelType,
    OptionalValue,
    Uint,
    _equal,
    compare,
    equals,
    less,
    type_name,
)
from dradriver.quantity import Quantity, QuantityError, is_quantity

# A type is a name ("int", "string", "Quantity", "dyn", …) or ("list", elem) / ("map", key, value).
# In parameters, "any" accepts every type and "list" / "map" any list / map; the result "elem" is the
# element type of the first (receiver) argument.
Type = Any


class Overload(NamedTuple):
    member: bool
    params: tuple[Type, ...]
    result: Type
    impl: Callable[..., Any]


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes, list, dict)):
        return len(value)
    raise CelEvaluationError(f"no such overload: size({type_name(value)})")


_regex_cache: dict[str, Any] = {}
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error is reported to the user; RE2's own logging would only add noise


REGEX_FUNCTIONS = ("matches", "find", "findAll")


def compile_regex(pattern: str) -> Any:
    compiled = _regex_cache.get(pattern)
    if compiled is None:
        try:
            compiled = re2.compile(pattern, _RE2_OPTIONS)
        except re2.error as err:
            detail = err.args[0].decode() if err.args and isinstance(err.args[0], bytes) else str(err)
            raise CelEvaluationError(f"invalid regular expression {pattern!r}: {detail}") from None
        if len(_regex_cache) > 1024:
            _regex_cache.clear()
        _regex_cache[pattern] = compiled
    return compiled


def _matches(text: str, pattern: str) -> bool:
    return compile_regex(pattern).search(text) is not None


def _find(text: str, pattern: str) -> str:
    match = compile_regex(pattern).search(text)
    return str(match.group(0)) if match else ""


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    found = [str(m.group(0)) for m in compile_regex(pattern).finditer(text)]
    return found if limit < 0 else found[:limit]


def _type_of(value: Any) -> CelType:
    name = type_name(value)
    return CelType(name)


def _quantity(text: str) -> Quantity:
    try:
        return Quantity.parse(text)
    except QuantityError as err:
        raise CelEvaluationError(str(err)) from None


def _semver(text: str, normalize: bool = False) -> Semver:
    try:
        return Semver.parse(text, normalize=normalize)
    except SemverError as err:
        raise CelEvaluationError(str(err)) from None


def _as_integer(q: Quantity) -> int:
    try:
        return q.as_integer()
    except QuantityError as err:
        raise CelEvaluationError(str(err)) from None


def _quantity_arith(op: str) -> Callable[[Quantity, Any], Quantity]:
    def apply(q: Quantity, other: Any) -> Quantity:
        if type(other) is bool or not isinstance(other, (Quantity, int)):
            raise CelEvaluationError(f"no such overload: {op}(kubernetes.Quantity, {type_name(other)})")
        return q.add(other) if op == "add" else q.sub(other)

    return apply


def _list_sorted(values: list[Any]) -> bool:
    return all(not less(b, a) for a, b in itertools.pairwise(values))


def _list_sum(values: list[Any]) -> Any:
    if not values:
        return 0
    kind = type(values[0])
    if kind not in (int, Uint, float) or any(type(v) is not kind for v in values):
        raise CelEvaluationError("sum() needs a list of numbers of one type")
    total = sum(values)
    if kind is int and not INT64_MIN <= total <= INT64_MAX:
        raise CelEvaluationError("integer overflow")
    return Uint(total) if kind is Uint else total


def _list_extreme(name: str, pick_less: bool) -> Callable[[list[Any]], Any]:
    def extreme(values: list[Any]) -> Any:
        if not values:
            raise CelEvaluationError(f"{name}() called on an empty list")
        best = values[0]
        for value in values[1:]:
            if less(value, best) if pick_less else less(best, value):
                best = value
        return best

    return extreme


def _includes(target: Any, item: Any) -> bool:
    """DRA's ``<attribute>.includes(<value>)`` (list-type attributes, Kubernetes 1.36): membership for a
    list, equality for a single value; the target's Equal decides, and an error counts as no match."""
    if isinstance(target, list):
        return any(_equal(element, item) is True for element in target)
    return _equal(target, item) is True


def _list_index(values: list[Any], item: Any) -> int:
    for i, value in enumerate(values):
        if equals(value, item):
            return i
    return -1


def _list_last_index(values: list[Any], item: Any) -> int:
    for i in range(len(values) - 1, -1, -1):
        if equals(values[i], item):
            return i
    return -1


def _sets_contains(a: list[Any], b: list[Any]) -> bool:
    return all(any(equals(x, y) for y in a) for x in b)


def _sets_intersects(a: list[Any], b: list[Any]) -> bool:
    return any(any(equals(x, y) for y in a) for x in b)


def _sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


_QUOTE_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
_QUOTE_ESCAPES.update({"\\": "\\\\", '"': '\\"'})


def _quote(text: str) -> str:
    """cel-go's strings.quote: the escapes CEL string literals know; everything else as it is."""
    return '"' + "".join(_QUOTE_ESCAPES.get(c, c) for c in text) + '"'


# cel-go's optional library (Kubernetes enables optional types since 1.28)
def _optional_of(value: Any) -> OptionalValue:
    return OptionalValue(True, value)


def _is_zero(value: Any) -> bool:
    if value is None:
        return True
    if type(value) in (bool, int, Uint, float, str, bytes, list, dict) or isinstance(value, (list, dict)):
        return not value
    return False


def _optional_of_non_zero(value: Any) -> OptionalValue:
    return NONE if _is_zero(value) else OptionalValue(True, value)


def _optional_value(opt: OptionalValue) -> Any:
    if not opt.has:
        raise CelEvaluationError("optional.none() dereference")
    return opt.value


def _optional_or_value(opt: OptionalValue, other: Any) -> Any:
    return opt.value if opt.has else other


def _optional_or(opt: OptionalValue, other: OptionalValue) -> OptionalValue:
    return opt if opt.has else other


# cel-go's lists extension (ext.Lists version 3, Kubernetes 1.34+)
MAX_RANGE = 1_000_000  # lists.range(n) beyond the cost limit could never finish within it


def _list_slice(values: list[Any], start: int, end: int) -> list[Any]:
    if start < 0 or end < 0:
        raise CelEvaluationError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise CelEvaluationError(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if end > len(values):
        raise CelEvaluationError(f"cannot slice({start}, {end}), list is length {len(values)}")
    return values[start:end]


def _list_flatten(values: list[Any], depth: int = 1) -> list[Any]:
    if depth < 0:
        raise CelEvaluationError("level must be non-negative")
    out: list[Any] = []
    for value in values:
        if isinstance(value, list) and depth > 0:
            out.extend(_list_flatten(value, depth - 1))
        else:
            out.append(value)
    return out


def _list_distinct(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if not any(equals(value, seen) for seen in out):
            out.append(value)
    return out


def _list_sort(values: list[Any]) -> list[Any]:
    if not values:
        return []
    kind = type(values[0])
    if kind not in (int, Uint, float, str, bytes, bool, Quantity, Semver) or any(type(v) is not kind for v in values):
        raise CelEvaluationError("sort() needs a list of comparable elements of one type")
    return sorted(values, key=functools.cmp_to_key(_key_compare))


def sort_by_keys(values: list[Any], keys: list[Any]) -> list[Any]:
    """The elements of ``values`` ordered by ``keys`` (sortBy's implementation)."""
    order = _list_sort(list(keys))
    del order  # validates the keys: one comparable type

    def by_key(i: int, j: int) -> int:
        return _key_compare(keys[i], keys[j])

    indexed: list[int] = sorted(range(len(values)), key=functools.cmp_to_key(by_key))
    return [values[i] for i in indexed]


def _key_compare(a: Any, b: Any) -> int:
    if type(a) in (Quantity, Semver):
        return int(a.compare(b))
    return compare("sortBy", a, b)


def _lists_range(count: int) -> list[int]:
    if count > MAX_RANGE:
        raise CelEvaluationError("operation cancelled: actual cost limit exceeded (lists.range)")
    return list(range(max(0, count)))


def _list_reverse(values: list[Any]) -> list[Any]:
    return values[::-1]


Q, S = "Quantity", "Semver"
SIZED = ("string", "bytes", "list", "map")


def _o(member: bool, params: tuple[Type, ...], result: Type, impl: Callable[..., Any]) -> Overload:
    return Overload(member, params, result, impl)


FUNCTIONS: dict[str, tuple[Overload, ...]] = {
    "size": tuple(_o(m, (t,), "int", _size) for m in (False, True) for t in SIZED),
    "contains": (_o(True, ("string", "string"), "bool", lambda s, t: t in s),),
    "startsWith": (_o(True, ("string", "string"), "bool", lambda s, t: s.startswith(t)),),
    "endsWith": (_o(True, ("string", "string"), "bool", lambda s, t: s.endswith(t)),),
    "matches": (
        _o(True, ("string", "string"), "bool", _matches),
        _o(False, ("string", "string"), "bool", _matches),
    ),
    "int": tuple(_o(False, (t,), "int", to_int) for t in ("int", "uint", "double", "string")),
    "uint": tuple(_o(False, (t,), "uint", to_uint) for t in ("int", "uint", "double", "string")),
    "double": tuple(_o(False, (t,), "double", to_double) for t in ("int", "uint", "double", "string")),
    "string": tuple(_o(False, (t,), "string", to_string) for t in ("int", "uint", "double", "string", "bytes", "bool")),
    "bool": tuple(_o(False, (t,), "bool", to_bool) for t in ("bool", "string")),
    "bytes": tuple(_o(False, (t,), "bytes", to_bytes) for t in ("bytes", "string")),
    "dyn": (_o(False, ("any",), "dyn", lambda v: v),),
    "type": (_o(False, ("any",), "type", _type_of),),
    # Kubernetes regex library
    "find": (_o(True, ("string", "string"), "string", _find),),
    "findAll": (
        _o(True, ("string", "string"), ("list", "string"), _find_all),
        _o(True, ("string", "string", "int"), ("list", "string"), _find_all),
    ),
    # Kubernetes lists library (indexOf/lastIndexOf are shared with the strings extension)
    "isSorted": (_o(True, ("list",), "bool", _list_sorted),),
    "sum": (_o(True, ("list",), "elem", _list_sum),),
    "min": (_o(True, ("list",), "elem", _list_extreme("min", True)),),
    "max": (_o(True, ("list",), "elem", _list_extreme("max", False)),),
    # cel-go sets extension
    "sets.contains": (_o(False, ("list", "list"), "bool", _sets_contains),),
    "sets.equivalent": (_o(False, ("list", "list"), "bool", _sets_equivalent),),
    "sets.intersects": (_o(False, ("list", "list"), "bool", _sets_intersects),),
    "strings.quote": (_o(False, ("string",), "string", _quote),),
    "format": (_o(True, ("string", "list"), "string", format_string),),
    # optional types
    "optional.of": (_o(False, ("any",), "opt_arg0", _optional_of),),
    "optional.ofNonZeroValue": (_o(False, ("any",), "opt_arg0", _optional_of_non_zero),),
    "optional.none": (_o(False, (), ("optional", "dyn"), lambda: NONE),),
    "hasValue": (_o(True, ("optional",), "bool", lambda o: o.has),),
    "value": (_o(True, ("optional",), "inner0", _optional_value),),
    "orValue": (_o(True, ("optional", "any"), "inner0", _optional_or_value),),
    "or": (_o(True, ("optional", "optional"), "arg0", _optional_or),),
    # cel-go lists extension, version 3
    "slice": (_o(True, ("list", "int", "int"), "arg0", _list_slice),),
    "flatten": (
        _o(True, ("list",), ("list", "dyn"), _list_flatten),
        _o(True, ("list", "int"), ("list", "dyn"), _list_flatten),
    ),
    "distinct": (_o(True, ("list",), "arg0", _list_distinct),),
    "reverse": (_o(True, ("list",), "arg0", _list_reverse),),
    "sort": (_o(True, ("list",), "arg0", _list_sort),),
    "lists.range": (_o(False, ("int",), ("list", "int"), _lists_range),),
    # DRA list-type attributes (Kubernetes 1.36, DRAListTypeAttributes)
    "includes": (_o(True, ("any", "any"), "bool", _includes),),
    # Kubernetes quantity library
    "quantity": (_o(False, ("string",), Q, _quantity),),
    "isQuantity": (_o(False, ("string",), "bool", is_quantity),),
    "sign": (_o(True, (Q,), "int", lambda q: q.sign()),),
    "asInteger": (_o(True, (Q,), "int", _as_integer),),
    "asApproximateFloat": (_o(True, (Q,), "double", lambda q: q.as_float()),),
    "isInteger": (_o(True, (Q,), "bool", lambda q: q.is_integer()),),
    "add": (_o(True, (Q, Q), Q, _quantity_arith("add")), _o(True, (Q, "int"), Q, _quantity_arith("add"))),
    "sub": (_o(True, (Q, Q), Q, _quantity_arith("sub")), _o(True, (Q, "int"), Q, _quantity_arith("sub"))),
    # Kubernetes semver library (compareTo / isGreaterThan / isLessThan are shared with quantity)
    "semver": (_o(False, ("string",), S, _semver), _o(False, ("string", "bool"), S, _semver)),
    "isSemver": (
        _o(False, ("string",), "bool", is_semver),
        _o(False, ("string", "bool"), "bool", lambda s, n: is_semver(s, normalize=n)),
    ),
    "major": (_o(True, (S,), "int", lambda v: v.major),),
    "minor": (_o(True, (S,), "int", lambda v: v.minor),),
    "patch": (_o(True, (S,), "int", lambda v: v.patch),),
    "compareTo": (
        _o(True, (Q, Q), "int", lambda a, b: a.compare(b)),
        _o(True, (S, S), "int", lambda a, b: a.compare(b)),
    ),
    "isGreaterThan": (
        _o(True, (Q, Q), "bool", lambda a, b: a.compare(b) > 0),
        _o(True, (S, S), "bool", lambda a, b: a.compare(b) > 0),
    ),
    "isLessThan": (
        _o(True, (Q, Q), "bool", lambda a, b: a.compare(b) < 0),
        _o(True, (S, S), "bool", lambda a, b: a.compare(b) < 0),
    ),
}

for _name, _overloads in STRING_FUNCTIONS.items():
    FUNCTIONS[_name] = tuple(Overload(*o) for o in _overloads) + FUNCTIONS.get(_name, ())

for _name, _overloads in TIME_FUNCTIONS.items():
    FUNCTIONS[_name] = FUNCTIONS.get(_name, ()) + tuple(Overload(*o) for o in _overloads)

for _name, _overloads in (*NET_FUNCTIONS.items(), *URL_FUNCTIONS.items(), *FORMAT_FUNCTIONS.items()):
    FUNCTIONS[_name] = FUNCTIONS.get(_name, ()) + tuple(Overload(*o) for o in _overloads)

FUNCTIONS["indexOf"] += (_o(True, ("list", "any"), "int", _list_index),)
FUNCTIONS["lastIndexOf"] += (_o(True, ("list", "any"), "int", _list_last_index),)

# Functions a user may know from other CEL environments that the API server refuses in a DRA selector too: the
# compile error says why. DRA compiles selectors in k8s.io/apiserver's base environment (base.go) plus
# ext.Bindings; through Kubernetes 1.37 base.go enables neither cel-go's ext.Math nor ext.Encoders.
_NOT_IN_BASE_ENV = "cel-go's {} extension is not enabled in Kubernetes' CEL environment (1.34-1.37)"
_NOT_FOR_DRA = "it belongs to {}, not to DRA device selectors"
UNSUPPORTED: dict[str, str] = {
    "math.greatest": _NOT_IN_BASE_ENV.format("math"),
    "math.least": _NOT_IN_BASE_ENV.format("math"),
    "base64.encode": _NOT_IN_BASE_ENV.format("encoders"),
    "base64.decode": _NOT_IN_BASE_ENV.format("encoders"),
    "jsonpatch.escapeKey": _NOT_FOR_DRA.format("MutatingAdmissionPolicy's CEL"),
    "authorizer": _NOT_FOR_DRA.format("admission policies' CEL (the authorizer variable)"),
}
