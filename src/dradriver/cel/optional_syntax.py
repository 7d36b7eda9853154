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
    out: list[str] = []
    origin: list[int] = []
    # One entry per open bracket: its kind ("(", "index", "list", "map") and whether a marker call is open.
    stack: list[list[object]] = []
    previous = ""  # the last significant token
    i, n = 0, len(expression)

    def emit(piece: str, at: int) -> None:
        out.append(piece)
        origin.extend([at] * len(piece))

    def close_marker(at: int) -> None:
        if stack and stack[-1][1]:
            emit(")", at)
            stack[-1][1] = False

    while i < n:
        char = expression[i]
        string = _STRING.match(expression, i) if char in "'\"rRbB" else None
        if (string and not (previous[-1:].isalnum() or previous[-1:] == "_")) or (string and char in "'\""):
            out.append(string.group(0))
            origin.extend(range(i, string.end()))
            previous, i = '"', string.end()
            continue
        word = _WORD.match(expression, i) if (char.isalnum() or char == "_") else None
        if word:
            out.append(word.group(0))
            origin.extend(range(i, word.end()))
            previous, i = word.group(0), word.end()
            continue
        if char.isspace():
            emit(char, i)
            i += 1
            continue
        if char == "." and expression[i + 1 : i + 2] == "?":
            emit("." + MARKER, i)
            previous, i = ".", i + 2
            continue
        in_literal = bool(stack) and stack[-1][0] in ("list", "map") and previous in ("[", "{", ",")
        in_index = bool(stack) and stack[-1][0] == "index" and previous == "["
        if char == "?" and (in_literal or in_index):
            emit(MARKER + "(", i)
            stack[-1][1] = True
            previous, i = "(", i + 1
            continue
        if char in "([{":
            after_operand = previous not in ("", "in") and (previous[-1].isalnum() or previous[-1] in '_)]}"')
            if char == "(":
                kind = "("
            elif char == "[":
                kind = "index" if after_operand else "list"
            else:
                kind = "object" if after_operand else "map"
            stack.append([kind, False])
        elif char in ")]}":
            close_marker(i)
            if stack:
                stack.pop()
        elif char == "," or (char == ":" and stack and stack[-1][0] == "map"):
            close_marker(i)
        emit(char, i)
        previous, i = char, i + 1
    text = "".join(out)
    return (text, origin) if text != expression else (expression, None)


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
