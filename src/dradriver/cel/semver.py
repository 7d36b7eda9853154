"""Semantic versions (semver 2.0.0) as CEL values: the ``semver`` library of k8s.io/apiserver."""

from __future__ import annotations

import functools

from dradriver.validation.names import SEMVER


class SemverError(ValueError):
    """A string is not a semantic version."""


@functools.total_ordering
class Semver:
    """A parsed version; equality and order follow semver precedence (build metadata ignored)."""

    __slots__ = ("build", "major", "minor", "patch", "prerelease", "text")

    def __init__(
        self, text: str, major: int, minor: int, patch: int, *, prerelease: tuple[str, ...], build: str
    ) -> None:
        self.text = text
        self.major = major
        self.minor = minor
        self.patch = patch
        self.prerelease = prerelease
        self.build = build

    @classmethod
    def parse(cls, text: str, *, normalize: bool = False) -> Semver:
        return _parse(_normalize(text) if normalize else text)

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
        # A release sorts after every pre-release of the same version; numeric identifiers sort before
        # alphanumeric ones and compare numerically.
        pre = tuple((0, int(p)) if p.isdigit() else (1, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def compare(self, other: Semver) -> int:
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._key() == other._key()

    def __lt__(self, other: Semver) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(("semver", self._key()))

    def __repr__(self) -> str:
        return f"semver({self.text!r})"

    def __str__(self) -> str:
        return self.text


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Semver:
    match = SEMVER.fullmatch(text)
    if not match:
        raise SemverError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH, semver 2.0.0)")
    major, minor, patch, pre, build = match.groups()
    return Semver(
        text,
        int(major),
        int(minor),
        int(patch),
        prerelease=tuple(pre.split(".")) if pre else (),
        build=build or "",
    )


def _normalize(text: str) -> str:
    """Drop a leading ``v``, strip leading zeros, fill a missing minor/patch with 0 (as Kubernetes does)."""
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or not stripped[0].isdigit():
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise SemverError(f"{text!r}: a short version cannot carry pre-release or build metadata")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def is_semver(text: str, *, normalize: bool = False) -> bool:
    try:
        Semver.parse(text, normalize=normalize)
    except SemverError:
        return False
    return True
