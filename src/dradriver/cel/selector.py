"""Compiled device selectors with memoised evaluation.

A selector reads few attributes, and on real nodes most devices share their values, so ``matches``
evaluates the expression once per distinct combination of the values it reads (its *projection*) and
answers every other device from that memo.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dradriver.cel import ast
from dradriver.cel.checker import Checker
from dradriver.cel.environment import VARIABLES, device_value
from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.interpreter import STEPS, Compiler, Program
from dradriver.cel.parser import parse

MEMO_LIMIT = 100_000
_MISSING = object()
Projection = Callable[[dict[str, Any], str], Any]


class Selector:
    """One compiled CEL selector; thread-compatible (the memo is a plain dict of immutable entries)."""

    def __init__(
        self,
        expression: str,
        tree: ast.Node,
        program: Program,
        *,
        projection: Projection,
        reads: tuple[tuple[str, ...], ...],
        cost: int,
    ) -> None:
        self.expression = expression
        self.tree = tree
        self.reads = reads
        self.estimated_cost = cost
        self._program = program
        self._projection = projection
        self._memo: dict[Any, bool | CelEvaluationError] = {}
        self.evaluations = 0

    def evaluate(self, device: dict[str, Any], *, driver: str) -> Any:
        """The raw result for ``device`` (no memo, no bool check); raises CelEvaluationError."""
        self.evaluations += 1
        variables = {"device": device_value(device, driver), STEPS: [0]}
        try:
            return self._program(variables)
        except RecursionError:
            raise CelEvaluationError("expression too deeply nested to evaluate") from None

    def matches(self, device: dict[str, Any], *, driver: str, memoize: bool = True) -> bool:
        """Whether ``device`` (a Device of a ResourceSlice from ``driver``) satisfies the selector.

        Raises CelEvaluationError when the expression fails for this device (e.g. a missing attribute not
        guarded by ``in`` / ``has()``) or yields something other than a bool.
        """
        if not memoize:
            return self._decide(device, driver)
        key = self._projection(device, driver)
        entry = self._memo.get(key)
        if entry is None:
            try:
                entry = self._decide(device, driver)
            except CelEvaluationError as err:
                entry = err
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = entry
        if isinstance(entry, bool):
            return entry
        raise CelEvaluationError(entry.message, missing_attribute=entry.missing_attribute)

    def _decide(self, device: dict[str, Any], driver: str) -> bool:
        result = self.evaluate(device, driver=driver)
        if type(result) is not bool:
            raise CelEvaluationError(f"the selector evaluated to {type(result).__name__} {result!r}, not a bool")
        return result

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile a DRA device selector (``spec.selectors[].cel.expression``); cached per expression.

    Raises CelCompileError (with line, column and a hint) for syntax errors, unknown variables, fields or
    functions, calls that cannot match any overload, a result that is not a bool, or a cost above the
    Kubernetes limit.
    """
    tree = parse(expression)
    checked = Checker(expression, VARIABLES).check(tree)
    program = Compiler(checked).compile(tree)
    reads = device_reads(tree)
    return Selector(expression, tree, program, projection=_projection(reads), reads=reads, cost=checked.cost)


def compile_expression(expression: str) -> Callable[[], Any]:
    """Compile any CEL expression of the selector environment, whatever its result type, into a function
    that evaluates it without a device (for tests and tools; selectors go through ``compile_selector``)."""
    tree = parse(expression)
    checked = Checker(expression, VARIABLES).check(tree, want_bool=False)
    program = Compiler(checked).compile(tree)

    def evaluate() -> Any:
        try:
            return program({STEPS: [0]})
        except RecursionError:
            raise CelEvaluationError("expression too deeply nested to evaluate") from None

    return evaluate


def device_reads(tree: ast.Node) -> tuple[tuple[str, ...], ...]:
    """What of ``device`` the expression can read: ("driver",), ("attribute", domain, name),
    ("attribute-domain", domain), ("attributes",), the same for capacity, ("allowMultipleAllocations",),
    or ("device",) when it uses the variable in a way this analysis does not follow."""
    parents: dict[int, ast.Node] = {}
    for node in ast.walk(tree):
        for child in ast.children(node):
            parents[id(child)] = node
    shadowed = any(
        isinstance(n, ast.Comprehension | ast.Bind) and "device" in (n.var, getattr(n, "var2", None))
        for n in ast.walk(tree)
    )
    reads: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Ident) and node.name == "device"):
            continue
        if shadowed:
            return (("device",),)
        reads.add(_read_of(node, parents))
    if ("device",) in reads:
        return (("device",),)
    return tuple(sorted(reads))


def _read_of(node: ast.Node, parents: dict[int, ast.Node]) -> tuple[str, ...]:
    parent = parents.get(id(node))
    if not isinstance(parent, ast.Select):
        return ("device",)
    if parent.field in ("driver", "allowMultipleAllocations"):
        return (parent.field,)
    if parent.field not in ("attributes", "capacity"):
        return ("device",)
    kind = "attribute" if parent.field == "attributes" else "capacity"
    domain_node = parents.get(id(parent))
    if not (
        isinstance(domain_node, ast.Index)
        and domain_node.operand is parent
        and isinstance(domain_node.index, ast.Const)
        and domain_node.index.type == "string"
    ):
        return (kind + "s",)
    domain = str(domain_node.index.value)
    name_node = parents.get(id(domain_node))
    if isinstance(name_node, ast.Select | ast.Has) and name_node.operand is domain_node:
        return (kind, domain, name_node.field)
    if (
        isinstance(name_node, ast.Index)
        and name_node.operand is domain_node
        and isinstance(name_node.index, ast.Const)
        and name_node.index.type == "string"
    ):
        return (kind, domain, str(name_node.index.value))
    if (
        isinstance(name_node, ast.Call)
        and name_node.function == "_in_"
        and name_node.args[1] is domain_node
        and isinstance(name_node.args[0], ast.Const)
        and name_node.args[0].type == "string"
    ):
        return (kind, domain, str(name_node.args[0].value))
    return (kind + "-domain", domain)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _projection(reads: tuple[tuple[str, ...], ...]) -> Projection:
    """A function device → hashable key that differs whenever a value the expression reads differs."""
    if reads == (("device",),):
        return lambda device, driver: (
            driver,
            _freeze(device.get("attributes")),
            _freeze(device.get("capacity")),
            device.get("allowMultipleAllocations"),
        )
    getters: list[Callable[[dict[str, Any], str], Any]] = []
    for read in reads:
        getters.append(_getter(read))
    if len(getters) == 1:
        (only,) = getters
        return lambda device, driver: (driver, only(device, driver))
    return lambda device, driver: (driver, *[g(device, driver) for g in getters])


def _getter(read: tuple[str, ...]) -> Callable[[dict[str, Any], str], Any]:
    what = read[0]
    if what == "driver":
        return lambda device, driver: None  # the driver is part of every key
    if what == "allowMultipleAllocations":
        return lambda device, driver: device.get("allowMultipleAllocations")
    field = "attributes" if what.startswith("attribute") else "capacity"
    if what in ("attribute", "capacity"):
        domain, name = read[1], read[2]
        qualified = f"{domain}/{name}"

        def one(device: dict[str, Any], driver: str) -> Any:
            entries = device.get(field)
            if not entries:
                return _MISSING
            value = entries.get(qualified, _MISSING)
            if value is _MISSING and domain == driver:
                value = entries.get(name, _MISSING)
            if isinstance(value, dict):
                return (
                    tuple(value.items())
                    if len(value) == 1 and not isinstance(next(iter(value.values())), (list, dict))
                    else _freeze(value)
                )
            return value

        return one
    if what in ("attribute-domain", "capacity-domain"):
        domain = read[1]
        prefix = domain + "/"

        def whole_domain(device: dict[str, Any], driver: str) -> Any:
            entries = device.get(field) or {}
            return _freeze(
                {k: v for k, v in entries.items() if k.startswith(prefix) or (domain == driver and "/" not in k)}
            )

        return whole_domain
    return lambda device, driver: _freeze(device.get(field))
