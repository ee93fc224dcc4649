"""Rounds a test runs itself: a local runner that takes the tasks writers ask for, as ``manage.py serve``'s
runner would, instead of each writer running a round inline (no broker in tests)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from draservice import dispatch


class Deferred(dispatch.LocalRunner):
    def __init__(self) -> None:
        self.kicked: set[str] = set()

    def serves(self, name: str) -> bool:
        return True

    def kick(self, name: str) -> None:
        self.kicked.add(name)


@contextmanager
def deferred() -> Iterator[Deferred]:
    runner = Deferred()
    dispatch.add_local_runner(runner)
    try:
        yield runner
    finally:
        dispatch.remove_local_runner(runner)
