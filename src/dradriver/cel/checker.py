"""A static checking pass: names, overloads and result type, as cel-go's checker does at compile time.

celpy has no type checker, so without this pass an unknown function or a comparison of a quantity with
an int would only fail when a device is evaluated. The checker infers a type for every node (``dyn`` where
it cannot know, e.g. attribute values), rejects what cannot work for any device, estimates a worst-case
cost, and records the overloads a call may take so the interpreter dispatches among those only.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from dradriver.cel import ast
from dradriver.cel.errors import CelCompileError
from dradriver.cel.library import FUNCTIONS, UNSUPPORTED, Overload
from dradriver.cel.values import TYPE_NAMES

Type = Any
DYN = "dyn"
MAX_COST = 1_000_000  # resource.k8s.io: CELSelectorExpressionMaxCost
_NUMERIC = ("int", "uint", "double")
_ORDERED = ("int", "uint", "double", "string", "bytes", "bool")


@dataclass(frozen=True)
class ObjectType:
    name: str
    fields: dict[str, Type]


@dataclass
class CheckResult:
    type: Type
    cost: int
    overloads: dict[int, tuple[Overload, ...]] = field(default_factory=dict)
    exact: set[int] = field(default_factory=set)  # calls whose argument types are all statically known


def type_str(t: Type) -> str:
    if isinstance(t, ObjectType):
        return t.name
    if isinstance(t, tuple):
        return f"{t[0]}({', '.join(type_str(p) for p in t[1:])})"
    names = {"Quantity": "kubernetes.Quantity", "Semver": "kubernetes.Semver", "null": "null_type"}
    return str(names.get(t, t))


def _assignable(param: Type, arg: Type) -> bool:
    if param == "any" or DYN in (arg, param):
        return True
    if param == "list":
        return isinstance(arg, tuple) and arg[0] == "list"
    if param == "map":
        return isinstance(arg, tuple) and arg[0] == "map"
    if isinstance(param, tuple) and isinstance(arg, tuple):
        return param[0] == arg[0] and all(_assignable(p, a) for p, a in zip(param[1:], arg[1:], strict=True))
    return bool(param == arg)


def _known(t: Type) -> bool:
    if t == DYN:
        return False
    if isinstance(t, tuple):
        return all(_known(p) for p in t[1:])
    return True


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

    def error(self, message: str, node: ast.Node, hint: str | None = None) -> CelCompileError:
        return CelCompileError(message, expression=self.expression, line=node.pos[0], column=node.pos[1], hint=hint)

    def check(self, root: ast.Node) -> CheckResult:
        result_type, cost = self.visit(root, dict(self.variables))
        if result_type not in ("bool", DYN):
            raise self.error(
                f"a selector must evaluate to bool, not {type_str(result_type)}",
                root,
                hint='compare the value, e.g. ... == "value" or ....compareTo(...) >= 0',
            )
        if cost > MAX_COST:
            raise self.error(
                f"estimated cost {cost} exceeds the limit of {MAX_COST}",
                root,
                hint="avoid nested comprehensions over large lists",
            )
        return CheckResult(result_type, cost, self.overloads, self.exact)

    def visit(self, node: ast.Node, scope: dict[str, Type]) -> tuple[Type, int]:
        method = getattr(self, "_" + type(node).__name__)
        result: tuple[Type, int] = method(node, scope)
        return result

    def _Const(self, node: ast.Const, scope: dict[str, Type]) -> tuple[Type, int]:
        return node.type, 0

    def _Ident(self, node: ast.Ident, scope: dict[str, Type]) -> tuple[Type, int]:
        if node.name in scope:
            return scope[node.name], 1
        if node.name in TYPE_NAMES:
            return "type", 0
        names = [*scope, *TYPE_NAMES]
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
        return self._select_type(node, operand), cost + 1

    def _Has(self, node: ast.Has, scope: dict[str, Type]) -> tuple[Type, int]:
        operand, cost = self.visit(node.operand, scope)
        self._select_type(node, operand)
        return "bool", cost + 1

    def _Index(self, node: ast.Index, scope: dict[str, Type]) -> tuple[Type, int]:
        operand, cost = self.visit(node.operand, scope)
        index, index_cost = self.visit(node.index, scope)
        total = cost + index_cost + 1
        if isinstance(operand, tuple) and operand[0] == "list":
            if index not in ("int", "uint", DYN):
                raise self.error(f"a list index must be an int, not {type_str(index)}", node.index)
            return operand[1], total
        if isinstance(operand, tuple) and operand[0] == "map":
            if not _assignable(operand[1], index):
                raise self.error(
                    f"a key of {type_str(operand)} must be {type_str(operand[1])}, not {type_str(index)}",
                    node.index,
                )
            return operand[2], total
        if operand == DYN:
            return DYN, total
        hint = "use .charAt(i) or .substring(i, j)" if operand == "string" else None
        raise self.error(
            f"found no matching overload for '_[_]' applied to '({type_str(operand)}, {type_str(index)})'",
            node,
            hint=hint,
        )

    def _ListExpr(self, node: ast.ListExpr, scope: dict[str, Type]) -> tuple[Type, int]:
        types, cost = [], 1
        for item in node.items:
            t, c = self.visit(item, scope)
            types.append(t)
            cost += c
        return ("list", _join(types) if types else DYN), cost

    def _MapExpr(self, node: ast.MapExpr, scope: dict[str, Type]) -> tuple[Type, int]:
        keys, values, cost = [], [], 1
        for key_node, value_node in node.entries:
            k, kc = self.visit(key_node, scope)
            v, vc = self.visit(value_node, scope)
            if k not in ("int", "uint", "bool", "string", DYN):
                raise self.error(f"unsupported map key type {type_str(k)}", key_node)
            keys.append(k)
            values.append(v)
            cost += kc + vc
        return ("map", _join(keys) if keys else DYN, _join(values) if values else DYN), cost

    def _Comprehension(self, node: ast.Comprehension, scope: dict[str, Type]) -> tuple[Type, int]:
        range_type, range_cost = self.visit(node.range, scope)
        if isinstance(range_type, tuple):
            element = range_type[1]
        elif range_type == DYN:
            element = DYN
        else:
            raise self.error(
                f"expression of type '{type_str(range_type)}' cannot be the range of a comprehension ({node.kind})",
                node.range,
            )
        inner = {**scope, node.var: element}
        body_type, body_cost = self.visit(node.body, inner)
        predicate_cost = 0
        if node.predicate is not None:
            predicate_type, predicate_cost = self.visit(node.predicate, inner)
            self._want_bool(predicate_type, node.predicate, node.kind)
        if node.kind != "map":
            self._want_bool(body_type, node.body, node.kind)
        size = _range_size(node.range, range_type)
        cost = range_cost + size * (body_cost + predicate_cost + 1)
        if node.kind == "map":
            return ("list", body_type), cost
        if node.kind == "filter":
            return range_type if isinstance(range_type, tuple) and range_type[0] == "list" else (
                "list",
                element,
            ), cost
        return "bool", cost

    def _want_bool(self, t: Type, node: ast.Node, what: str) -> None:
        if t not in ("bool", DYN):
            raise self.error(f"the predicate of {what}() must be bool, not {type_str(t)}", node)

    def _Bind(self, node: ast.Bind, scope: dict[str, Type]) -> tuple[Type, int]:
        init_type, init_cost = self.visit(node.init, scope)
        body_type, body_cost = self.visit(node.body, {**scope, node.var: init_type})
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
        arg_nodes = ([target] if target is not None else []) + list(node.args)
        types, cost = [], 1
        for arg in arg_nodes:
            t, c = self.visit(arg, scope)
            types.append(t)
            cost += c
        if name.startswith("_") or name == "-_":
            return self._operator(node, name, types), cost
        result = self._function(node, name, target is not None, types, arg_nodes)
        return result, cost + _call_cost(name, types)

    def _logical(self, node: ast.Call, scope: dict[str, Type]) -> tuple[Type, int]:
        results = [self.visit(arg, scope) for arg in node.args]
        cost = sum(c for _, c in results) + 1
        types = [t for t, _ in results]
        if node.function == "_?_:_":
            if types[0] not in ("bool", DYN):
                raise self.error(f"the condition of ?: must be bool, not {type_str(types[0])}", node.args[0])
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
        a, b = types
        if special:
            raise fail("quantities have .add() and .sub(); semantic versions have no arithmetic")
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
                raise self.error(
                    f"function '{name}' is part of Kubernetes' CEL but this evaluator does not provide it",
                    node,
                )
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
    if result == "elem":
        first = types[0]
        return first[1] if isinstance(first, tuple) else DYN
    return result


def _range_size(node: ast.Node, range_type: Type) -> int:
    if isinstance(node, ast.ListExpr):
        return len(node.items)
    if isinstance(node, ast.MapExpr):
        return len(node.entries)
    return 64  # device maps hold ≤32 entries and strings ≤64 characters, so splits give ≤64 parts


def _call_cost(name: str, types: list[Type]) -> int:
    if name in ("matches", "find", "findAll"):
        return 64
    return 1 if name not in ("split", "join", "replace", "lowerAscii", "upperAscii") else 8


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
