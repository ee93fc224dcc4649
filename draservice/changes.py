"""Reading the change log: list resourceVersions, watch streams, retention.

Every change of a watched row gets a seq from one PostgreSQL sequence (``draservice.changelog_sql``). Seqs
are handed out in write order, not commit order, so a reader can see seq 12 committed while 11 is still in
flight (or was rolled back and will never appear). Serializing writers would fix the order but cost every
claim write a turn at one lock; instead readers stop at a gap and decide it with transaction ids:

* when a reader first sees a gap below seq ``n`` it notes ``horizon`` = one past every transaction id
  assigned so far (``_horizon_after``: not the snapshot's xmax alone). Whoever holds a seq below ``n``
  took its transaction id before its seq (the trigger does so on purpose), hence before ``n`` was committed,
  hence below ``horizon``;
* once ``pg_snapshot_xmin`` (the oldest transaction still running) reaches ``horizon``, every such writer
  has ended: the seqs still missing were rolled back and are skipped for good.

So a watch never skips a change, never delivers one twice, and delivers in seq order. ``settled()`` is the
same rule for lists: the highest seq below which nothing can still appear, remembered in
``ChangeLogState`` and advanced past rolled-back seqs by ``seal()`` (beat, every few seconds).

On SQLite (the embedded demo, one writer at a time) seqs are commit-ordered already and there are no gaps
to wait for, beyond rolled-back ones, which ``seal()`` passes in the same way by time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from draservice.models import Change, ChangeLogState

READ_LIMIT = 1000  # changes read per poll: a watch's memory and query size stay bounded
# Resources logged only for process-local copies kept by ``Follower`` (no watch serves them): allocation rows,
# inserted and deleted by every round. They are kept ROW_CHANGES_RETENTION_SECONDS, not the watches' hour, so
# the log stays a few minutes of allocation churn; a follower further behind reads its table afresh.
ROW_RESOURCES = ("deviceallocations",)
ROW_CHANGES_RETENTION_SECONDS = 300


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
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction the first read would stick
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
    xmin, _ = _snapshot()
    horizon = _horizon_after()
    with transaction.atomic():
        state = ChangeLogState.objects.select_for_update().get_or_create(id=1)[0]
        done = state.pending_seq and (connection.vendor != "postgresql"
                                      or horizon_passed(xmin, state.pending_horizon))
        if done and state.pending_seq > state.settled:
            state.settled = state.pending_seq
        state.pending_seq = last_seq()
        state.pending_horizon = horizon
        state.save()
    return settled()


def last_seq() -> int:
    """The highest seq handed out so far (committed or not)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = current_schema() "
                           "AND sequencename = 'draservice_change_seq_seq'")
            return int(cursor.fetchone()[0])
    last = Change.objects.order_by("-seq").values_list("seq", flat=True).first()
    return int(last or 0)


def compact(retention: timedelta | None = None, batch: int = 10_000, rows_retention: timedelta | None = None) -> int:
    """Delete changes older than the retention window (``CHANGES_RETENTION_SECONDS``; a watch from before
    what is left gets 410 Gone), and those of ``ROW_RESOURCES`` older than their shorter one. Returns how
    many rows went."""
    retention = retention or timedelta(seconds=settings.CHANGES_RETENTION_SECONDS)
    rows_retention = rows_retention or timedelta(
        seconds=getattr(settings, "ROW_CHANGES_RETENTION_SECONDS", ROW_CHANGES_RETENTION_SECONDS))
    now = timezone.now()
    return (_compact(Change.objects.all(), now - retention, batch, "compacted_through")
            + _compact(Change.objects.filter(resource__in=ROW_RESOURCES), now - min(rows_retention, retention),
                       batch, "rows_compacted_through"))


def _compact(qs, cutoff, batch: int, mark: str) -> int:
    """Delete the changes of ``qs`` settled and older than ``cutoff`` (in seq order, ``batch`` at a time), moving the
    watermark ``mark`` of ChangeLogState to the last seq deleted."""
    removed = 0
    while True:
        with transaction.atomic():
            last = (qs.filter(at__lt=cutoff, seq__lte=_state().settled).order_by("-seq")
                    .values_list("seq", flat=True).first())
            if last is None:
                return removed
            ids = list(qs.filter(seq__lte=last).order_by("seq").values_list("seq", flat=True)[:batch])
            removed += Change.objects.filter(seq__in=ids).delete()[0]
            ChangeLogState.objects.filter(id=1, **{f"{mark}__lt": ids[-1]}).update(**{mark: ids[-1]})
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
        xmin, _ = _snapshot()
        # Decided BEFORE the read: a writer that ended before this point is visible to it, one that ends
        # between the read and a later check would not be, and its change would be skipped.
        passed = self.gap_horizon is not None and _horizon_passed_here(xmin, self.gap_horizon)
        rows = list(Change.objects.filter(seq__gt=self.seq).order_by("seq")[:READ_LIMIT])
        out: list[Change] = []
        floor: int | None = None  # every seq at or below it is settled (compacted allocation entries)
        for row in rows:
            # A gap (on SQLite, one writer at a time, always a rollback) stops the read until it is settled.
            gap = row.seq != self.seq + 1 and not (passed and row.seq <= self.gap_end)
            if gap:
                floor = _state().rows_compacted_through if floor is None else floor
                gap = row.seq - 1 > floor
            if gap and connection.vendor == "postgresql":
                if self.gap_horizon is None or row.seq > self.gap_end:
                    self.gap_horizon, self.gap_end = _horizon_after(), row.seq
                break
            self.seq, self.gap_horizon = row.seq, None
            if row.resource in resources and (namespace is None or row.namespace == namespace):
                out.append(row)
        return out


def _horizon_passed_here(xmin: int, horizon: int) -> bool:
    return connection.vendor != "postgresql" or horizon_passed(xmin, horizon)


# One past every transaction id assigned so far. A snapshot's xmax is one past the latest COMPLETED id
# (PostgreSQL 13+), so a transaction still running can hold an id at or above it: the ids of this database's
# running backends are taken into account too, widened from 32 to 64 bits around xmax.
NEXT_XID_SQL = """
WITH s AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS x)
SELECT greatest(s.x, coalesce(max(s.x + ((((a.backend_xid::text::bigint - s.x) % 4294967296) + 6442450944)
                                         % 4294967296) - 2147483648) + 1, 0))
FROM s LEFT JOIN pg_stat_activity a ON a.datname = current_database() AND a.backend_xid IS NOT NULL
GROUP BY s.x
"""


def _horizon_after() -> int:
    """The horizon for a gap just seen below a visible seq ``n``: one past every transaction id assigned as
    of now, AFTER the read that saw ``n`` (a holder of a lower seq may have started after a snapshot taken
    before that read). Found by the property test of the worker's rows: using the snapshot's xmax alone, a
    writer still running with id == xmax was taken for ended and its seq for rolled back."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # the backends as of now, not as first read in this txn
        cursor.execute(NEXT_XID_SQL)
        return int(cursor.fetchone()[0])


# A follower's page: every round reads the log since the last one, and a round of a thousand claims follows
# some thousands of changes (created, allocated, status); pages this large keep that read to one statement,
# so a round's statements do not grow with its size. Rows are a few columns each.
FOLLOW_PAGE = 5 * READ_LIMIT
FOLLOW_PAGES = 4  # pages one ``Follower.read`` reads at most (as many changes as 20 pages of READ_LIMIT)
FOLLOW_MISSING = 200  # at most this many missing seqs are asked for by number; more: the range is re-read


@dataclass
class Follower:
    """Keeps a process-local copy of one resource's rows current from the log (the worker's devices in use).

    Unlike a ``Cursor``, it delivers every change as soon as it is committed, also one beyond a gap (out of
    seq order), so the copy is as current as a fresh read of the table: waiting at a gap would hide a
    release committed after it and leave a claim "unsatisfiable" that the fresh read would have allocated.
    ``seq`` still advances only over settled seqs (the same gap rule), and ``seen`` remembers what was
    delivered above it, so every change is delivered exactly once; the copy must apply them per row (rows
    are only inserted and deleted, ids are never reused), in the order given.

    ``table`` and ``columns``: an ADDED change comes with those columns of its row, read in the same
    statement (None when the row is gone again: its DELETED change follows). In the steady state (no gap
    pending) a read is that one statement.
    """

    resource: str
    seq: int
    table: str = ""
    columns: tuple[str, ...] = ()
    seen: set[int] = field(default_factory=set)  # seqs above ``seq`` already read (any resource)
    gap_horizon: int | None = None
    gap_below: int = 0  # once the horizon has passed, every seq below this is settled
    truncated: bool = False  # the last read stopped at FOLLOW_PAGES: more changes are waiting

    def read(self) -> list[tuple[int, int, str, tuple | None]]:
        """(seq, row_id, type, the row's columns) of this resource's changes not delivered yet, in seq order.
        Raises ``Expired`` when changes it has not read were compacted away: read the table afresh and start
        a new follower."""
        passed = False
        if self.gap_horizon is not None:
            # Decided BEFORE the read (see ``Cursor.read``).
            passed = _horizon_passed_here(_snapshot()[0], self.gap_horizon)
        top = max(self.seen, default=self.seq)
        out: list[tuple[int, int, str, tuple | None]] = []
        missing = top - self.seq - len(self.seen)
        if missing > 0:  # seqs below ``top`` not seen yet: in flight when last read, or rolled back
            wanted = [s for s in range(self.seq + 1, top) if s not in self.seen]
            if missing <= FOLLOW_MISSING:
                marks = ", ".join(["%s"] * len(wanted))
                self._take(self._query(f"c.seq IN ({marks})", wanted)[0], out)
            else:
                self._take(self._query("c.seq > %s AND c.seq < %s", [self.seq, top], limit=None)[0], out)
        after, self.truncated = top, False
        for page_no in range(FOLLOW_PAGES):
            page, compacted = self._query("c.seq > %s", [after])
            if page_no == 0 and self.seq < compacted:
                raise Expired(self.seq, compacted + 1)
            self._take(page, out)
            if len(page) < FOLLOW_PAGE:
                break
            after = page[-1][0]
        else:
            self.truncated = True
        out.sort(key=lambda entry: entry[0])
        self._advance(passed)
        return out

    def _query(self, where: str, params: list, limit: int | None = FOLLOW_PAGE) -> tuple[list[tuple], int]:
        """Changes matching ``where`` in seq order, each with its row's columns, and how far the log was
        compacted as of the same statement (so a change missing from the answer was compacted, if at all,
        by then)."""
        state = ChangeLogState._meta.db_table
        bigger = "greatest" if connection.vendor == "postgresql" else "max"
        cols = "".join(f", t.{c}" for c in self.columns)
        join = (f"LEFT JOIN {self.table} t ON c.resource = %s AND c.type = 'ADDED' AND t.id = c.row_id"
                if self.table else "")
        sql = (f"SELECT c.seq, c.resource, c.row_id, c.type, "
               f"(SELECT {bigger}(compacted_through, rows_compacted_through) FROM {state} WHERE id = 1){cols} "
               f"FROM {Change._meta.db_table} c {join} WHERE {where} ORDER BY c.seq"
               + (f" LIMIT {int(limit)}" if limit else ""))
        with connection.cursor() as cursor:
            cursor.execute(sql, ([self.resource] if self.table else []) + list(params))
            rows = cursor.fetchall()
        if rows:
            compacted = rows[0][4]
        else:
            state_row = _state()
            compacted = max(state_row.compacted_through, state_row.rows_compacted_through)
        return rows, int(compacted or 0)

    def _take(self, rows: list[tuple], out: list) -> None:
        for seq, resource, row_id, kind, _, *columns in rows:
            if seq > self.seq and seq not in self.seen:
                self.seen.add(seq)
                if resource == self.resource:
                    row = tuple(columns) if self.table and kind == "ADDED" and columns[0] is not None else None
                    out.append((seq, row_id, kind, row))

    def _advance(self, passed: bool) -> None:
        if passed:  # every seq below gap_below is settled: the missing ones will never appear
            self.seq = max(self.seq, self.gap_below - 1)
            self.seen = {s for s in self.seen if s > self.seq}
            self.gap_horizon = None
        while self.seq + 1 in self.seen:
            self.seq += 1
            self.seen.discard(self.seq)
        if not self.seen:
            self.gap_horizon = None
        elif connection.vendor != "postgresql":
            self.seq, self.seen = max(self.seen), set()  # one writer at a time: a gap is a rollback
        elif self.gap_horizon is None:
            self.gap_horizon, self.gap_below = _horizon_after(), max(self.seen)
