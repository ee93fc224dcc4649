"""Exponential backoff with jitter, shared by everything that retries."""
from __future__ import annotations

import random


class Backoff:
    """Delays that double from ``base`` up to ``cap``, each drawn from [delay/2, delay].

    The jitter matters: after a service outage every agent in the fleet retries, and without it they
    would all come back in lock step and hit the recovering service at the same instant."""

    def __init__(self, base: float = 0.5, cap: float = 60.0, rng: random.Random | None = None):
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * (2 ** self.failures))
        self.failures += 1
        return self._rng.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.failures = 0
