"""Semantic versions as CEL values, matching `github.com/blang/semver/v4` (used by Kubernetes).

`semver("1.0.0")` and version attributes of devices both parse strictly (no "v", no leading
zeros, all three numbers); `semver(s, true)` first normalises like Kubernetes'
`normalizeAndParse`. Error texts are blang's, because users compare them with kubectl output.
"""
from __future__ import annotations

_NUMBERS = frozenset("0123456789")
_ALPHANUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_UINT64_MAX = 2**64 - 1


class SemverError(ValueError):
    """Not a semantic version; message is blang/semver's."""


def _parse_uint(text: str) -> int:
    if not text:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    value = int(text)
    if value > _UINT64_MAX:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return value


def _number(text: str, what: str) -> int:
    if not set(text) <= _NUMBERS:
        raise SemverError(f"Invalid character(s) found in {what} number {text!r}".replace("'", '"'))
    if len(text) > 1 and text[0] == "0":
        raise SemverError(f'{what.capitalize()} number must not contain leading zeroes "{text}"')
    return _parse_uint(text)


def _prerelease_part(text: str) -> tuple[int, int | str]:
    """(0, n) for numeric identifiers and (1, s) for alphanumeric ones; sorts like semver 2.0."""
    if not text:
        raise SemverError("Prerelease is empty")
    if set(text) <= _NUMBERS:
        if len(text) > 1 and text[0] == "0":
            raise SemverError(f'Numeric PreRelease version must not contain leading zeroes "{text}"')
        return (0, _parse_uint(text))
    if not set(text) <= _ALPHANUM:
        raise SemverError(f'Invalid character(s) found in prerelease "{text}"')
    return (1, text)


class Semver:
    """An immutable semantic version; build metadata is kept for display but ignored in ordering."""

    __slots__ = ("major", "minor", "patch", "pre", "build")

    def __init__(self, major: int, minor: int, patch: int, pre: tuple = (), build: tuple = ()):
        self.major, self.minor, self.patch, self.pre, self.build = major, minor, patch, pre, build

    @classmethod
    def parse(cls, text: str) -> Semver:
        """semver.Parse: strict MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]."""
        if not text:
            raise SemverError("Version string empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise SemverError("No Major.Minor.Patch elements found")
        major = _number(parts[0], "major")
        minor = _number(parts[1], "minor")
        rest = parts[2]
        build: list[str] = []
        pre_texts: list[str] = []
        if "+" in rest:
            rest, _, build_text = rest.partition("+")
            build = build_text.split(".")
        if "-" in rest:
            rest, _, pre_text = rest.partition("-")
            pre_texts = pre_text.split(".")
        patch = _number(rest, "patch")
        pre = tuple(_prerelease_part(p) for p in pre_texts)
        for b in build:
            if not b:
                raise SemverError("Build meta data is empty")
            if not set(b) <= _ALPHANUM:
                raise SemverError(f'Invalid character(s) found in build meta data "{b}"')
        return cls(major, minor, patch, pre, tuple(build))

    @classmethod
    def parse_normalized(cls, text: str) -> Semver:
        """Kubernetes' normalizeAndParse: drop a leading "v", leading zeros, fill minor/patch."""
        if text.startswith("v"):
            text = text[1:]
        parts = text.split(".", 2)
        for i, p in enumerate(parts):
            if len(p) > 1:
                p = p.lstrip("0")
                if not p or p[0] not in _NUMBERS:
                    p = "0" + p
                parts[i] = p
        if len(parts) < 3:
            if any(c in parts[-1] for c in "+-"):
                raise SemverError("short version cannot contain PreRelease/Build meta data")
            parts += ["0"] * (3 - len(parts))
        return cls.parse(".".join(parts))

    def _order_key(self):
        return (self.major, self.minor, self.patch)

    def compare(self, other: Semver) -> int:
        a, b = self._order_key(), other._order_key()
        if a != b:
            return 1 if a > b else -1
        # A release sorts after all of its pre-releases.
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for x, y in zip(self.pre, other.pre, strict=False):
            if x != y:
                return 1 if x > y else -1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Semver):
            return self.compare(other) == 0
        raise TypeError(f"no such overload: Semver == {type(other).__name__}")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("semver", self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(v) for _, v in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"semver({str(self)!r})"
