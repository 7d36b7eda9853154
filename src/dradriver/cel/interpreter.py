"""Turn a checked AST into a tree of Python closures: ``program(variables) -> value``.

Errors are ``CelEvaluationError`` exceptions. ``&&``, ``||``, ``exists`` and ``all`` absorb an error when
another operand decides the result (``false && error`` is false, ``error || true`` is true), as the CEL
specification requires; everything else propagates it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dradriver.cel import ast, values
from dradriver.cel.checker import CheckResult, Type
from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.library import Overload
from dradriver.cel.library import sort_by_keys as library_sort_by_keys
from dradriver.cel.named_formats import NamedFormat
from dradriver.cel.net_ext import CIDRValue, IPValue
from dradriver.cel.semver import Semver
from dradriver.cel.time_ext import Duration, Timestamp
from dradriver.cel.url_ext import URLValue
from dradriver.cel.values import NONE, CelType, OptionalValue, Uint, type_name
from dradriver.quantity import Quantity

Env = dict[str, Any]
Program = Callable[[Env], Any]
# The runtime cost budget, per evaluation, as Kubernetes sets cel.CostLimit(CELSelectorExpressionMaxCost):
# each comprehension iteration is charged the estimated cost of its body (the rest of the expression is
# already bounded by the compile-time estimate), and evaluation stops with an error once it is spent.
MAX_COST = 1_000_000
STEPS = "@steps"


class MissingKey(CelEvaluationError):
    """A map lookup found no such key."""


class DomainMap(dict[str, Any]):
    """``device.attributes`` / ``device.capacity``: an unknown domain gives an empty map, as in Kubernetes."""

    kind = "attribute"

    def missing(self, domain: str) -> AttributeMap:
        empty = AttributeMap()
        empty.domain, empty.kind = domain, self.kind
        return empty


class AttributeMap(dict[str, Any]):
    """The attributes (or capacities) of one domain; a missing name is an error naming the attribute."""

    domain = ""
    kind = "attribute"


def missing_key(mapping: dict[Any, Any], key: Any) -> CelEvaluationError:
    if isinstance(mapping, AttributeMap):
        qualified = f"{mapping.domain}/{key}"
        return MissingKey(
            f"no such key: {key} (the device has no {mapping.kind} {qualified})", missing_attribute=qualified
        )
    return MissingKey(f"no such key: {key!r}")


def select(mapping: Any, name: str) -> Any:
    if isinstance(mapping, dict):
        if name in mapping:
            return mapping[name]
        if isinstance(mapping, DomainMap):
            return mapping.missing(name)
        raise missing_key(mapping, name)
    raise CelEvaluationError(f"type '{type_name(mapping)}' does not support field selection")


def index(container: Any, key: Any) -> Any:
    if isinstance(container, dict):
        found, value = values.lookup(container, key)
        if found:
            return value
        if isinstance(container, DomainMap) and type(key) is str:
            return container.missing(key)
        raise missing_key(container, key)
    if isinstance(container, list):
        kind = type(key)
        if kind is float and key.is_integer():
            key = int(key)  # cel-go accepts a double index that is a whole number
        elif kind is not int and kind is not Uint:
            raise values.no_overload("_[_]", container, key)
        if not 0 <= key < len(container):
            raise CelEvaluationError(f"index out of range: {key}")
        return container[key]
    raise values.no_overload("_[_]", container, key)


def _runtime_match(param: Type, value: Any) -> bool:
    if param in ("any", "dyn"):
        return True
    if isinstance(param, tuple):
        param = param[0]
    kind = type(value)
    return {
        "int": kind is int,
        "uint": kind is Uint,
        "double": kind is float,
        "string": kind is str,
        "bytes": kind is bytes,
        "bool": kind is bool,
        "null": value is None,
        "list": kind is list,
        "map": isinstance(value, dict),
        "Quantity": kind is Quantity,
        "Semver": kind is Semver,
        "type": kind is CelType,
        "optional": kind is OptionalValue,
        "IP": kind is IPValue,
        "timestamp": kind is Timestamp,
        "duration": kind is Duration,
        "CIDR": kind is CIDRValue,
        "URL": kind is URLValue,
        "Format": kind is NamedFormat,
    }.get(param, False)


def _call_impl(name: str, impl: Callable[..., Any], args: list[Any]) -> Any:
    try:
        return impl(*args)
    except CelEvaluationError:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError) as err:
        raise CelEvaluationError(f"{name}: {err}") from None


def _over_budget() -> CelEvaluationError:
    return CelEvaluationError(f"operation cancelled: actual cost limit exceeded (the budget is {MAX_COST})")


def optional_select(value: Any, name: str) -> OptionalValue:
    """``value.?name``: optional.of(value.name) when present, optional.none() when not."""
    if type(value) is OptionalValue:
        if not value.has:
            return NONE
        value = value.value
    if isinstance(value, dict):
        if name in value:
            return OptionalValue(True, value[name])
        if isinstance(value, DomainMap):  # Kubernetes' map finds every domain (an empty one if absent)
            return OptionalValue(True, value.missing(name))
        return NONE
    raise CelEvaluationError(f"type '{type_name(value)}' does not support field selection")


def optional_index(container: Any, key: Any) -> OptionalValue:
    """``container[?key]``: optional.of(container[key]) when present, optional.none() when not."""
    if type(container) is OptionalValue:
        if not container.has:
            return NONE
        container = container.value
    if isinstance(container, dict):
        found, value = values.lookup(container, key)
        if not found and isinstance(container, DomainMap) and type(key) is str:
            return OptionalValue(True, container.missing(key))
        return OptionalValue(True, value) if found else NONE
    if isinstance(container, list):
        kind = type(key)
        if kind is float and key.is_integer():
            key = int(key)
        elif kind is not int and kind is not Uint:
            raise values.no_overload("_[?_]", container, key)
        return OptionalValue(True, container[key]) if 0 <= key < len(container) else NONE
    raise values.no_overload("_[?_]", container, key)


class Compiler:
    def __init__(self, checked: CheckResult) -> None:
        self.overloads = checked.overloads
        self.exact = checked.exact
        self.costs = checked.costs
        self.maybe_optional = checked.maybe_optional

    def compile(self, node: ast.Node) -> Program:
        method = getattr(self, "_" + type(node).__name__)
        program: Program = method(node)
        return program

    def _Const(self, node: ast.Const) -> Program:
        value = Uint(node.value) if node.type == "uint" else node.value
        return lambda env: value

    def _Ident(self, node: ast.Ident) -> Program:
        name = node.name
        if name in values.TYPE_NAMES:
            type_value = CelType(name)

            def ident_or_type(env: Env) -> Any:
                return env.get(name, type_value)

            return ident_or_type
        return lambda env: env[name]

    def _Select(self, node: ast.Select) -> Program:
        operand, name = self.compile(node.operand), node.field
        if node.optional:
            return lambda env: optional_select(operand(env), name)
        if id(node) not in self.maybe_optional:
            return lambda env: select(operand(env), name)

        def select_or_chain(env: Env) -> Any:
            value = operand(env)
            if type(value) is OptionalValue:  # optional.of(m).f is m.?f
                return optional_select(value, name)
            return select(value, name)

        return select_or_chain

    def _Has(self, node: ast.Has) -> Program:
        operand, name = self.compile(node.operand), node.field

        def has(env: Env) -> bool:
            mapping = operand(env)
            if type(mapping) is OptionalValue:
                if not mapping.has:
                    return False
                mapping = mapping.value
            if isinstance(mapping, DomainMap):
                return True  # Kubernetes' device maps find every domain, so has() is true for any
            if isinstance(mapping, dict):
                return name in mapping
            raise CelEvaluationError(f"has(): type '{type_name(mapping)}' does not support field selection")

        return has

    def _Index(self, node: ast.Index) -> Program:
        operand, key = self.compile(node.operand), self.compile(node.index)
        if node.optional:
            return lambda env: optional_index(operand(env), key(env))
        if id(node) not in self.maybe_optional:
            return lambda env: index(operand(env), key(env))

        def index_or_chain(env: Env) -> Any:
            container = operand(env)
            if type(container) is OptionalValue:
                return optional_index(container, key(env))
            return index(container, key(env))

        return index_or_chain

    def _ListExpr(self, node: ast.ListExpr) -> Program:
        items = [self.compile(item) for item in node.items]
        if not node.optional:
            return lambda env: [item(env) for item in items]
        optional = set(node.optional)

        def build_list(env: Env) -> list[Any]:
            result = []
            for position, item in enumerate(items):
                value = item(env)
                if position in optional:
                    if type(value) is not OptionalValue:
                        raise values.no_overload("optional list element", value)
                    if not value.has:
                        continue
                    value = value.value
                result.append(value)
            return result

        return build_list

    def _MapExpr(self, node: ast.MapExpr) -> Program:
        entries = [(self.compile(k), self.compile(v)) for k, v in node.entries]
        optional = set(node.optional)

        def build(env: Env) -> dict[Any, Any]:
            result: dict[Any, Any] = {}
            for position, (key_program, value_program) in enumerate(entries):
                key = key_program(env)
                if type(key) not in (str, int, Uint, bool):
                    raise CelEvaluationError(f"unsupported map key type: {type_name(key)}")
                if values.lookup(result, key)[0]:
                    raise CelEvaluationError(f"repeated key in map literal: {key!r}")
                value = value_program(env)
                if position in optional:
                    if type(value) is not OptionalValue:
                        raise values.no_overload("optional map entry", value)
                    if not value.has:
                        continue
                    value = value.value
                result[values.map_key(key)] = value
            return result

        return build

    def _Bind(self, node: ast.Bind) -> Program:
        init, body, var = self.compile(node.init), self.compile(node.body), node.var
        return lambda env: body({**env, var: init(env)})

    def _Comprehension(self, node: ast.Comprehension) -> Program:
        range_program, body = self.compile(node.range), self.compile(node.body)
        predicate = self.compile(node.predicate) if node.predicate is not None else None
        step_cost = 1 + self.costs.get(id(node.body), 1)
        if node.predicate is not None:
            step_cost += self.costs.get(id(node.predicate), 1)
        if node.kind in ("optMap", "optFlatMap"):
            return self._optional_macro(node.kind, range_program, body, node.var)
        return _Loop(node, range_program, body, predicate, step_cost).program()

    def _optional_macro(self, kind: str, range_program: Program, body: Program, var: str) -> Program:
        def optional_macro(env: Env) -> Any:
            value = range_program(env)
            if type(value) is not OptionalValue:
                raise values.no_overload(kind, value)
            if not value.has:
                return NONE
            result = body({**env, var: value.value})
            if kind == "optMap":
                return OptionalValue(True, result)
            if type(result) is not OptionalValue:
                raise values.no_overload(kind, result)
            return result

        return optional_macro

    def _Call(self, node: ast.Call) -> Program:
        name = node.function
        if name == "_&&_":
            return self._and(node)
        if name == "_||_":
            return self._or(node)
        if name == "_?_:_":
            return self._conditional(node)
        if name == "!_":
            operand = self.compile(node.args[0])

            def negate(env: Env) -> bool:
                value = operand(env)
                if type(value) is not bool:
                    raise values.no_overload("!_", value)
                return not value

            return negate
        operator = _OPERATORS.get(name)
        if operator is not None:
            args = [self.compile(a) for a in node.args]
            if len(args) == 1:
                (a,) = args
                return lambda env: operator(a(env))
            left, right = args
            return lambda env: operator(left(env), right(env))
        return self._function(node)

    def _and(self, node: ast.Call) -> Program:
        left, right = (self.compile(a) for a in node.args)

        def logical_and(env: Env) -> bool:
            error: CelEvaluationError | None = None
            try:
                a = left(env)
            except CelEvaluationError as err:
                error, a = err, None
            if a is False:
                return False
            try:
                b = right(env)
            except CelEvaluationError as err:
                error, b = error or err, None
            if b is False:
                return False
            if error is not None:
                raise error
            if a is True and b is True:
                return True
            raise values.no_overload("_&&_", a, b)

        return logical_and

    def _or(self, node: ast.Call) -> Program:
        left, right = (self.compile(a) for a in node.args)

        def logical_or(env: Env) -> bool:
            error: CelEvaluationError | None = None
            try:
                a = left(env)
            except CelEvaluationError as err:
                error, a = err, None
            if a is True:
                return True
            try:
                b = right(env)
            except CelEvaluationError as err:
                error, b = error or err, None
            if b is True:
                return True
            if error is not None:
                raise error
            if a is False and b is False:
                return False
            raise values.no_overload("_||_", a, b)

        return logical_or

    def _conditional(self, node: ast.Call) -> Program:
        condition, if_true, if_false = (self.compile(a) for a in node.args)

        def conditional(env: Env) -> Any:
            chosen = condition(env)
            if chosen is True:
                return if_true(env)
            if chosen is False:
                return if_false(env)
            raise values.no_overload("_?_:_", chosen)

        return conditional

    def _function(self, node: ast.Call) -> Program:
        candidates: tuple[Overload, ...] = self.overloads[id(node)]
        name = node.function
        target = node.target
        if target is not None and (not candidates[0].member):
            target = None  # a namespaced global function such as strings.quote
            name = f"{node.target.name}.{name}" if isinstance(node.target, ast.Ident) else name
        arg_programs = ([self.compile(target)] if target is not None else []) + [self.compile(a) for a in node.args]
        if id(node) in self.exact:
            impl = candidates[0].impl
            return lambda env: _call_impl(name, impl, [a(env) for a in arg_programs])

        def dispatch(env: Env) -> Any:
            args = [a(env) for a in arg_programs]
            for overload in candidates:
                if all(_runtime_match(p, v) for p, v in zip(overload.params, args, strict=True)):
                    return _call_impl(name, overload.impl, args)
            raise values.no_overload(name, *args)

        return dispatch


class _Loop:
    """The program of a comprehension macro (one or two variables)."""

    def __init__(
        self, node: ast.Comprehension, range_program: Program, body: Program, predicate: Program | None, step: int
    ) -> None:
        self.kind, self.var, self.var2 = node.kind, node.var, node.var2
        self.range_program, self.body, self.predicate, self.step_cost = range_program, body, predicate, step

    def pairs(self, env: Env) -> list[tuple[Any, Any]]:
        """The variables' values per iteration; the budget is charged here, before the loop runs."""
        container = self.range_program(env)
        if not isinstance(container, (list, dict)):
            raise CelEvaluationError(
                f"expression of type '{type_name(container)}' cannot be the range of a comprehension"
            )
        steps = env[STEPS]
        steps[0] += len(container) * self.step_cost
        if steps[0] > MAX_COST:
            raise _over_budget()
        if isinstance(container, dict):
            if self.var2 is None:
                return [(key, None) for key in values.map_keys(container)]
            return values.map_items(container)
        if self.var2 is None:
            return [(item, None) for item in container]
        return list(enumerate(container))

    def scope(self, env: Env, first: Any, second: Any) -> Env:
        inner = {**env, self.var: first}
        if self.var2 is not None:
            inner[self.var2] = second
        return inner

    def want_bool(self, result: Any) -> bool:
        if type(result) is not bool:
            raise values.no_overload(self.kind, result)
        return bool(result)

    def run_bool(self, env: Env, absorbing: bool) -> bool:
        # exists: true absorbs errors; all: false absorbs errors.
        error: CelEvaluationError | None = None
        for first, second in self.pairs(env):
            try:
                result = self.body(self.scope(env, first, second))
            except CelEvaluationError as err:
                error = error or err
                continue
            if result is absorbing:
                return bool(absorbing)
            if type(result) is not bool:
                error = error or values.no_overload(self.kind, result)
        if error is not None:
            raise error
        return not absorbing

    def kept(self, env: Env) -> list[Env]:
        scopes = [self.scope(env, first, second) for first, second in self.pairs(env)]
        if self.predicate is None:
            return scopes
        keep = self.predicate
        return [inner for inner in scopes if self.want_bool(keep(inner))]

    def exists_one(self, env: Env) -> bool:
        return sum(1 for inner in self.kept(env) if self.want_bool(self.body(inner))) == 1

    def filter(self, env: Env) -> list[Any]:
        return [first for first, _ in self.pairs(env) if self.want_bool(self.body(self.scope(env, first, None)))]

    def transform_list(self, env: Env) -> list[Any]:
        return [self.body(inner) for inner in self.kept(env)]

    def sort_by(self, env: Env) -> list[Any]:
        items = [first for first, _ in self.pairs(env)]
        return library_sort_by_keys(items, [self.body(self.scope(env, item, None)) for item in items])

    def transform_map(self, env: Env) -> dict[Any, Any]:
        return {values.map_key(inner[self.var]): self.body(inner) for inner in self.kept(env)}

    def transform_map_entry(self, env: Env) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for inner in self.kept(env):
            entry = self.body(inner)
            if not isinstance(entry, dict):
                raise values.no_overload("transformMapEntry", entry)
            for key, value in values.map_items(entry):
                if values.lookup(result, key)[0]:
                    raise CelEvaluationError(f"insert failed: key {key!r} already exists")
                result[values.map_key(key)] = value
        return result

    def program(self) -> Program:
        if self.kind == "exists":
            return lambda env: self.run_bool(env, True)
        if self.kind == "all":
            return lambda env: self.run_bool(env, False)
        programs: dict[str, Program] = {
            "exists_one": self.exists_one,
            "filter": self.filter,
            "map": self.transform_list,
            "transformList": self.transform_list,
            "sortBy": self.sort_by,
            "transformMap": self.transform_map,
            "transformMapEntry": self.transform_map_entry,
        }
        return programs[self.kind]


def _not_equals(a: Any, b: Any) -> bool:
    return not values.equals(a, b)


_OPERATORS: dict[str, Callable[..., Any]] = {
    "_==_": values.equals,
    "_!=_": _not_equals,
    "_<_": values.less,
    "_<=_": values.less_equal,
    "_>_": values.greater,
    "_>=_": values.greater_equal,
    "_+_": values.add,
    "_-_": values.subtract,
    "_*_": values.multiply,
    "_/_": values.divide,
    "_%_": values.modulo,
    "-_": values.negate,
    "_in_": lambda item, container: values.contains(container, item),
}
