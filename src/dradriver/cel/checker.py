"""A static checking pass: names, overloads and result type, as cel-go's checker does at compile time.

celpy has no type checker, so without this pass an unknown function or a comparison of a quantity with
an int would only fail when a device is evaluated. The checker infers a type for every node (``dyn`` where
it cannot know, e.g. attribute values), rejects what cannot work for any device, estimates a worst-case
cost, and records the overloads a call may take so the interpreter dispatches among those only.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from dradriver.cel import ast
from dradriver.cel.errors import CelCompileError, CelEvaluationError
from dradriver.cel.library import FUNCTIONS, REGEX_FUNCTIONS, UNSUPPORTED, Overload, compile_regex
from dradriver.cel.time_ext import parse_duration, parse_timestamp
from dradriver.cel.values import TYPE_NAMES

Type = Any
DYN = "dyn"
MAX_COST = 1_000_000  # resource.k8s.io: CELSelectorExpressionMaxCost (also the runtime budget)
# Sizes are upper bounds of a value's length (characters, bytes, elements or entries); a list's or map's
# size is (length, size of one element/value). What the device holds is bounded by the API's limits:
# attribute values are at most 64 characters (list attributes at most 64 entries), names and domains at
# most 63, and a device has at most 32 attributes and 32 capacities.
Size = Any
ATTRIBUTE_SIZE = 64
DEVICE_MAP = 32
UNBOUNDED = 2**62
_NUMERIC = ("int", "uint", "double")
_ORDERED = ("int", "uint", "double", "string", "bytes", "bool", "timestamp", "duration")
# (operator, left, right) → result for timestamps and durations
_TIME_ARITHMETIC = {
    ("_+_", "timestamp", "duration"): "timestamp",
    ("_+_", "duration", "timestamp"): "timestamp",
    ("_+_", "duration", "duration"): "duration",
    ("_-_", "timestamp", "duration"): "timestamp",
    ("_-_", "timestamp", "timestamp"): "duration",
    ("_-_", "duration", "duration"): "duration",
}


@dataclass(frozen=True)
class ObjectType:
    name: str
    fields: dict[str, Type] = field(compare=False)  # one type per name; dicts are not hashable


@dataclass
class CheckResult:
    type: Type
    cost: int
    overloads: dict[int, tuple[Overload, ...]] = field(default_factory=dict)
    exact: set[int] = field(default_factory=set)  # calls whose argument types are all statically known
    costs: dict[int, int] = field(default_factory=dict)  # estimated cost of every node, for the runtime budget
    # selections and indexes whose operand may be an optional value at run time (optional or dyn type)
    maybe_optional: set[int] = field(default_factory=set)


def length(size: Size) -> int:
    return int(size[0]) if isinstance(size, tuple) else int(size)


def inner(size: Size) -> Size:
    return size[1] if isinstance(size, tuple) else ATTRIBUTE_SIZE


def footprint(size: Size) -> int:
    """How much a value of this size holds in all (a list of strings: entries times characters)."""
    if isinstance(size, tuple):
        return min(UNBOUNDED, max(1, length(size)) * max(1, footprint(size[1])))
    return min(UNBOUNDED, int(size))


def _traversal(size: Size) -> int:
    # cel-go charges string and list traversals 0.1 per element (common.StringTraversalCostFactor)
    return math.ceil(footprint(size) * 0.1)


def _max_size(a: Size, b: Size) -> Size:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return (max(a[0], b[0]), _max_size(a[1], b[1]))
    return (
        max(length(a), length(b))
        if not (isinstance(a, tuple) or isinstance(b, tuple))
        else (a if isinstance(a, tuple) else b)
    )


def type_str(t: Type) -> str:
    if isinstance(t, ObjectType):
        return t.name
    if isinstance(t, tuple):
        return f"{t[0]}({', '.join(type_str(p) for p in t[1:])})"
    names = {
        "Quantity": "kubernetes.Quantity",
        "Semver": "kubernetes.Semver",
        "IP": "net.IP",
        "CIDR": "net.CIDR",
        "URL": "kubernetes.URL",
        "Format": "kubernetes.NamedFormat",
        "timestamp": "google.protobuf.Timestamp",
        "duration": "google.protobuf.Duration",
        "null": "null_type",
    }
    return str(names.get(t, t))


def _assignable(param: Type, arg: Type) -> bool:
    if param == "any" or DYN in (arg, param):
        return True
    if param == "list":
        return isinstance(arg, tuple) and arg[0] == "list"
    if param == "map":
        return isinstance(arg, tuple) and arg[0] == "map"
    if param == "optional":
        return isinstance(arg, tuple) and arg[0] == "optional"
    if isinstance(param, tuple) and isinstance(arg, tuple):
        return param[0] == arg[0] and all(_assignable(p, a) for p, a in zip(param[1:], arg[1:], strict=True))
    return bool(param == arg)


def _known(t: Type) -> bool:
    if t == DYN:
        return False
    if isinstance(t, tuple):
        return all(_known(p) for p in t[1:])
    return True


# Types a null may stand for where one is expected (cel-go's legacy nullable kinds: opaque types, durations,
# timestamps, any; checker/types.go isLegacyNullable).
_NULLABLE = frozenset({"null", "any", "timestamp", "duration", "Quantity", "Semver", "IP", "CIDR", "URL", "Format"})


def _branches_agree(a: Type, b: Type) -> bool:
    """Whether cel-go's ``_?_:_(bool, A, A)`` accepts branches of types ``a`` and ``b``: A is bound to the first
    and the second must be assignable to it or it to the second (checker/types.go isValidTypeSubstitution)."""
    if _assignable(a, b) or _assignable(b, a):
        return True
    if "null" in (a, b):
        other = b if a == "null" else a
        return other in _NULLABLE or (isinstance(other, tuple) and other[0] == "optional")
    return False


def _join(types: list[Type]) -> Type:
    """The common type of list elements or conditional branches: the type if all agree, else dyn."""
    known = [t for t in types if t != DYN]
    if not known:
        return DYN
    first = known[0]
    return first if all(t == first for t in known) and len(known) == len(types) else DYN


class Checker:
    def __init__(self, expression: str, variables: dict[str, Type]) -> None:
        self.expression = expression
        self.variables = variables
        self.overloads: dict[int, tuple[Overload, ...]] = {}
        self.exact: set[int] = set()
        self.sizes: dict[int, Size] = {}
        self.costs: dict[int, int] = {}
        self.maybe_optional: set[int] = set()
        self.format_depth = 0  # literals inside format() calls are exempt from the homogeneity rule

    def size(self, node: ast.Node) -> Size:
        return self.sizes.get(id(node), 1)

    def error(self, message: str, node: ast.Node, hint: str | None = None) -> CelCompileError:
        return CelCompileError(message, expression=self.expression, line=node.pos[0], column=node.pos[1], hint=hint)

    def check(self, root: ast.Node, *, want_bool: bool = True) -> CheckResult:
        result_type, cost = self.visit(root, dict(self.variables))
        if want_bool and result_type not in ("bool", DYN):
            raise self.error(
                f"a selector must evaluate to bool, not {type_str(result_type)}",
                root,
                hint='compare the value, e.g. ... == "value" or ....compareTo(...) >= 0',
            )
        if cost > MAX_COST:
            raise self.error(
                f"estimated cost {min(cost, UNBOUNDED)} exceeds the limit of {MAX_COST}"
                + (" (it can build strings or lists too large to hold)" if cost >= UNBOUNDED // 10 else ""),
                root,
                hint="avoid nested comprehensions over large lists and functions that grow strings in a chain",
            )
        return CheckResult(result_type, cost, self.overloads, self.exact, self.costs, self.maybe_optional)

    def visit(self, node: ast.Node, scope: dict[str, Type]) -> tuple[Type, int]:
        method = getattr(self, "_" + type(node).__name__)
        result: tuple[Type, int] = method(node, scope)
        cost = min(result[1], UNBOUNDED)
        self.costs[id(node)] = cost
        return result[0], cost

    def _Const(self, node: ast.Const, scope: dict[str, Type]) -> tuple[Type, int]:
        if node.type in ("string", "bytes"):
            self.sizes[id(node)] = len(node.value)
        return node.type, 0

    def _Ident(self, node: ast.Ident, scope: dict[str, Type]) -> tuple[Type, int]:
        if node.name in scope:
            self.sizes[id(node)] = scope.get("@" + node.name, ATTRIBUTE_SIZE)
            return scope[node.name], 1
        if node.name in TYPE_NAMES:
            return "type", 0
        names = [n for n in scope if not n.startswith("@")] + list(TYPE_NAMES)
        close = difflib.get_close_matches(node.name, names, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "the only variable of a device selector is 'device'"
        raise self.error(f"undeclared reference to '{node.name}'", node, hint=hint)

    def _select_type(self, node: ast.Select | ast.Has, operand: Type) -> Type:
        if isinstance(operand, ObjectType):
            if node.field not in operand.fields:
                close = difflib.get_close_matches(node.field, list(operand.fields), n=1)
                hint = (
                    f"did you mean '{close[0]}'?"
                    if close
                    else f"{operand.name} has {', '.join(sorted(operand.fields))}"
                )
                raise self.error(f"undefined field '{node.field}'", node, hint=hint)
            return operand.fields[node.field]
        if isinstance(operand, tuple) and operand[0] == "map":
            if operand[1] not in ("string", DYN):
                raise self.error(f"field selection on a map with {type_str(operand[1])} keys", node)
            return operand[2]
        if operand == DYN:
            return DYN
        raise self.error(f"type '{type_str(operand)}' does not support field selection", node)

    def _Select(self, node: ast.Select, scope: dict[str, Type]) -> tuple[Type, int]:
        operand, cost = self.visit(node.operand, scope)
        self.sizes[id(node)] = _field_size(node.field, self.size(node.operand))
        if operand == DYN or _is_optional(operand):
            self.maybe_optional.add(id(node))
        if _is_optional(operand):
            return ("optional", self._select_type(node, operand[1])), cost + 1
        if node.optional:
            return ("optional", self._select_type(node, operand)), cost + 1
        return self._select_type(node, operand), cost + 1

    def _Has(self, node: ast.Has, scope: dict[str, Type]) -> tuple[Type, int]:
        operand, cost = self.visit(node.operand, scope)
        self._select_type(node, operand[1] if _is_optional(operand) else operand)
        return "bool", cost + 1

    def _Index(self, node: ast.Index, scope: dict[str, Type]) -> tuple[Type, int]:
        operand, cost = self.visit(node.operand, scope)
        index, index_cost = self.visit(node.index, scope)
        total = cost + index_cost + 1
        self.sizes[id(node)] = _index_size(node, self.size(node.operand))
        if operand == DYN or _is_optional(operand):
            self.maybe_optional.add(id(node))
        if _is_optional(operand) or node.optional:
            base = operand[1] if _is_optional(operand) else operand
            return ("optional", self._index_type(node, base, index)), total
        return self._index_type(node, operand, index), total

    def _index_type(self, node: ast.Index, operand: Type, index: Type) -> Type:
        if isinstance(operand, tuple) and operand[0] == "list":
            if index not in ("int", "uint", "double", DYN):
                raise self.error(f"a list index must be an int, not {type_str(index)}", node.index)
            return operand[1]
        if isinstance(operand, tuple) and operand[0] == "map":
            if not _assignable(operand[1], index) and not (operand[1] in _NUMERIC and index in _NUMERIC):
                raise self.error(
                    f"a key of {type_str(operand)} must be {type_str(operand[1])}, not {type_str(index)}",
                    node.index,
                )
            return operand[2]
        if operand == DYN:
            return DYN
        hint = "use .charAt(i) or .substring(i, j)" if operand == "string" else None
        raise self.error(
            f"found no matching overload for '_[_]' applied to '({type_str(operand)}, {type_str(index)})'",
            node,
            hint=hint,
        )

    def _ListExpr(self, node: ast.ListExpr, scope: dict[str, Type]) -> tuple[Type, int]:
        types, cost = [], 1
        element_size: Size = 0
        for position, item in enumerate(node.items):
            t, c = self.visit(item, scope)
            if position in node.optional:
                t = self._optional_entry(t, item, "list element")
            if not _is_open(item):  # [], {} and optional.none() have open types: they join any element type
                types.append((t, item))
            cost += c
            element_size = _max_size(element_size, self.size(item))
        self.sizes[id(node)] = (len(node.items), element_size)
        return ("list", self._homogeneous(types, "list")), cost

    def _optional_entry(self, t: Type, node: ast.Node, what: str) -> Type:
        if _is_optional(t):
            return t[1]
        if t == DYN:
            return DYN
        raise self.error(
            f"an optional {what} (?) must be an optional value, not {type_str(t)}",
            node,
            hint="use optional.of(value), or x.?field / m[?key]",
        )

    def _homogeneous(self, typed: list[tuple[Type, ast.Node]], what: str) -> Type:
        """cel-go's HomogeneousAggregateLiterals (on in Kubernetes): every element of a list literal, and
        every key and every value of a map literal, has one type; dyn(x) is the way to mix them."""
        joined: Type = None
        for t, item in typed:
            if joined is None:
                joined = t
                continue
            if self.format_depth or _equivalent(joined, t):
                joined = _general(joined, t)
                continue
            raise self.error(
                f"type mismatch in a {what} literal: {type_str(joined)} vs {type_str(t)}",
                item,
                hint="Kubernetes wants the elements of one literal to have one type; wrap mixed ones in dyn(...)",
            )
        return DYN if joined is None else joined

    def _MapExpr(self, node: ast.MapExpr, scope: dict[str, Type]) -> tuple[Type, int]:
        keys, values, cost = [], [], 1
        value_size: Size = 0
        for position, (key_node, value_node) in enumerate(node.entries):
            k, kc = self.visit(key_node, scope)
            v, vc = self.visit(value_node, scope)
            if position in node.optional:
                v = self._optional_entry(v, value_node, "map value")
            if k not in ("int", "uint", "bool", "string", DYN):
                raise self.error(f"unsupported map key type {type_str(k)}", key_node)
            keys.append((k, key_node))
            if not _is_open(value_node):
                values.append((v, value_node))
            cost += kc + vc
            value_size = _max_size(value_size, self.size(value_node))
        self.sizes[id(node)] = (len(node.entries), value_size)
        return ("map", self._homogeneous(keys, "map key"), self._homogeneous(values, "map value")), cost

    def _Comprehension(self, node: ast.Comprehension, scope: dict[str, Type]) -> tuple[Type, int]:
        range_type, range_cost = self.visit(node.range, scope)
        kind, range_size = node.kind, self.size(node.range)
        if kind in ("optMap", "optFlatMap"):
            return self._optional_macro(node, scope, range_type, range_cost)
        if isinstance(range_type, tuple) and range_type[0] in ("list", "map"):
            first = range_type[1]
            if node.var2 is not None:
                first = "int" if range_type[0] == "list" else range_type[1]
            second = range_type[1] if range_type[0] == "list" else range_type[2]
        elif range_type == DYN:
            first = second = DYN
        else:
            raise self.error(
                f"expression of type '{type_str(range_type)}' cannot be the range of a comprehension ({kind})",
                node.range,
            )
        if kind in ("transformMap", "transformMapEntry") and node.var2 is not None and range_type[0] == "list":
            pass  # a list's index is its key
        element_size = inner(range_size)
        inner_scope = {**scope, node.var: first, "@" + node.var: 1 if node.var2 is not None else element_size}
        if node.var2 is not None:
            inner_scope.update({node.var2: second, "@" + node.var2: element_size})
        body_type, body_cost = self.visit(node.body, inner_scope)
        predicate_cost = 0
        if node.predicate is not None:
            predicate_type, predicate_cost = self.visit(node.predicate, inner_scope)
            self._want_bool(predicate_type, node.predicate, kind)
        if kind in ("all", "exists", "exists_one", "filter"):
            self._want_bool(body_type, node.body, kind)
        iterations = length(range_size)
        cost = range_cost + iterations * (body_cost + predicate_cost + 1)
        body_size = self.size(node.body)
        if kind in ("map", "transformList"):
            self.sizes[id(node)] = (iterations, body_size)
            return ("list", body_type), cost
        if kind in ("filter", "sortBy"):
            self.sizes[id(node)] = range_size
            if kind == "sortBy":
                cost += iterations * max(1, math.ceil(math.log2(max(2, iterations))))
            list_type = range_type if isinstance(range_type, tuple) and range_type[0] == "list" else ("list", second)
            return list_type, cost
        if kind == "transformMap":
            self.sizes[id(node)] = (iterations, body_size)
            key_type = (
                range_type[1]
                if isinstance(range_type, tuple) and range_type[0] == "map"
                else ("int" if isinstance(range_type, tuple) else DYN)
            )
            return ("map", key_type, body_type), cost
        if kind == "transformMapEntry":
            if not (body_type == DYN or (isinstance(body_type, tuple) and body_type[0] == "map")):
                raise self.error(
                    f"the expression of transformMapEntry() must be a map, not {type_str(body_type)}", node.body
                )
            self.sizes[id(node)] = (iterations, inner(body_size))
            return (body_type if body_type != DYN else ("map", DYN, DYN)), cost
        return "bool", cost

    def _optional_macro(
        self, node: ast.Comprehension, scope: dict[str, Type], range_type: Type, range_cost: int
    ) -> tuple[Type, int]:
        if not (_is_optional(range_type) or range_type == DYN):
            raise self.error(f"{node.kind}() needs an optional value, not {type_str(range_type)}", node.range)
        value_type = range_type[1] if _is_optional(range_type) else DYN
        body_type, body_cost = self.visit(
            node.body, {**scope, node.var: value_type, "@" + node.var: self.size(node.range)}
        )
        self.sizes[id(node)] = self.size(node.body)
        if node.kind == "optMap":
            return ("optional", body_type), range_cost + body_cost + 1
        if not (_is_optional(body_type) or body_type == DYN):
            raise self.error(f"the expression of optFlatMap() must be optional, not {type_str(body_type)}", node.body)
        return body_type, range_cost + body_cost + 1

    def _want_bool(self, t: Type, node: ast.Node, what: str) -> None:
        if t not in ("bool", DYN):
            raise self.error(f"the predicate of {what}() must be bool, not {type_str(t)}", node)

    def _Bind(self, node: ast.Bind, scope: dict[str, Type]) -> tuple[Type, int]:
        init_type, init_cost = self.visit(node.init, scope)
        body_scope = {**scope, node.var: init_type, "@" + node.var: self.size(node.init)}
        body_type, body_cost = self.visit(node.body, body_scope)
        self.sizes[id(node)] = self.size(node.body)
        return body_type, init_cost + body_cost

    def _Call(self, node: ast.Call, scope: dict[str, Type]) -> tuple[Type, int]:
        name = node.function
        if name in ("_&&_", "_||_", "!_", "_?_:_"):
            return self._logical(node, scope)
        target = node.target
        if (
            target is not None
            and isinstance(target, ast.Ident)
            and target.name not in scope
            and f"{target.name}.{name}" in FUNCTIONS
        ):
            name, target = f"{target.name}.{name}", None
        if isinstance(target, ast.Ident) and target.name not in scope and f"{target.name}.{name}" in UNSUPPORTED:
            qualified = f"{target.name}.{name}"
            raise self.error(f"undeclared reference to '{qualified}': {UNSUPPORTED[qualified]}", node)
        arg_nodes = ([target] if target is not None else []) + list(node.args)
        types, cost = [], 1
        self.format_depth += name == "format"
        try:
            for arg in arg_nodes:
                t, c = self.visit(arg, scope)
                types.append(t)
                cost += c
        finally:
            self.format_depth -= name == "format"
        sizes = [self.size(a) for a in arg_nodes]
        if name.startswith("_") or name == "-_":
            result_type = self._operator(node, name, types)
            if name == "_+_" and (result_type in ("string", "bytes", DYN) or _is_list(result_type)):
                grown = _concat_size(sizes[0], sizes[1])
                self.sizes[id(node)] = grown
                cost += _traversal(grown)
            elif name in ("_==_", "_!=_", "_in_", "_<_", "_<=_", "_>_", "_>=_"):
                cost += _traversal(sizes[-1]) if name == "_in_" else 0
            return result_type, cost
        if name in ("timestamp", "duration") and len(arg_nodes) == 1:
            literal = arg_nodes[0]
            if isinstance(literal, ast.Const) and literal.type == "string":
                try:
                    (parse_timestamp if name == "timestamp" else parse_duration)(literal.value)
                except CelEvaluationError as err:
                    # cel.ValidateTimestampLiterals / ValidateDurationLiterals (Kubernetes 1.29+)
                    raise self.error(err.message, literal) from None
        if name in REGEX_FUNCTIONS and len(arg_nodes) >= 2:
            pattern = arg_nodes[1]
            if isinstance(pattern, ast.Const) and pattern.type == "string":
                try:
                    compile_regex(pattern.value)
                except CelEvaluationError as err:
                    # cel.ValidateRegexLiterals (Kubernetes 1.29+): a constant pattern must compile
                    raise self.error(err.message, pattern) from None
        result = self._function(node, name, target is not None, types, arg_nodes)
        grown = _call_size(name, arg_nodes, sizes)
        if grown is not None:
            self.sizes[id(node)] = grown
        return result, cost + _call_cost(name, types, sizes, grown)

    def _logical(self, node: ast.Call, scope: dict[str, Type]) -> tuple[Type, int]:
        results = [self.visit(arg, scope) for arg in node.args]
        cost = sum(c for _, c in results) + 1
        types = [t for t, _ in results]
        if node.function == "_?_:_":
            if types[0] not in ("bool", DYN):
                raise self.error(f"the condition of ?: must be bool, not {type_str(types[0])}", node.args[0])
            if not _branches_agree(types[1], types[2]):
                shown = ", ".join(type_str(t) for t in types)
                raise self.error(
                    f"found no matching overload for '_?_:_' applied to '({shown})'",
                    node,
                    hint="both branches need one type; wrap one in dyn(...) to mix types",
                )
            self.sizes[id(node)] = _max_size(self.size(node.args[1]), self.size(node.args[2]))
            return _join(types[1:]), cost
        for t, arg in zip(types, node.args, strict=True):
            if t not in ("bool", DYN):
                op = {"_&&_": "&&", "_||_": "||", "!_": "!"}[node.function]
                raise self.error(
                    f"found no matching overload for '{op}' applied to {type_str(t)}",
                    arg,
                    hint=f"'{op}' needs bool operands",
                )
        return "bool", cost

    def _operator(self, node: ast.Call, name: str, types: list[Type]) -> Type:
        def fail(hint: str | None = None) -> CelCompileError:
            shown = ", ".join(type_str(t) for t in types)
            return self.error(f"found no matching overload for '{name}' applied to '({shown})'", node, hint=hint)

        kinds = set(types)
        special = kinds & {"Quantity", "Semver"}
        if name in ("_==_", "_!=_"):
            a, b = types
            if _known(a) and _known(b) and not _assignable(a, b):
                raise fail(_literal_hint(types))
            return "bool"
        if name in ("_<_", "_<=_", "_>_", "_>=_"):
            if special:
                kind = special.pop()
                helper = 'quantity("40Gi")' if kind == "Quantity" else 'semver("1.2.3")'
                raise fail(
                    f"compare {type_str(kind)} values with .compareTo({helper}) >= 0, "
                    f".isGreaterThan(...) or .isLessThan(...)"
                )
            a, b = types
            if DYN in (a, b):
                return "bool"
            if (a in _NUMERIC and b in _NUMERIC) or (a == b and a in _ORDERED):
                return "bool"
            raise fail(_literal_hint(types))
        if name == "_in_":
            item, container = types
            if container == DYN:
                return "bool"
            if isinstance(container, tuple) and _assignable(container[1], item):
                return "bool"
            raise fail()
        if name == "-_":
            if types[0] in ("int", "double", DYN):
                return types[0]
            raise fail()
        if special:
            raise fail("quantities have .add() and .sub(); semantic versions have no arithmetic")
        return self._arithmetic(name, types, fail)

    def _arithmetic(self, name: str, types: list[Type], fail: Any) -> Type:
        a, b = types
        if (name, a, b) in _TIME_ARITHMETIC:
            return _TIME_ARITHMETIC[(name, a, b)]
        if DYN in (a, b):
            return a if b == DYN and a != DYN and name != "_+_" else b if a == DYN and b != DYN else DYN
        if name == "_+_" and isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "list":
            return a if a == b else ("list", DYN)
        if a != b:
            raise fail(_literal_hint(types))
        allowed = {
            "_+_": ("int", "uint", "double", "string", "bytes"),
            "_-_": _NUMERIC,
            "_*_": _NUMERIC,
            "_/_": _NUMERIC,
            "_%_": ("int", "uint"),
        }[name]
        if a not in allowed:
            raise fail()
        return a

    def _function(self, node: ast.Call, name: str, member: bool, types: list[Type], arg_nodes: list[ast.Node]) -> Type:
        if name not in FUNCTIONS:
            if name in UNSUPPORTED:
                raise self.error(f"undeclared reference to '{name}': {UNSUPPORTED[name]}", node)
            close = difflib.get_close_matches(name, list(FUNCTIONS), n=1)
            hint = f"did you mean '{close[0]}'?" if close else None
            raise self.error(f"undeclared reference to '{name}'", node, hint=hint)
        candidates = tuple(
            o
            for o in FUNCTIONS[name]
            if o.member == member
            and len(o.params) == len(types)
            and all(_assignable(p, t) for p, t in zip(o.params, types, strict=True))
        )
        if not candidates:
            shown = (
                ", ".join(type_str(t) for t in types[1:] if member) if member else ", ".join(type_str(t) for t in types)
            )
            call = f"{type_str(types[0])}.{name}({shown})" if member else f"{name}({shown})"
            raise self.error(f"found no matching overload for {call}", node, hint=_function_hint(name, types, member))
        self.overloads[id(node)] = candidates
        if all(_known(t) for t in types) and len(candidates) == 1:
            self.exact.add(id(node))
        results = {_result(o.result, types) for o in candidates}
        return results.pop() if len(results) == 1 else DYN


def _result(result: Type, types: list[Type]) -> Type:
    """A call's result type; "elem", "arg0", "opt_arg0" and "inner0" derive it from the first argument."""
    first = types[0] if types else DYN
    if result in ("elem", "inner0"):
        return first[1] if isinstance(first, tuple) else DYN
    if result == "arg0":
        return first
    if result == "opt_arg0":
        return ("optional", first)
    return result


def _is_list(t: Type) -> bool:
    return isinstance(t, tuple) and t[0] == "list"


def _is_optional(t: Type) -> bool:
    return isinstance(t, tuple) and t[0] == "optional"


def _is_open(node: ast.Node) -> bool:
    """Whether the node's type has a free type parameter in cel-go ([], {}, optional.none(), and what is
    selected from them), which unifies with any other element type of the literal."""
    while True:
        if isinstance(node, ast.ListExpr | ast.MapExpr):
            return not (node.items if isinstance(node, ast.ListExpr) else node.entries)
        if isinstance(node, ast.Call):
            return node.function == "none" and isinstance(node.target, ast.Ident) and node.target.name == "optional"
        if isinstance(node, ast.Select | ast.Index):
            node = node.operand
            continue
        return False


def _equivalent(a: Type, b: Type) -> bool:
    """cel-go's Type.IsEquivalentType for literal elements: the same type; an element type left open by an
    empty literal ([] or {}) matches any."""
    if a == b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] and len(a) == len(b):
        return all(x == y or DYN in (x, y) or _equivalent(x, y) for x, y in zip(a[1:], b[1:], strict=True))
    return False


def _general(a: Type, b: Type) -> Type:
    """The more general of two mutually assignable types (dyn wins; list(dyn) over list(int))."""
    if DYN in (a, b):
        return DYN
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] and len(a) == len(b):
        return (a[0], *(_general(x, y) for x, y in zip(a[1:], b[1:], strict=True)))
    return a


def _field_size(name: str, operand: Size) -> Size:
    if name == "driver":
        return 63
    if name in ("attributes", "capacity"):
        return (DEVICE_MAP, (DEVICE_MAP, ATTRIBUTE_SIZE))
    return inner(operand)


def _index_size(node: ast.Index, operand: Size) -> Size:
    return inner(operand)


def _concat_size(a: Size, b: Size) -> Size:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (min(UNBOUNDED, length(a) + length(b)), _max_size(inner(a), inner(b)))
    return min(UNBOUNDED, length(a) + length(b))


def _const_int(node: ast.Node) -> int | None:
    return int(node.value) if isinstance(node, ast.Const) and node.type in ("int", "uint") else None


def _min_length(node: ast.Node) -> int:
    return len(node.value) if isinstance(node, ast.Const) and node.type in ("string", "bytes") else 0


def _call_size(name: str, args: list[ast.Node], sizes: list[Size]) -> Size | None:
    """The size of a call's result, for the functions whose result can be larger than their input."""
    if name == "replace" and len(args) >= 3:
        text, old, new = length(sizes[0]), _min_length(args[1]), length(sizes[2])
        limit = _const_int(args[3]) if len(args) == 4 else None
        places = text + 1 if old == 0 else text // old
        if limit is not None and limit >= 0:
            places = min(places, limit)
        return min(UNBOUNDED, text + places * new)
    if name == "join" and sizes:
        separator = length(sizes[1]) if len(sizes) > 1 else 0
        entries = length(sizes[0])
        return min(UNBOUNDED, entries * (length(inner(sizes[0])) + separator))
    if name in ("split", "findAll") and sizes:
        return (length(sizes[0]) + 1, sizes[0])
    if name == "strings.quote" and sizes:
        return min(UNBOUNDED, 2 * length(sizes[0]) + 2)
    if name in ("lowerAscii", "upperAscii", "trim", "substring", "reverse", "distinct", "sort", "slice") and sizes:
        return sizes[0]
    if name == "flatten" and sizes:
        return (footprint(sizes[0]), inner(inner(sizes[0])))
    if name == "lists.range" and args:
        count = _const_int(args[0])
        return (UNBOUNDED if count is None else max(0, count), 1)
    if name == "format" and len(sizes) == 2:
        return min(UNBOUNDED, length(sizes[0]) + footprint(sizes[1]) * 4)
    if name in ("string", "charAt", "find"):
        return sizes[0] if name != "charAt" else 1
    if name in ("value", "orValue", "or") and sizes:
        return _max_size(sizes[0], sizes[-1]) if name != "value" else sizes[0]
    if name in ("optional.of", "optional.ofNonZeroValue", "dyn") and sizes:
        return sizes[0]
    return None


def _call_cost(name: str, types: list[Type], sizes: list[Size], grown: Size | None) -> int:
    if name in REGEX_FUNCTIONS:
        return 64 + _traversal(sizes[0]) * 4
    if grown is not None:
        return 1 + _traversal(grown)
    if name in ("contains", "startsWith", "endsWith", "indexOf", "lastIndexOf") and sizes:
        return 1 + _traversal(sizes[0])
    if name in ("sets.contains", "sets.intersects", "sets.equivalent") and len(sizes) == 2:
        return 1 + length(sizes[0]) * length(sizes[1])
    if name in ("isSorted", "sum", "min", "max") and sizes:
        return 1 + length(sizes[0])
    return 1


def _literal_hint(types: list[Type]) -> str | None:
    kinds = set(types)
    if kinds == {"int", "double"}:
        return "CEL does not convert between int and double: write 1.0, or use double(x) / int(x)"
    if kinds == {"int", "uint"}:
        return "write unsigned literals with a u suffix (1u), or use int(x) / uint(x)"
    if "string" in kinds and kinds & {"int", "uint", "double", "bool"}:
        return 'compare like with like: quote numbers that are strings, or convert with int("...")'
    return None


def _function_hint(name: str, types: list[Type], member: bool) -> str | None:
    if name in ("compareTo", "isGreaterThan", "isLessThan") and member and len(types) == 2:
        if types[0] == "Quantity":
            return 'the argument must be a quantity too: quantity("40Gi")'
        if types[0] == "Semver":
            return 'the argument must be a version too: semver("1.2.3")'
        if types[0] == "string":
            return 'convert first: semver("...") or quantity("...")'
    if name in ("major", "minor", "patch") and types and types[0] == "string":
        return "convert first: semver(s).major()"
    if (
        name in ("lowerAscii", "upperAscii", "split", "trim", "startsWith", "endsWith", "contains")
        and types
        and types[0] in ("Semver", "Quantity")
    ):
        return "these functions take strings; versions and quantities are not strings"
    return None
