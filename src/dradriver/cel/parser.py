"""Parse CEL text with celpy's grammar (lark) and convert the parse tree into ``ast`` nodes."""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

import lark
from celpy.celparser import CELParseError, CELParser

from dradriver.cel import ast
from dradriver.cel.errors import CelCompileError
from dradriver.cel.literals import LiteralError, decode
from dradriver.cel.optional_syntax import MARKER, original_position, rewrite

MAX_EXPRESSION_LENGTH = 10 * 1024  # resource.k8s.io: CELSelectorExpressionMaxLength
# cel-go's parser stops at 250 levels of one construct ("expression recursion limit exceeded: 250"); the
# same limit holds here for brackets and for the depth of the tree (operator, member and call chains), so
# checking and evaluating stay within a bounded stack.
MAX_NESTING = 250
# Rules with one child pass it on; the converter skips them in a loop instead of recursing.
_PASS_THROUGH = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary"}
_PASS_THROUGH |= {"member", "primary"}

# (macro, number of arguments) → (comprehension kind, number of variables). The two-variable forms are
# cel-go's ext.TwoVarComprehensions (Kubernetes 1.32+); optMap/optFlatMap come with optional types.
_MACRO_SHAPES = {
    ("all", 2): ("all", 1),
    ("exists", 2): ("exists", 1),
    ("exists_one", 2): ("exists_one", 1),
    ("filter", 2): ("filter", 1),
    ("map", 2): ("map", 1),
    ("map", 3): ("map", 1),
    ("all", 3): ("all", 2),
    ("exists", 3): ("exists", 2),
    ("existsOne", 3): ("exists_one", 2),
    ("transformList", 3): ("transformList", 2),
    ("transformList", 4): ("transformList", 2),
    ("transformMap", 3): ("transformMap", 2),
    ("transformMap", 4): ("transformMap", 2),
    ("transformMapEntry", 3): ("transformMapEntry", 2),
    ("transformMapEntry", 4): ("transformMapEntry", 2),
    ("optMap", 2): ("optMap", 1),
    ("optFlatMap", 2): ("optFlatMap", 1),
    ("sortBy", 2): ("sortBy", 1),
}
_BINARY = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "_in_",
    "addition_add": "_+_",
    "addition_sub": "_-_",
    "multiplication_mul": "_*_",
    "multiplication_div": "_/_",
    "multiplication_mod": "_%_",
}
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

Tree = lark.Tree[Any]


@functools.cache
def _parser() -> CELParser:
    return CELParser()


def parse(expression: str) -> ast.Node:
    """The AST of ``expression``; raises CelCompileError (with line and column) when it is not valid CEL."""
    if not expression.strip():
        raise CelCompileError(
            "the expression is empty",
            expression=expression,
            hint='write a boolean expression, e.g. device.driver == "gpu.dradriver.dev"',
        )
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(
            f"the expression is {len(expression)} characters long, more than the "
            f"{MAX_EXPRESSION_LENGTH} Kubernetes accepts",
            expression=expression,
        )
    _check_nesting(expression)
    text, origin = rewrite(expression)
    try:
        tree = _parser().parse(text)
    except CELParseError as err:
        line, column = original_position(
            expression, text, origin, getattr(err, "line", None) or 1, getattr(err, "column", None) or 1
        )
        raise CelCompileError(
            f"syntax error: {_unexpected(expression, line, column)}",
            expression=expression,
            line=line,
            column=column,
            hint=_syntax_hint(expression),
        ) from None
    return _Converter(expression, text, origin).convert(tree)


def ensure_stack_headroom() -> None:
    """Let an expression nested up to MAX_NESTING levels be converted, checked and evaluated from a deep caller.

    Each level takes a few Python frames in each pass; Python's default limit of 1,000 frames would leave
    too little room under a deep caller. Raised once, when this module is imported (never lowered), so
    the limit does not change while a caller runs; CPython 3.11+ keeps Python-to-Python calls off the C
    stack, so the higher limit costs no C stack.
    """
    wanted = 2_000 + 16 * MAX_NESTING
    if sys.getrecursionlimit() < wanted:
        sys.setrecursionlimit(wanted)


ensure_stack_headroom()


def _unexpected(expression: str, line: int, column: int) -> str:
    lines = expression.splitlines() or [""]
    text = lines[min(line, len(lines)) - 1][column - 1 :]
    if not text.strip():
        return "the expression ends too early"
    return f"unexpected {text[:24]!r}" + ("…" if len(text) > 24 else "")


def _syntax_hint(expression: str) -> str | None:
    if re.search(r"(?<![=!<>])=(?!=)", expression):
        return "CEL compares with '==', not '='"
    if "'" not in expression and '"' not in expression and re.search(r"==\s*[A-Za-z]", expression):
        return "string values need quotes"
    if re.search(r"\band\b|\bor\b|\bnot\b", expression):
        return "CEL uses '&&', '||' and '!'"
    return None


def _check_nesting(expression: str) -> None:
    depth = 0
    for index, char in enumerate(expression):
        if char in "([{":
            depth += 1
            if depth > MAX_NESTING:
                line = expression.count("\n", 0, index) + 1
                raise CelCompileError(
                    f"expression nested more than {MAX_NESTING} levels deep",
                    expression=expression,
                    line=line,
                    column=index + 1,
                )
        elif char in ")]}":
            depth -= 1


def _pos(item: Any) -> ast.Pos:
    if isinstance(item, lark.Token):
        return (item.line or 1, item.column or 1)
    meta = getattr(item, "meta", None)
    if meta is not None and not getattr(meta, "empty", True) and meta.line is not None:
        return (meta.line, meta.column or 1)
    if isinstance(item, lark.Tree):
        for token in item.scan_values(lambda v: isinstance(v, lark.Token)):
            return (token.line or 1, token.column or 1)
    return (1, 1)


class _Converter:
    def __init__(self, expression: str, text: str, origin: list[int] | None) -> None:
        self.expression = expression
        self.text = text
        self.origin = origin
        self.depth = 0

    def pos(self, item: Any) -> ast.Pos:
        line, column = _pos(item)
        return original_position(self.expression, self.text, self.origin, line, column)

    def error(self, message: str, at: Any, hint: str | None = None) -> CelCompileError:
        line, column = self.pos(at)
        return CelCompileError(message, expression=self.expression, line=line, column=column, hint=hint)

    def convert(self, tree: Tree) -> ast.Node:
        while (
            (tree.data in _PASS_THROUGH or tree.data == "paren_expr")
            and len(tree.children) == 1
            and isinstance(tree.children[0], lark.Tree)
        ):
            tree = tree.children[0]  # parentheses are limited by _check_nesting
        method = getattr(self, "_" + str(tree.data), None)
        if method is None:
            raise self.error(f"unsupported syntax ({tree.data})", tree)
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(
                f"expression nested more than {MAX_NESTING} levels deep (operator, member or call chains)",
                tree,
                hint="shorten the chain, e.g. with cel.bind(name, value, expression)",
            )
        try:
            node: ast.Node = method(tree)
        finally:
            self.depth -= 1
        return node

    def _expr(self, tree: Tree) -> ast.Node:
        kids = tree.children
        if len(kids) == 1:
            return self.convert(kids[0])
        return ast.Call(self.pos(tree), "_?_:_", None, tuple(self.convert(k) for k in kids))

    def _logical(self, tree: Tree, name: str) -> ast.Node:
        # a && b && c … is a left-leaning chain in the parse tree; cel-go builds a balanced tree (the
        # operators are associative, errors included), so long chains stay shallow. So do we.
        operands: list[Tree] = []
        current = tree
        while current.data == tree.data and len(current.children) == 2:
            operands.append(current.children[1])
            current = current.children[0]
        operands.append(current)
        operands.reverse()
        self.depth += 1
        try:
            nodes = [self.convert(o) for o in operands]
        finally:
            self.depth -= 1
        return self._balance(nodes, name, self.pos(tree))

    def _balance(self, nodes: list[ast.Node], name: str, pos: ast.Pos) -> ast.Node:
        if len(nodes) == 1:
            return nodes[0]
        middle = len(nodes) // 2
        left, right = self._balance(nodes[:middle], name, pos), self._balance(nodes[middle:], name, pos)
        return ast.Call(pos, name, None, (left, right))

    def _conditionalor(self, tree: Tree) -> ast.Node:
        return self._logical(tree, "_||_")

    def _conditionaland(self, tree: Tree) -> ast.Node:
        return self._logical(tree, "_&&_")

    def _binary(self, tree: Tree) -> ast.Node:
        kids = tree.children
        if len(kids) == 1:
            return self.convert(kids[0])
        op_tree, right = kids
        name = _BINARY[str(op_tree.data)]
        left = self.convert(op_tree.children[0])
        return ast.Call(self.pos(op_tree), name, None, (left, self.convert(right)))

    _relation = _binary
    _addition = _binary
    _multiplication = _binary

    def _unary(self, tree: Tree) -> ast.Node:
        # A run of one operator collapses by parity, as in cel-go: !!x is x, !!!x is !x (so 300 "!" in a
        # row is one node, not 300 nested ones).
        ops: list[Tree] = []
        current = tree
        while current.data == "unary" and len(current.children) == 2:
            ops.append(current.children[0])
            current = current.children[1]
        operand = current
        node = self.convert(operand)
        runs: list[tuple[str, int, Tree]] = []
        for op in reversed(ops):  # innermost first
            name = "!_" if op.data == "unary_not" else "-_"
            if runs and runs[-1][0] == name:
                runs[-1] = (name, runs[-1][1] + 1, op)
            else:
                runs.append((name, 1, op))
        for index, (name, count, op) in enumerate(runs):
            if count % 2 == 0:
                continue
            literal = (
                index == 0
                and name == "-_"
                and isinstance(node, ast.Const)
                and node.type in ("int", "double")
                and operand.data == "unary"
                and not str(_first_token(operand)).startswith("-")
            )
            if literal and isinstance(node, ast.Const):
                value = -node.value
                if node.type == "int" and not INT64_MIN <= value <= INT64_MAX:
                    raise self.error("integer literal out of range", tree)
                node = ast.Const(self.pos(tree), value, node.type)
            else:
                node = ast.Call(self.pos(op), name, None, (node,))
        return node

    def _member(self, tree: Tree) -> ast.Node:
        return self.convert(tree.children[0])

    _primary = _member

    def _member_dot(self, tree: Tree) -> ast.Node:
        operand, name = tree.children
        field = str(name)
        if field.startswith(MARKER):
            return ast.Select(self.pos(name), self.convert(operand), field[len(MARKER) :], optional=True)
        return ast.Select(self.pos(name), self.convert(operand), field)

    def _member_dot_arg(self, tree: Tree) -> ast.Node:
        operand_tree, name = tree.children[0], str(tree.children[1])
        arg_trees = tree.children[2].children if len(tree.children) > 2 else []
        pos = self.pos(tree.children[1])
        operand = self.convert(operand_tree)
        if isinstance(operand, ast.Ident) and operand.name == "cel" and name == "bind":
            if len(arg_trees) != 3:
                raise self.error("cel.bind needs three arguments: cel.bind(name, value, expression)", tree)
            var = self.convert(arg_trees[0])
            if not isinstance(var, ast.Ident):
                raise self.error("the first argument of cel.bind must be a simple name", arg_trees[0])
            return ast.Bind(pos, var.name, self.convert(arg_trees[1]), self.convert(arg_trees[2]))
        shape = _MACRO_SHAPES.get((name, len(arg_trees)))
        if shape is not None:
            kind, variables = shape
            names = []
            for var_tree in arg_trees[:variables]:
                var = self.convert(var_tree)
                if not isinstance(var, ast.Ident):
                    raise self.error(
                        f"the variables of {name}() must be simple names",
                        var_tree,
                        hint=f"write e.g. list.{name}(x, x > 0)",
                    )
                names.append(var.name)
            if variables == 2 and names[0] == names[1]:
                raise self.error(f"{name}(): the two variables must have different names", arg_trees[1])
            rest = [self.convert(a) for a in arg_trees[variables:]]
            body, predicate = (rest[1], rest[0]) if len(rest) == 2 else (rest[0], None)
            var2 = names[1] if variables == 2 else None
            return ast.Comprehension(pos, kind, operand, names[0], body, predicate, var2)
        return ast.Call(pos, name, operand, tuple(self.convert(a) for a in arg_trees))

    def _member_index(self, tree: Tree) -> ast.Node:
        operand, index = tree.children
        key = self.convert(index)
        if _is_marker(key):
            assert isinstance(key, ast.Call)
            return ast.Index(self.pos(tree), self.convert(operand), key.args[0], optional=True)
        return ast.Index(self.pos(tree), self.convert(operand), key)

    def _member_object(self, tree: Tree) -> ast.Node:
        raise self.error("message construction (Type{field: value}) is not available in device selectors", tree)

    def _ident(self, tree: Tree) -> ast.Node:
        token = tree.children[0]
        return ast.Ident(self.pos(token), str(token))

    _dot_ident = _ident

    def _ident_arg(self, tree: Tree) -> ast.Node:
        token = tree.children[0]
        args = tuple(self.convert(a) for a in tree.children[1].children) if len(tree.children) > 1 else ()
        if str(token) == "has":
            if len(args) != 1 or not isinstance(args[0], ast.Select):
                raise self.error(
                    "has() needs one field selection argument, e.g. has(m.field)",
                    tree,
                    hint='for attributes: has(device.attributes["domain"].name) or '
                    '"name" in device.attributes["domain"]',
                )
            return ast.Has(self.pos(token), args[0].operand, args[0].field)
        return ast.Call(self.pos(token), str(token), None, args)

    _dot_ident_arg = _ident_arg

    def _paren_expr(self, tree: Tree) -> ast.Node:
        return self.convert(tree.children[0])

    def _list_lit(self, tree: Tree) -> ast.Node:
        items = [self.convert(a) for a in tree.children[0].children] if tree.children and tree.children[0] else []
        optional = tuple(i for i, item in enumerate(items) if _is_marker(item))
        plain = tuple(item.args[0] if isinstance(item, ast.Call) and _is_marker(item) else item for item in items)
        return ast.ListExpr(self.pos(tree), plain, optional)

    def _map_lit(self, tree: Tree) -> ast.Node:
        parts = [self.convert(a) for a in tree.children[0].children] if tree.children and tree.children[0] else []
        keys = parts[0::2]
        optional = tuple(i for i, key in enumerate(keys) if _is_marker(key))
        keys = [key.args[0] if isinstance(key, ast.Call) and _is_marker(key) else key for key in keys]
        return ast.MapExpr(self.pos(tree), tuple(zip(keys, parts[1::2], strict=True)), optional)

    def _literal(self, tree: Tree) -> ast.Node:
        token: Any = tree.children[0]
        kind, text, pos = token.type, str(token), self.pos(token)
        if kind == "INT_LIT":
            value = _int(text)
            if not INT64_MIN <= value <= INT64_MAX:
                raise self.error(f"integer literal {text} out of the int64 range", token)
            return ast.Const(pos, value, "int")
        if kind == "UINT_LIT":
            value = _int(text[:-1])
            if not 0 <= value <= UINT64_MAX:
                raise self.error(f"unsigned literal {text} out of the uint64 range", token)
            return ast.Const(pos, value, "uint")
        if kind == "FLOAT_LIT":
            return ast.Const(pos, float(text), "double")
        if kind in ("STRING_LIT", "MLSTRING_LIT", "BYTES_LIT"):
            try:
                decoded = decode(text)
            except LiteralError as err:
                raise self.error(str(err), token) from None
            return ast.Const(pos, decoded, "bytes" if isinstance(decoded, bytes) else "string")
        if kind == "BOOL_LIT":
            return ast.Const(pos, text == "true", "bool")
        if kind == "NULL_LIT":
            return ast.Const(pos, None, "null")
        raise self.error(f"unsupported literal {text}", token)


def _is_marker(node: ast.Node) -> bool:
    return isinstance(node, ast.Call) and node.function == MARKER and node.target is None and len(node.args) == 1


def _first_token(tree: Tree) -> Any:
    current: Any = tree
    while isinstance(current, lark.Tree):
        current = current.children[0]
    return current


def _int(text: str) -> int:
    negative = text.startswith("-")
    body = text[1:] if negative else text
    value = int(body, 16) if body[:2].lower() == "0x" else int(body)
    return -value if negative else value
