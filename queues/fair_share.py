"""The effective share a queue is ordered by when it remembers its past use (``spec.fairSharing.halfLifeSeconds``
above 0); the formula and a worked example are in queues/README.md ("Fair share that remembers").

Pure arithmetic: the callers (``queues.services.order``) bring the current borrowed share, the decayed usage
of every remembering queue (``usage.services.decay``) and the weight.
"""
from __future__ import annotations

MIX = 0.5  # how much of the effective share is past use; the rest is what the queue borrows now


def history_share(decayed: float, total_decayed: float) -> float:
    """A queue's part of the remembering queues' decayed usage, in [0, 1] (0 when nobody used anything)."""
    return decayed / total_decayed if total_decayed > 0 else 0.0


def effective_share(borrowed_share: float, decayed: float, total_decayed: float, weight: float) -> float:
    """``E = ((1 - MIX) * S + MIX * U / ΣU) / w``: S the dominant share of what the queue borrows now, U its
    decayed usage, ΣU that of every queue with a half-life, w its weight. Lowest first."""
    return ((1 - MIX) * borrowed_share + MIX * history_share(decayed, total_decayed)) / weight
