"""The watch server's one reader of the change log: every watch of the process is fed from it.

A watch that polled the log itself would cost one query per watch twice a second, however quiet the fleet;
here one ``changes.Cursor`` over every watched resource reads it for all of them, and each subscriber gets
only the changes of its resource in the namespaces it may see (``in_namespaces``), so a tenant's watches
never wake for another tenant's changes and never see them, tombstones included.

A subscriber joins at the hub's position (``Subscriber.joined_at``); what came before, since its
resourceVersion, it reads with a cursor of its own (``kube.watch_server``) and then takes the hub's batches,
skipping seqs it has already delivered. Both read in seq order and skip nothing, so the seam loses nothing.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from draservice import changes

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5
# Batches a subscriber may have waiting. A client that reads slower than the fleet changes is dropped (its
# stream ends; it reconnects from the last resourceVersion it saw), rather than buffered without bound.
MAX_PENDING = 200


def in_namespaces(change_namespace: str, namespace: str | None, readable: frozenset[str] | None) -> bool:
    """The namespace filter of a list (``Store.scoped``), for a change: the URL's namespace when it names one,
    else the caller's readable namespaces (None: every one, for admins and cluster tokens)."""
    if namespace:
        return change_namespace == namespace
    return readable is None or change_namespace in readable


@dataclass(eq=False)
class Subscriber:
    resource: str
    namespace: str | None
    readable: frozenset[str] | None
    joined_at: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    dropped: bool = False  # too far behind: its stream ends

    def wants(self, change) -> bool:
        return change.resource == self.resource and in_namespaces(change.namespace, self.namespace, self.readable)


class Hub:
    """Polls the change log (in the server's database threads, through ``run``) and fans batches out."""

    def __init__(self, run: Callable[..., Awaitable], resources: set[str]):
        self.run, self.resources = run, resources
        self.subscribers: set[Subscriber] = set()
        self.cursor: changes.Cursor | None = None
        self.delivered = 0  # every change up to this seq is in its subscribers' queues
        self._task: asyncio.Task | None = None

    @property
    def seq(self) -> int:
        return self.cursor.seq if self.cursor else 0

    async def start(self) -> None:
        self.cursor = changes.Cursor(await self.run(changes.settled))
        self.delivered = self.cursor.seq
        self._task = asyncio.create_task(self._poll_forever(), name="watch-hub")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def subscribe(self, resource: str, namespace: str | None, readable: frozenset[str] | None) -> Subscriber:
        sub = Subscriber(resource, namespace, readable, joined_at=self.delivered)
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database restarting, a failover: keep the watches, try again
                log.exception("reading the change log failed; retrying")
                await asyncio.sleep(2)
            await asyncio.sleep(POLL_SECONDS)

    async def poll(self) -> None:
        cursor = self.cursor
        assert cursor is not None
        while True:
            before = cursor.seq
            batch = await self.run(cursor.read, self.resources)
            if batch:
                self._dispatch(batch)
            self.delivered = cursor.seq
            if cursor.seq - before < changes.READ_LIMIT:  # not a full page (of every resource): caught up
                break

    def _dispatch(self, batch: list) -> None:
        for sub in list(self.subscribers):
            mine = [c for c in batch if sub.wants(c)]
            if not mine or sub.dropped:
                continue
            if sub.queue.qsize() >= MAX_PENDING:
                sub.dropped = True
                sub.queue.put_nowait(None)  # wakes it to end its stream
            else:
                sub.queue.put_nowait(mine)
