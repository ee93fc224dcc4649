"""Garbage-collector policy for a process that keeps a large, long-lived engine (a worker).

An engine over 40,000 devices is about a million long-lived objects. CPython's cyclic collector rescans them
at every full collection (0.4-1.0 s pauses were measured), although they live until the next snapshot. So a
worker moves them out of the collector's sight once built (``gc.freeze``) and makes young collections rarer.
A replaced engine is unfrozen first and collected once (an engine has reference cycles, index <-> engine,
that reference counting alone would leak).
"""
from __future__ import annotations

import gc

# Young-generation threshold: the default 700 runs a collection every few hundred net allocations, thousands
# of times per round; the objects a round makes are short-lived and mostly freed by reference counting.
YOUNG_THRESHOLD = 50_000
_tuned = False


def tune() -> None:
    """Once per process: rarer young collections."""
    global _tuned
    if not _tuned:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, gen1, gen2)
        _tuned = True


def release_frozen() -> None:
    """Before dropping a frozen engine: make it collectable again."""
    gc.unfreeze()


def freeze_long_lived() -> None:
    """After building a long-lived engine: collect what is garbage now, then freeze everything that is left."""
    tune()
    gc.collect()
    gc.freeze()
