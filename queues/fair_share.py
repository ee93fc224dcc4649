"""The effective share a queue is ordered by when it remembers its past use (``spec.fairSharing.halfLifeSeconds``
above 0); the formula and a worked example are in queues/README.md ("Fair share that remembers").

Past use is measured against an absolute scale that decays as the usage does, not against the other queues'
usage: a queue that used all of ``C`` devices without end would have a decayed usage of
``∫₀^∞ C · 2^(−t/h) dt = C · h / ln 2``, and the history term is the queue's decayed usage over that (as KAI
normalizes past use to the cluster's capacity over the period). Measured against what the other queues
remember, the only queue that remembers anything kept all of it however long ago it was, and a short half-life
never forgot a burst.

Pure arithmetic: the callers (``queues.services.order``, ``scheduler.services.policy``) bring the current
borrowed share, the decayed usage and half-life of the queue (or of each queue of a subtree), the capacity
``C`` the borrowed share is measured against, and the weight.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

MIX = 0.5  # how much of the effective share is past use; the rest is what the queue borrows now


def full_use(capacity: float, half_life: float) -> float:
    """``C · h / ln 2``: the decayed usage (device-seconds) of a queue that used all of ``capacity`` devices for
    ever, with half-life ``half_life`` seconds."""
    return capacity * half_life / math.log(2)


def history_share(remembered: Iterable[tuple[float, float]], capacity: float) -> float:
    """``H = Σ U / (C · h / ln 2)``, clamped to [0, 1], over ``remembered``: (decayed usage U in device-seconds,
    half-life h in seconds) of the queue, or of each queue of a subtree. A pair without a half-life counts 0."""
    if capacity <= 0:
        return 0.0
    total = sum(used / full_use(capacity, half_life) for used, half_life in remembered if half_life > 0)
    return min(1.0, max(0.0, total))


def effective_share(borrowed_share: float, history: float, weight: float) -> float:
    """``E = ((1 − MIX) · S + MIX · H) / w``: S the dominant share of what the queue borrows now, H its
    ``history_share``, w its weight. Lowest first."""
    return ((1 - MIX) * borrowed_share + MIX * history) / weight
