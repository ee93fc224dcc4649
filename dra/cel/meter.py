"""A cost budget shared by many evaluations: one API request, one allocation attempt.

Each evaluation has its own limit (DEFAULT_COST_LIMIT); a request that evaluates many devices
also needs a limit on the sum, or a thousand evaluations just under the limit add up to minutes.
`CostMeter` holds that sum (in the same deterministic cost units) and a wall-clock deadline as a
backstop. An evaluation that runs into the meter's limit raises `CostBudgetExhausted`, which is
not a CEL error: the expression did nothing wrong on that device, so the result is never
memoised as the device's answer, and the caller answers with what it has so far.
"""
from __future__ import annotations

import contextlib
import contextvars
import time


class CostBudgetExhausted(Exception):
    """The shared budget ran out (not an error of the expression being evaluated)."""

    def __init__(self, reason: str, used: int, limit: int):
        super().__init__(reason)
        self.reason = reason
        self.used = used
        self.limit = limit


class CostMeter:
    """Not shared between threads: one per request (or per allocation attempt)."""

    def __init__(self, limit: int, time_limit_s: float | None = None):
        self.limit = limit
        self.time_limit_s = time_limit_s
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self.used = 0
        self.evaluations = 0

    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def exhausted(self) -> bool:
        return self.used >= self.limit or self.seconds_left() <= 0

    def clamp(self, cost_limit: int, time_limit: float) -> tuple[int, float, bool]:
        """The limits for the next evaluation and whether they are the meter's (tighter than
        the evaluation's own); raises CostBudgetExhausted if nothing is left."""
        if self.exhausted():
            raise self.error()
        remaining, seconds = self.remaining(), self.seconds_left()
        return min(cost_limit, remaining), min(time_limit, seconds), remaining < cost_limit or seconds < time_limit

    def record(self, used: int) -> None:
        self.used += used
        self.evaluations += 1

    def error(self) -> CostBudgetExhausted:
        if self.used >= self.limit:
            reason = (f"the request's CEL budget of {self.limit:,} cost units is used up "
                      f"({self.evaluations} evaluations)")
        else:
            reason = (f"the request's time budget of {self.time_limit_s:g} s is used up "
                      f"({self.evaluations} evaluations, {self.used:,} cost units)")
        return CostBudgetExhausted(reason, self.used, self.limit)


_current: contextvars.ContextVar[CostMeter | None] = contextvars.ContextVar("dra_cel_meter", default=None)


def current_meter() -> CostMeter | None:
    """The meter of the enclosing `metered` block (SelectorCache charges its evaluations to it)."""
    return _current.get()


@contextlib.contextmanager
def metered(meter: CostMeter):
    """Charge every SelectorCache evaluation in this block (this thread or task) to `meter`, so that
    callers of the engine bound a whole simulation or dry run without threading a parameter through
    it. CostBudgetExhausted propagates out of the engine to the caller."""
    token = _current.set(meter)
    try:
        yield meter
    finally:
        _current.reset(token)
