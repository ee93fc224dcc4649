"""Per-cluster allocation turns: N workers decide claims of different clusters at the same time.

Two workers deciding for the same cluster at once pick the same devices (every engine is deterministic and
bin-packs the same way), so all but one lose the race at commit and decide again: more workers, less work
done. Two workers deciding for different clusters never conflict. So a round splits its groups into parts
by the clusters whose devices they may take (``Engine.device_clusters``, a superset known before deciding),
merging groups whose cluster sets overlap, and decides and commits one part at a time, each under the turns
of its clusters: PostgreSQL session advisory locks, one per cluster, held from before the part's devices in
use are re-read until its commit is done.

How turns are taken (``schedule``): a part whose turns are all free is taken at once (``pg_try_advisory_lock``,
never waiting); only when every remaining part's turns are busy does the worker wait, for the first one's,
in ascending cluster order. A worker holds at most one part's turns at a time and waits only while holding
none, so turns never deadlock. A worker killed while holding turns loses them with its database session.

Every claim taken by the round is decided in the round, unless waiting for its part's turns takes longer
than ``TURN_WAIT_SECONDS`` (a holder that hangs): then that part is handed back, its claims Pending and
retried. The engine, which covers the whole fleet, is only brought up to date between parts (never rebuilt
for a part). One worker therefore does the same work per round as without turns, plus a few statements per
part. Turns are an optimisation, not a guarantee: the commit-time checks (``claims.services.commit``, the
per-device locks and the "new rows" check of ``claims.services.locking``) and the partial unique index
still decide what may be written, whatever a part's engine saw.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction

from claims.services import locking
from scheduler.services.grouping import DisjointSets

log = logging.getLogger(__name__)

# The longest a worker waits for a busy part's turns. A holder keeps them for one part's engine time
# (``allocation.ENGINE_SECONDS``) and commit (statements bounded by ``commit.LOCK_TIMEOUT``), so this is
# reached only when the holder hangs without dying (stopped, swapped out, a lost network path): the waiting
# worker then hands the part back (its claims stay Pending, "Deferred", and are retried) instead of leaving
# every other cluster's claims behind it. Below ``allocation.TAKE_SECONDS``, so the claims are still ours.
TURN_WAIT_SECONDS = 10.0
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock wait ended by lock_timeout


@dataclass
class Part:
    """Groups decided and committed together, under the turns of ``clusters`` (sorted; empty: the groups
    take no device, e.g. blocked ones or ones nothing matches, and need no turn)."""

    clusters: tuple[str, ...]
    groups: list = field(default_factory=list)


def enabled() -> bool:
    """Turns on PostgreSQL unless ``CLAIMS_CLUSTER_TURNS = False`` (SQLite serializes every writer)."""
    return connection.vendor == "postgresql" and getattr(settings, "CLAIMS_CLUSTER_TURNS", True)


def partition(groups: list, clusters_of: Callable[[Any], list[str]],
              together: Callable[[Any], bool] = lambda group: False) -> list[Part]:
    """Parts of ``groups`` with pairwise disjoint cluster sets, groups in their given (queue) order within a
    part, parts ordered by their first group. ``clusters_of(group)``: the clusters it may take devices in.
    ``together(group)``: the groups for which it holds share one part. Quota is admitted at commit in the
    order of the units committed, so groups whose admission reads quota usage must commit in one part, in
    queue order: split by cluster, a low-priority claim whose cluster's part came first took the quota of a
    higher one on another cluster."""
    links = DisjointSets()
    wanted = [sorted(set(clusters_of(g))) for g in groups]
    anchor = None
    for group, names in zip(groups, wanted, strict=True):
        if names:
            links.find(names[0])  # a one-cluster set is a part of its own too
            if together(group):
                anchor = anchor or names[0]
                links.union(anchor, names[0])
        for other in names[1:]:
            links.union(names[0], other)
    members = links.sets()
    parts: dict[str, Part] = {}
    for group, names in zip(groups, wanted, strict=True):
        root = links.find(names[0]) if names else ""
        part = parts.get(root)
        if part is None:
            part = parts[root] = Part(tuple(sorted(members.get(root, ()))))
        part.groups.append(group)
    return list(parts.values())


def turn_id(cluster: str) -> int:
    """The signed 64-bit advisory lock id of a cluster's turn."""
    digest = hashlib.blake2b(f"allocator-turn\x1f{cluster}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _ids(clusters: tuple[str, ...]) -> list[int]:
    return [turn_id(c) for c in sorted(clusters)]  # ascending cluster name: the one order everyone waits in


def try_take(clusters: tuple[str, ...]) -> bool:
    """Take every turn of ``clusters`` now, or none (never waits)."""
    if not clusters:
        return True
    ids = _ids(clusters)
    with connection.cursor() as cursor:
        cursor.execute("SELECT k, pg_try_advisory_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(k, n) "
                       "ORDER BY n", [ids])
        got = [k for k, ok in cursor.fetchall() if ok]
    if len(got) == len(ids):
        return True
    _unlock(got)
    return False


def take(clusters: tuple[str, ...], timeout: float | None = None) -> bool:
    """Wait for every turn of ``clusters``, in ascending order (counted as lock wait: ``locking.waiting``), at
    most ``timeout`` seconds (default ``CLAIMS_TURN_WAIT_SECONDS``). False when the wait timed out: then no turn
    of ``clusters`` is held."""
    if not clusters:
        return True
    ids = _ids(clusters)
    seconds = wait_seconds() if timeout is None else timeout
    try:
        # A transaction (a savepoint inside one) scopes the timeout to this wait, and an error to it.
        with transaction.atomic(), connection.cursor() as cursor, locking.waiting():
            cursor.execute(f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'")
            cursor.execute("SELECT count(pg_advisory_lock(k)) FROM unnest(%s::bigint[]) AS k", [ids])
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        # Turns taken before the one the wait timed out on stay held through the rollback (session-level
        # advisory locks ignore transactions): give back every one (unlocking one not held only warns).
        _unlock(ids)
        log.warning("waited %.1f s for the allocation turns of %s: handing the part back", seconds,
                    ", ".join(clusters))
        return False
    return True


def wait_seconds() -> float:
    return float(getattr(settings, "CLAIMS_TURN_WAIT_SECONDS", TURN_WAIT_SECONDS))


def release(clusters: tuple[str, ...]) -> None:
    if clusters:
        _unlock(_ids(clusters))


def _unlock(ids: list[int]) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_advisory_unlock(k)) FROM unnest(%s::bigint[]) AS k", [ids])
    except DatabaseError as exc:  # the session is gone, and its locks with it
        log.warning("could not release allocation turns: %s", exc)


def schedule(parts: list[Part]) -> Generator[tuple[Part, bool], None, None]:
    """Yield ``(part, held)`` for each part of ``parts``: ``held`` while holding its turns (released when the
    caller asks for the next one, or closes the generator: use ``contextlib.closing``), False when waiting for
    them timed out (decide nothing of that part). Free parts first, in their order; a worker waits only when
    every part left is busy."""
    left = list(parts)
    while left:
        index = next((i for i, part in enumerate(left) if try_take(part.clusters)), None)
        held = True
        if index is None:
            index = 0
            held = take(left[0].clusters)
        part = left.pop(index)
        try:
            yield part, held
        finally:
            if held:
                release(part.clusters)
