"""CEL string and bytes literals, decoded as the CEL specification defines them (celpy's decoder drops
the line feeds of triple-quoted strings and does not know ``\\?``, ``\\```, or ``\\X`` escapes)."""

from __future__ import annotations

import re

_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "?": "?",
    '"': '"',
    "'": "'",
    "`": "`",
}
_ESCAPE = re.compile(
    r"\\(?:([abfnrtv\\?\"'`])|[xX]([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([0-3][0-7]{2}))"
)


class LiteralError(ValueError):
    """A malformed escape sequence or code point."""


def decode(token: str) -> str | bytes:
    """The value of a STRING_LIT / MLSTRING_LIT / BYTES_LIT token (prefixes r, b, in any case and order)."""
    prefix_end = 0
    while token[prefix_end] not in "'\"":
        prefix_end += 1
    prefix = token[:prefix_end].lower()
    body = token[prefix_end:]
    quote = 3 if body[:3] in ("'''", '"""') else 1
    text = body[quote:-quote]
    is_bytes, raw = "b" in prefix, "r" in prefix
    if raw:
        return text.encode("utf-8") if is_bytes else text
    out = bytearray()
    position = 0
    for match in _ESCAPE.finditer(text):
        out += text[position : match.start()].encode("utf-8")
        position = match.end()
        simple, hex2, hex4, hex8, octal = match.groups()
        if simple is not None:
            out += _SIMPLE[simple].encode("utf-8")
        elif hex2 is not None or octal is not None:
            value = int(hex2, 16) if hex2 is not None else int(octal, 8)
            out += bytes([value]) if is_bytes else chr(value).encode("utf-8")
        else:
            code = int(hex4 or hex8, 16)
            if is_bytes and hex4 is None:
                raise LiteralError("\\U escapes are not allowed in bytes literals")
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise LiteralError(f"invalid code point U+{code:X}")
            out += chr(code).encode("utf-8")
    rest = text[position:]
    if "\\" in rest.replace("\\\\", ""):
        raise LiteralError(f"invalid escape sequence in {token[:40]!r}")
    out += rest.encode("utf-8")
    if is_bytes:
        return bytes(out)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise LiteralError("a string literal must be valid UTF-8 (use a bytes literal b'...' for raw bytes)") from None
