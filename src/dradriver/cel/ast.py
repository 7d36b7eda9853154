"""A small abstract syntax tree for CEL, built from celpy's lark parse tree (see ``parser``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Positions are 1-based (line, column) in the expression text.
Pos = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Node:
    pos: Pos = field(compare=False)


@dataclass(frozen=True, slots=True)
class Const(Node):
    value: Any
    type: str  # int, uint, double, string, bytes, bool, null


@dataclass(frozen=True, slots=True)
class Ident(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Select(Node):
    """``operand.field``; ``operand.?field`` when ``optional`` (an optional value, none when absent)."""

    operand: Node
    field: str
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Has(Node):
    operand: Node
    field: str


@dataclass(frozen=True, slots=True)
class Index(Node):
    operand: Node
    index: Node
    optional: bool = False  # operand[?index]


@dataclass(frozen=True, slots=True)
class Call(Node):
    """A function call; ``target`` is the receiver of a member call (``x.f(a)``), else None.

    Operators are calls too, named as in cel-go: ``_+_``, ``_==_``, ``_in_``, ``!_``, ``-_``;
    ``_&&_``, ``_||_`` and ``_?_:_`` are evaluated lazily.
    """

    function: str
    target: Node | None
    args: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class ListExpr(Node):
    items: tuple[Node, ...]
    optional: tuple[int, ...] = ()  # positions of optional elements ([?e]): included only when e has a value


@dataclass(frozen=True, slots=True)
class MapExpr(Node):
    entries: tuple[tuple[Node, Node], ...]
    optional: tuple[int, ...] = ()  # positions of optional entries ({?k: v}): included only when v has a value


@dataclass(frozen=True, slots=True)
class Comprehension(Node):
    """A macro over a list or map: all, exists, exists_one, filter, map (``predicate`` filters map/3).

    With ``var2`` it is one of the two-variable macros (all, exists, existsOne, transformList, transformMap,
    transformMapEntry): ``var`` is the index or key and ``var2`` the element or value.
    """

    kind: str
    range: Node
    var: str
    body: Node
    predicate: Node | None = None
    var2: str | None = None


@dataclass(frozen=True, slots=True)
class Bind(Node):
    """``cel.bind(var, init, body)``."""

    var: str
    init: Node
    body: Node


def walk(node: Node) -> list[Node]:
    """Every node of the tree, parents before children."""
    out: list[Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(reversed(children(current)))
    return out


def children(node: Node) -> list[Node]:
    if isinstance(node, Select | Has):
        return [node.operand]
    if isinstance(node, Index):
        return [node.operand, node.index]
    if isinstance(node, Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    if isinstance(node, ListExpr):
        return list(node.items)
    if isinstance(node, MapExpr):
        return [part for entry in node.entries for part in entry]
    if isinstance(node, Comprehension):
        return [node.range, node.body] + ([node.predicate] if node.predicate is not None else [])
    if isinstance(node, Bind):
        return [node.init, node.body]
    return []
