"""Reading the change log: list resourceVersions, watch streams, retention.

Every change of a watched row gets a seq from one PostgreSQL sequence (``draservice.changelog_sql``). Seqs
are handed out in write order, not commit order, so a reader can see seq 12 committed while 11 is still in
flight (or was rolled back and will never appear). Serializing writers would fix the order but cost every
claim write a turn at one lock; instead readers stop at a gap and decide it with transaction ids:

* when a reader first sees a gap below seq ``n`` it notes ``horizon`` = the next transaction id to be
  assigned (``pg_snapshot_xmax``). Whoever holds a seq below ``n`` took its transaction id before its seq
  (the trigger does so on purpose), hence before ``n`` was committed, hence below ``horizon``;
* once ``pg_snapshot_xmin`` (the oldest transaction still running) reaches ``horizon``, every such writer
  has ended: the seqs still missing were rolled back and are skipped for good.

So a watch never skips a change, never delivers one twice, and delivers in seq order. ``settled()`` is the
same rule for lists: the highest seq below which nothing can still appear, remembered in
``ChangeLogState`` and advanced past rolled-back seqs by ``seal()`` (beat, every few seconds).

On SQLite (the embedded demo, one writer at a time) seqs are commit-ordered already and there are no gaps
to wait for, beyond rolled-back ones, which ``seal()`` passes in the same way by time.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from draservice.models import Change, ChangeLogState

READ_LIMIT = 1000  # changes read per poll: a watch's memory and query size stay bounded


class Expired(Exception):
    """The asked-for resourceVersion is older than the log keeps (410 Gone upstream)."""

    def __init__(self, asked: int, oldest: int):
        super().__init__(f"too old resource version: {asked} ({oldest})")
        self.asked, self.oldest = asked, oldest


def _snapshot() -> tuple[int, int]:
    """(xmin, xmax) of a fresh snapshot; on SQLite there are no concurrent writers to wait for."""
    if connection.vendor != "postgresql":
        return (0, 0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
                       "pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        xmin, xmax = cursor.fetchone()
    return int(xmin), int(xmax)


def horizon_passed(xmin: int, horizon: int) -> bool:
    """Has every writer that might hold a seq handed out before ``horizon`` ended?

    The snapshot's xmin answers for the whole PostgreSQL cluster, so one long transaction anywhere (another
    database, a report, a developer's open psql) would hold every gap. Writers of the change log live in this
    database only, so it is enough that no backend of this database still runs a transaction that started
    below the horizon (``age`` compares 32-bit xids modulo wraparound). This relies on seeing the writers'
    ``backend_xid``, which PostgreSQL shows for the service's own role: run every writer as that role."""
    if xmin >= horizon:
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND backend_xid IS NOT NULL AND age(backend_xid) > age((%s %% 4294967296)::text::xid)",
                       [horizon])
        return int(cursor.fetchone()[0]) == 0


def _state() -> ChangeLogState:
    state, _ = ChangeLogState.objects.get_or_create(id=1)
    return state


def settled() -> int:
    """A resourceVersion for a list read right after this call: every change with a seq at or below it is
    visible now, so a watch from it misses nothing the list lacks (and may repeat, harmlessly, a change the
    list already shows). Walks only the changes since the remembered watermark."""
    state = _state()
    mark = state.settled
    seqs = list(Change.objects.filter(seq__gt=mark).order_by("seq").values_list("seq", flat=True)[:10 * READ_LIMIT])
    for seq in seqs:
        if seq != mark + 1:
            break
        mark = seq
    if mark > state.settled:
        ChangeLogState.objects.filter(id=1, settled__lt=mark).update(settled=mark)
    return mark


def seal() -> int:
    """Advance the settled watermark past seqs that will never appear (rolled back), by the horizon rule.
    Cheap: two small statements. Returns the watermark."""
    xmin, xmax = _snapshot()
    with transaction.atomic():
        state = ChangeLogState.objects.select_for_update().get_or_create(id=1)[0]
        done = state.pending_seq and (connection.vendor != "postgresql"
                                      or horizon_passed(xmin, state.pending_horizon))
        if done and state.pending_seq > state.settled:
            state.settled = state.pending_seq
        state.pending_seq = _last_seq()
        state.pending_horizon = xmax
        state.save()
    return settled()


def _last_seq() -> int:
    """The highest seq handed out so far (committed or not)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = current_schema() "
                           "AND sequencename = 'draservice_change_seq_seq'")
            return int(cursor.fetchone()[0])
    last = Change.objects.order_by("-seq").values_list("seq", flat=True).first()
    return int(last or 0)


def compact(retention: timedelta | None = None, batch: int = 10_000) -> int:
    """Delete changes older than the retention window (``CHANGES_RETENTION_SECONDS``); a watch from before
    what is left gets 410 Gone. Returns how many rows went."""
    retention = retention or timedelta(seconds=settings.CHANGES_RETENTION_SECONDS)
    cutoff = timezone.now() - retention
    removed = 0
    while True:
        with transaction.atomic():
            last = (Change.objects.filter(at__lt=cutoff, seq__lte=_state().settled).order_by("-seq")
                    .values_list("seq", flat=True).first())
            if last is None:
                return removed
            ids = list(Change.objects.filter(seq__lte=last).order_by("seq").values_list("seq", flat=True)[:batch])
            removed += Change.objects.filter(seq__in=ids).delete()[0]
            ChangeLogState.objects.filter(id=1, compacted_through__lt=ids[-1]).update(compacted_through=ids[-1])
        if len(ids) < batch:
            return removed


def check_not_expired(since: int) -> None:
    compacted = _state().compacted_through
    if since < compacted:
        raise Expired(since, compacted + 1)


@dataclass
class Cursor:
    """A watch's position: the last seq delivered (or skipped as rolled back), and the gap it waits on."""

    seq: int
    gap_horizon: int | None = None
    gap_end: int = 0

    def read(self, resources: set[str], namespace: str | None = None) -> list[Change]:
        """The next changes of these resources (in this namespace, when given) in seq order, advancing the
        cursor over every seq it has settled (including other resources' and rolled-back ones)."""
        xmin, xmax = _snapshot()
        rows = list(Change.objects.filter(seq__gt=self.seq).order_by("seq")[:READ_LIMIT])
        out: list[Change] = []
        for row in rows:
            if row.seq != self.seq + 1 and not self._gap_settled(row.seq, xmin, xmax):
                break
            self.seq, self.gap_horizon = row.seq, None
            if row.resource in resources and (namespace is None or row.namespace == namespace):
                out.append(row)
        return out

    def _gap_settled(self, next_seq: int, xmin: int, xmax: int) -> bool:
        if connection.vendor != "postgresql":
            return True  # one writer at a time: a gap is a rollback
        if self.gap_horizon is None or self.gap_end != next_seq:
            self.gap_horizon, self.gap_end = xmax, next_seq
            return False
        return horizon_passed(xmin, self.gap_horizon)
