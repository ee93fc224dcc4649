"""Garbage-collector policy for a process that keeps a large, long-lived engine (a worker).

An engine over 40,000 devices is about a million long-lived objects. CPython's cyclic collector rescans them
at every full collection (0.4-1.0 s pauses were measured), although they live until the next snapshot. So a
worker moves them out of the collector's sight once built (``gc.freeze``) and makes young collections rarer.
A replaced engine is unfrozen first and collected once (an engine has reference cycles, index <-> engine,
that reference counting alone would leak).

What an engine builds lazily after the freeze stays in the collector's sight: above all the CEL view of every
device (a ``CELDevice`` and its resolved ``DeviceView``, ~10 objects per device), which the first selector used
in a cluster builds for all its devices. On 40,000 devices that is ~450,000 objects that every full collection
rescans (~200 ms CPU each, several times that in wall time on a loaded worker). ``freeze_long_lived(engine)``
builds them first (and the CEL parser's tables), so they are frozen with the engine.
"""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from dra.cel import compile_expression

if TYPE_CHECKING:
    from .engine import Engine

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


def freeze_long_lived(engine: Engine | None = None) -> None:
    """After building a long-lived engine: build its devices' CEL views (selectors would on first use), collect
    what is garbage now, then freeze everything that is left."""
    tune()
    if engine is not None:
        engine.build_cel_views()
        compile_expression("true")  # the CEL parser's grammar tables (~10,000 objects) are built on first use
    gc.collect()
    gc.freeze()
