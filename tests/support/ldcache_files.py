"""Linker caches for machines no ldconfig here can write for (aarch64 on an x86-64 machine): the new format laid
out as glibc's elf/cache.c writes it. The reader is also tested against caches the real ldconfig wrote
(tests/nvidia_install/test_ldcache.py), so this writer only supplies entries with other machines' flags."""

from __future__ import annotations

import struct

NEW_MAGIC = b"glibc-ld.so.cache1.1"
X86_64 = 0x0303  # FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
AARCH64 = 0x0A03  # FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64
I386 = 0x0003  # FLAG_ELF_LIBC6 alone: a 32-bit library
S390X = 0x0403  # FLAG_ELF_LIBC6 | FLAG_S390_LIB64


def new_format_cache(entries: list[tuple[int, str, str]], *, big_endian: bool = False) -> bytes:
    """A cache of ``(flags, soname, path)`` entries: 48-byte header, 24-byte entries, then the strings; in the
    byte order of a big-endian machine (s390x) if asked, its header saying so as glibc 2.32+ writes it."""
    order = ">" if big_endian else "<"
    strings = b""
    offsets = []
    table = 48 + 24 * len(entries)
    for _flags, key, value in entries:
        offsets.append((table + len(strings), table + len(strings) + len(key) + 1))
        strings += key.encode() + b"\0" + value.encode() + b"\0"
    data = NEW_MAGIC + struct.pack(f"{order}IIB3xI12x", len(entries), len(strings), 3 if big_endian else 2, 0)
    for (flags, _key, _value), (key_at, value_at) in zip(entries, offsets, strict=True):
        data += struct.pack(f"{order}iIIIQ", flags, key_at, value_at, 0, 0)
    return data + strings
