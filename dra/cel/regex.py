"""Regular expressions with RE2 semantics, as in cel-go and the Kubernetes regex library.

RE2 runs in linear time, so a hostile pattern such as `(a+)+$` cannot stall a worker the way
Python's backtracking `re` would (the evaluator's budget cannot interrupt a C-level regex
search). `google-re2` is therefore required; if it is missing the import fails loudly instead of
silently degrading to a backtracking engine.
"""
from __future__ import annotations

import functools

import re2

_OPTIONS = re2.Options()
# re2 logs every bad pattern to stderr through absl; users get the error in the result instead.
_OPTIONS.log_errors = False
# cel-go compiles patterns for `matches` on each call but caches literal ones; a small LRU
# here keeps repeated selectors from recompiling.
_CACHE_SIZE = 512


class RegexError(ValueError):
    """The pattern is not valid RE2 syntax."""


@functools.lru_cache(maxsize=_CACHE_SIZE)
def compile_pattern(pattern: str):
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0]
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise RegexError(f"error parsing regexp: {detail}") from None


def matches(text: str, pattern: str) -> bool:
    """CEL `matches`: true if the pattern matches any substring (RE2 partial match)."""
    return compile_pattern(pattern).search(text) is not None


def find(text: str, pattern: str) -> str:
    """Kubernetes `find`: the first match, or "" when there is none."""
    match = compile_pattern(pattern).search(text)
    return match.group(0) if match else ""


def find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    """Kubernetes `findAll`: all non-overlapping matches; a negative limit means all."""
    if limit == 0:
        return []
    out: list[str] = []
    previous_end = -1
    for match in compile_pattern(pattern).finditer(text):
        # Go's FindAllString ignores an empty match right after the previous match.
        if match.start() == match.end() == previous_end:
            continue
        previous_end = match.end()
        out.append(match.group(0))
        if 0 < limit <= len(out):
            break
    return out
