"""CEL's optional syntax (``a.?f``, ``a[?k]``, ``[?e]``, ``{?k: v}``), which celpy's grammar lacks.

``rewrite`` turns it into plain CEL the grammar accepts, with a marker the converter recognises:
``a.?f`` → ``a.__dradriver_optional__f``; ``a[?k]`` → ``a[__dradriver_optional__(k)]``; an optional list
element or map key ``?e`` → ``__dradriver_optional__(e)``. It also returns, for every character of the
result, its offset in the original text, so that errors point at what the user wrote.
"""

from __future__ import annotations

import re

MARKER = "__dradriver_optional__"

_STRING = re.compile(
    r"(?:[rR][bB]?|[bB][rR]?)?"
    r"(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")"
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|[0-9][0-9A-Za-z.]*")


def rewrite(expression: str) -> tuple[str, list[int] | None]:
    """The expression with its optional syntax rewritten, and the offset map (None when unchanged)."""
    if "?" not in expression:
        return expression, None
    text, origin = _Rewriter(expression).run()
    return (text, origin) if text != expression else (expression, None)


class _Rewriter:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.out: list[str] = []
        self.origin: list[int] = []
        # One entry per open bracket: its kind ("(", "index", "list", "map", "object") and whether a
        # marker call is open in it.
        self.stack: list[list[object]] = []
        self.previous = ""  # the last significant token

    def emit(self, piece: str, at: int) -> None:
        self.out.append(piece)
        self.origin.extend([at] * len(piece))

    def copy(self, start: int, end: int) -> None:
        self.out.append(self.expression[start:end])
        self.origin.extend(range(start, end))
        self.previous = self.expression[start:end]

    def close_marker(self, at: int) -> None:
        if self.stack and self.stack[-1][1]:
            self.emit(")", at)
            self.stack[-1][1] = False

    def run(self) -> tuple[str, list[int]]:
        i, n = 0, len(self.expression)
        while i < n:
            i = self.step(i)
        return "".join(self.out), self.origin

    def step(self, i: int) -> int:
        """Rewrite what starts at offset i; the offset after it."""
        expression, char, previous = self.expression, self.expression[i], self.previous
        after_word = previous[-1:].isalnum() or previous[-1:] == "_"
        string = _STRING.match(expression, i) if char in "'\"rRbB" else None
        if string and (char in "'\"" or not after_word):
            self.copy(i, string.end())
            self.previous = '"'
            return string.end()
        word = _WORD.match(expression, i) if (char.isalnum() or char == "_") else None
        if word:
            self.copy(i, word.end())
            return word.end()
        if char.isspace():
            self.emit(char, i)
            return i + 1
        if char == "." and expression[i + 1 : i + 2] == "?":
            self.emit("." + MARKER, i)
            self.previous = "."
            return i + 2
        top = self.stack[-1][0] if self.stack else None
        in_literal = top in ("list", "map") and previous in ("[", "{", ",")
        if char == "?" and (in_literal or (top == "index" and previous == "[")):
            self.emit(MARKER + "(", i)
            self.stack[-1][1] = True
            self.previous = "("
            return i + 1
        self.bracket(char, i)
        self.emit(char, i)
        self.previous = char
        return i + 1

    def bracket(self, char: str, i: int) -> None:
        previous = self.previous
        if char in "([{":
            after_operand = previous not in ("", "in") and (previous[-1].isalnum() or previous[-1] in '_)]}"')
            if char == "(":
                kind = "("
            elif char == "[":
                kind = "index" if after_operand else "list"
            else:
                kind = "object" if after_operand else "map"
            self.stack.append([kind, False])
        elif char in ")]}":
            self.close_marker(i)
            if self.stack:
                self.stack.pop()
        elif char == "," or (char == ":" and self.stack and self.stack[-1][0] == "map"):
            self.close_marker(i)


def original_position(expression: str, text: str, origin: list[int] | None, line: int, column: int) -> tuple[int, int]:
    """(line, column) in ``expression`` of a 1-based position in the rewritten ``text``."""
    if origin is None or not origin:
        return (line, column)
    offset = 0
    for _ in range(line - 1):
        found = text.find("\n", offset)
        if found < 0:
            break
        offset = found + 1
    index = origin[max(0, min(offset + column - 1, len(origin) - 1))]
    start = expression.rfind("\n", 0, index) + 1
    return (expression.count("\n", 0, index) + 1, index - start + 1)
