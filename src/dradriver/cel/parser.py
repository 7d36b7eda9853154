"""Parse CEL text with celpy's grammar (lark) and convert the parse tree into ``ast`` nodes."""

from __future__ import annotations

import functools
import re
from typing import Any

import lark
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import celbytes, celstr

from dradriver.cel import ast
from dradriver.cel.errors import CelCompileError

MAX_EXPRESSION_LENGTH = 10 * 1024  # resource.k8s.io: CELSelectorExpressionMaxLength
MAX_NESTING = 64

_MACROS = {"all", "exists", "exists_one", "filter", "map"}
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
    try:
        tree = _parser().parse(expression)
    except CELParseError as err:
        line = getattr(err, "line", None) or 1
        column = getattr(err, "column", None) or 1
        raise CelCompileError(
            f"syntax error: {_unexpected(expression, line, column)}",
            expression=expression,
            line=line,
            column=column,
            hint=_syntax_hint(expression),
        ) from None
    return _Converter(expression).convert(tree)


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
    if meta is not None and not getattr(meta, "empty", True):
        return (meta.line, meta.column)
    return (1, 1)


class _Converter:
    def __init__(self, expression: str) -> None:
        self.expression = expression

    def error(self, message: str, at: Any, hint: str | None = None) -> CelCompileError:
        line, column = _pos(at)
        return CelCompileError(message, expression=self.expression, line=line, column=column, hint=hint)

    def convert(self, tree: Tree) -> ast.Node:
        method = getattr(self, "_" + str(tree.data), None)
        if method is None:
            raise self.error(f"unsupported syntax ({tree.data})", tree)
        node: ast.Node = method(tree)
        return node

    def _expr(self, tree: Tree) -> ast.Node:
        kids = tree.children
        if len(kids) == 1:
            return self.convert(kids[0])
        return ast.Call(_pos(tree), "_?_:_", None, tuple(self.convert(k) for k in kids))

    def _logical(self, tree: Tree, name: str) -> ast.Node:
        kids = tree.children
        if len(kids) == 1:
            return self.convert(kids[0])
        return ast.Call(_pos(tree), name, None, (self.convert(kids[0]), self.convert(kids[1])))

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
        return ast.Call(_pos(op_tree), name, None, (left, self.convert(right)))

    _relation = _binary
    _addition = _binary
    _multiplication = _binary

    def _unary(self, tree: Tree) -> ast.Node:
        kids = tree.children
        if len(kids) == 1:
            return self.convert(kids[0])
        op, operand = kids
        name = "!_" if op.data == "unary_not" else "-_"
        inner = self.convert(operand)
        if (
            name == "-_"
            and isinstance(inner, ast.Const)
            and inner.type in ("int", "double")
            and not str(operand.children[0]).startswith("-")
        ):
            value = -inner.value
            if inner.type == "int" and not INT64_MIN <= value <= INT64_MAX:
                raise self.error("integer literal out of range", tree)
            return ast.Const(_pos(tree), value, inner.type)
        return ast.Call(_pos(op), name, None, (inner,))

    def _member(self, tree: Tree) -> ast.Node:
        return self.convert(tree.children[0])

    _primary = _member

    def _member_dot(self, tree: Tree) -> ast.Node:
        operand, name = tree.children
        return ast.Select(_pos(name), self.convert(operand), str(name))

    def _member_dot_arg(self, tree: Tree) -> ast.Node:
        operand_tree, name = tree.children[0], str(tree.children[1])
        arg_trees = tree.children[2].children if len(tree.children) > 2 else []
        pos = _pos(tree.children[1])
        operand = self.convert(operand_tree)
        if isinstance(operand, ast.Ident) and operand.name == "cel" and name == "bind":
            if len(arg_trees) != 3:
                raise self.error("cel.bind needs three arguments: cel.bind(name, value, expression)", tree)
            var = self.convert(arg_trees[0])
            if not isinstance(var, ast.Ident):
                raise self.error("the first argument of cel.bind must be a simple name", arg_trees[0])
            return ast.Bind(pos, var.name, self.convert(arg_trees[1]), self.convert(arg_trees[2]))
        if name in _MACROS and len(arg_trees) in (2, 3) and not (name != "map" and len(arg_trees) == 3):
            var = self.convert(arg_trees[0])
            if not isinstance(var, ast.Ident):
                raise self.error(
                    f"the first argument of {name}() must be a simple variable name",
                    arg_trees[0],
                    hint=f"write e.g. list.{name}(x, x > 0)",
                )
            if len(arg_trees) == 3:
                return ast.Comprehension(
                    pos, "map", operand, var.name, self.convert(arg_trees[2]), self.convert(arg_trees[1])
                )
            return ast.Comprehension(pos, name, operand, var.name, self.convert(arg_trees[1]))
        return ast.Call(pos, name, operand, tuple(self.convert(a) for a in arg_trees))

    def _member_index(self, tree: Tree) -> ast.Node:
        operand, index = tree.children
        return ast.Index(_pos(tree), self.convert(operand), self.convert(index))

    def _member_object(self, tree: Tree) -> ast.Node:
        raise self.error("message construction (Type{field: value}) is not available in device selectors", tree)

    def _ident(self, tree: Tree) -> ast.Node:
        token = tree.children[0]
        return ast.Ident(_pos(token), str(token))

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
            return ast.Has(_pos(token), args[0].operand, args[0].field)
        return ast.Call(_pos(token), str(token), None, args)

    _dot_ident_arg = _ident_arg

    def _paren_expr(self, tree: Tree) -> ast.Node:
        return self.convert(tree.children[0])

    def _list_lit(self, tree: Tree) -> ast.Node:
        items = tuple(self.convert(a) for a in tree.children[0].children) if tree.children else ()
        return ast.ListExpr(_pos(tree), items)

    def _map_lit(self, tree: Tree) -> ast.Node:
        parts = [self.convert(a) for a in tree.children[0].children] if tree.children else []
        return ast.MapExpr(_pos(tree), tuple(zip(parts[0::2], parts[1::2], strict=True)))

    def _literal(self, tree: Tree) -> ast.Node:
        token: Any = tree.children[0]
        kind, text, pos = token.type, str(token), _pos(token)
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
        if kind in ("STRING_LIT", "MLSTRING_LIT"):
            return ast.Const(pos, str(celstr(token)), "string")
        if kind == "BYTES_LIT":
            return ast.Const(pos, bytes(celbytes(token)), "bytes")
        if kind == "BOOL_LIT":
            return ast.Const(pos, text == "true", "bool")
        if kind == "NULL_LIT":
            return ast.Const(pos, None, "null")
        raise self.error(f"unsupported literal {text}", token)


def _int(text: str) -> int:
    negative = text.startswith("-")
    body = text[1:] if negative else text
    value = int(body, 16) if body[:2].lower() == "0x" else int(body)
    return -value if negative else value
