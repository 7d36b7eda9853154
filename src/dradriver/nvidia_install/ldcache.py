"""glibc's linker cache (``/etc/ld.so.cache``) and ``ld.so.conf``: where a root's loader finds its libraries.

A host whose driver lives outside the usual directories (``/usr/local/nvidia/lib64`` on GKE and many cloud images)
registers it in ``/etc/ld.so.conf.d/`` and runs ``ldconfig``; the cache is then the only record of where
``libcuda.so.1`` is. NVIDIA's container toolkit reads it for that reason, and so do we.

Two file formats exist, both written by ``ldconfig`` (glibc's ``elf/cache.c`` defines them):

- the old one, magic ``ld.so-1.7.0``: a count, then 12-byte entries (flags, key, value), string offsets counted
  from the end of the entries. glibc before 2.32 writes it followed by the new one in the same file;
- the new one, magic ``glibc-ld.so.cache1.1``: a 48-byte header (count, string-table length, byte order, extension
  offset), 24-byte entries (flags, key, value, OS version, hwcap), string offsets counted from the new header.

Each entry maps a soname (``libcuda.so.1``) to a path in the root (``/usr/local/nvidia/lib64/libcuda.so.1``); its
flags say the ELF class and ABI, so a 64-bit host's cache also lists 32-bit copies, which :func:`entries` drops.
"""

from __future__ import annotations

import glob
import os
import platform
import struct
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dradriver.nvidia_install.root_paths import directory, regular_file

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER = struct.Struct("<12sI")  # magic padded to 12 bytes, entry count
_OLD_ENTRY = struct.Struct("<iII")  # flags, key, value
_NEW_HEADER_SIZE = 48  # magic (20), count, string length, byte order + 3 pad, extension offset, 3 unused
_NEW_ENTRY_SIZE = 24  # flags, key, value, OS version (all 32-bit), hwcap (64-bit)
# The new header's flags byte: its low two bits are the byte order (0 unset: the writer's own, 2 little, 3 big).
_ENDIAN_MASK = 3
_ENDIAN_UNSET = 0
_ENDIAN_BIG = 3

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
#: The ABI flag ldconfig gives a library of each 64-bit machine (glibc's sysdeps/generic/ldconfig.h).
MACHINE_FLAGS = {
    "x86_64": 0x0300,  # FLAG_X8664_LIB64
    "aarch64": 0x0A00,  # FLAG_AARCH64_LIB64
    "ppc64le": 0x0500,  # FLAG_POWERPC_LIB64
    "s390x": 0x0400,  # FLAG_S390_LIB64
}


class LdCacheError(ValueError):
    """The file is not a linker cache, or is cut short."""


@dataclass(frozen=True)
class CacheEntry:
    soname: str  # the name the loader looks up, e.g. libcuda.so.1
    path: str  # where the root has it, e.g. /usr/local/nvidia/lib64/libcuda.so.1
    flags: int


def parse(data: bytes) -> tuple[CacheEntry, ...]:
    """Every entry of a linker cache in either format (the new part of a combined file wins)."""
    if data.startswith(NEW_MAGIC):
        return _parse_new(data, 0)
    if not data.startswith(OLD_MAGIC):
        raise LdCacheError(f"not a glibc linker cache (magic {data[:20]!r})")
    if len(data) < _OLD_HEADER.size:
        raise LdCacheError("linker cache cut short in its header")
    _magic, count = _OLD_HEADER.unpack_from(data, 0)
    strings = _OLD_HEADER.size + count * _OLD_ENTRY.size
    if strings > len(data):
        raise LdCacheError(f"linker cache cut short: {count} entries do not fit in {len(data)} bytes")
    # glibc < 2.32 appends the new format, 8-byte aligned, right after the old entries.
    new_at = (strings + 7) & ~7
    if data[new_at : new_at + len(NEW_MAGIC)] == NEW_MAGIC:
        return _parse_new(data, new_at)
    entries = []
    for index in range(count):
        flags, key, value = _OLD_ENTRY.unpack_from(data, _OLD_HEADER.size + index * _OLD_ENTRY.size)
        entries.append(CacheEntry(_string(data, strings + key), _string(data, strings + value), flags))
    return tuple(entries)


def _parse_new(data: bytes, start: int) -> tuple[CacheEntry, ...]:
    if len(data) < start + _NEW_HEADER_SIZE:
        raise LdCacheError("linker cache cut short in its header")
    endian = data[start + 28] & _ENDIAN_MASK
    # Unset (glibc before 2.32): the writer's order, i.e. the host's, which is ours.
    big = endian == _ENDIAN_BIG or (endian == _ENDIAN_UNSET and sys.byteorder == "big")
    order = ">" if big else "<"
    count, _string_length = struct.unpack_from(f"{order}II", data, start + 20)
    entry = struct.Struct(f"{order}iIIIQ")
    first = start + _NEW_HEADER_SIZE
    if first + count * entry.size > len(data):
        raise LdCacheError(f"linker cache cut short: {count} entries do not fit in {len(data)} bytes")
    entries = []
    for index in range(count):
        flags, key, value, _os_version, _hwcap = entry.unpack_from(data, first + index * entry.size)
        # Offsets count from the new header, which starts the file unless an old-format part comes first.
        entries.append(CacheEntry(_string(data, start + key), _string(data, start + value), flags))
    return tuple(entries)


def _string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise LdCacheError(f"linker cache string at offset {offset} runs past the end of the file")
    return data[offset:end].decode("utf-8", "surrogateescape")


def native(entries: tuple[CacheEntry, ...], machine: str | None = None) -> tuple[CacheEntry, ...]:
    """The entries a loader of ``machine`` (default: this one) would use: glibc ELF libraries of its ABI, so a
    64-bit host's 32-bit copies (no ABI flag) never stand in for its own libraries."""
    wanted = MACHINE_FLAGS.get(machine or platform.machine())
    return tuple(
        e
        for e in entries
        if e.flags & FLAG_TYPE_MASK == FLAG_ELF_LIBC6 and (wanted is None or e.flags & FLAG_REQUIRED_MASK == wanted)
    )


def read_cache(root: Path, machine: str | None = None) -> tuple[CacheEntry, ...] | None:
    """The native entries of ``root``'s ``etc/ld.so.cache``; None when it has none or it cannot be read."""
    cache = regular_file(root, PurePosixPath("etc/ld.so.cache"))
    if cache is None:
        return None
    try:
        data = (root / cache).read_bytes()
    except OSError:
        return None
    try:
        return native(parse(data), machine)
    except LdCacheError:
        return None


def conf_dirs(root: Path, conf: str = "etc/ld.so.conf") -> tuple[PurePosixPath, ...]:
    """The directories ``ld.so.conf`` names (root-relative), following ``include`` lines (globs, relative to
    the including file's directory) as ldconfig does; a missing file names nothing."""
    found: dict[PurePosixPath, None] = {}
    _read_conf(root, PurePosixPath("/") / conf, found, seen=set())
    return tuple(found)


def _read_conf(root: Path, conf: PurePosixPath, found: dict[PurePosixPath, None], *, seen: set[str]) -> None:
    if str(conf) in seen or len(seen) > 256:
        return  # an include loop, or a pathological tree
    seen.add(str(conf))
    file = regular_file(root, PurePosixPath(str(conf).lstrip("/")))
    if file is None:
        return
    try:
        text = (root / file).read_text(errors="replace")
    except OSError:
        return
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include") and line[7:8].isspace():
            for pattern in line[8:].split():
                absolute = PurePosixPath(pattern if pattern.startswith("/") else f"{conf.parent}/{pattern}")
                for match in _glob_in_root(root, absolute):
                    _read_conf(root, match, found, seen=seen)
        elif line.startswith("hwcap"):
            continue  # an obsolete directive, not a directory
        else:
            # A directory, optionally "dir=TYPE" (old syntax); also several separated by whitespace or commas.
            for name in line.replace(",", " ").split():
                path = name.split("=", 1)[0]
                if path.startswith("/"):
                    found.setdefault(PurePosixPath(path.rstrip("/") or "/"), None)


def _glob_in_root(root: Path, pattern: PurePosixPath) -> list[PurePosixPath]:
    """The files an include pattern names, its directory resolved inside ``root`` (includes glob file names:
    ``ld.so.conf.d/*.conf``; a pattern in the directory part too is globbed as it stands)."""
    if any(magic in str(pattern.parent) for magic in "*?["):
        matches = glob.glob(os.path.join(glob.escape(str(root)), str(pattern).lstrip("/")))
        return [PurePosixPath("/", os.path.relpath(match, root)) for match in sorted(matches)]
    folder = directory(root, PurePosixPath(str(pattern.parent).lstrip("/")))
    if folder is None:
        return []
    matches = glob.glob(os.path.join(glob.escape(str(root / folder)), pattern.name))
    return [PurePosixPath("/", str(folder), Path(match).name) for match in sorted(matches)]
