"""The overview's claim counts (claims per phase, the pending ones and the oldest), maintained from the change log.

Counting phases reads every claim row (tens of thousands of wide rows), too much for each change of a busy
fleet. Every write that changes a claim bumps its ``resource_version``, which puts a row in the change log
(``draservice.models.Change``, written by a trigger: no write path can forget it). So the tally reads the
whole claim table once per process, then only the claims the log names since its watermark.

The tally remembers the highest seq it has read, and the seqs below it it has not seen: seqs are handed out
in write order, not commit order, so a gap is a change still in flight (or one rolled back). Each refresh
reads the log above the highest seq and looks the missing seqs up by seq, until they appear or the log's
settled seq (``draservice.changes``, moved past rolled-back seqs by the beat's ``seal``) passes them. So a
change that commits late is never missed, and reading a claim twice is harmless (its current phase is what is
counted). A log compacted past the tally, or too many changes or gaps at once, costs one full read instead.
Rows removed without the trigger (TRUNCATE: a test database's flush) are not seen until the process restarts.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime

from claims.models import Phase, ResourceClaim
from draservice.models import Change

RESOURCE = "resourceclaims"
MAX_CHANGES = 5000  # beyond this many log rows since the last read, one full read is cheaper
MAX_MISSING = 1000  # seqs not seen yet (in flight, or rolled back and not sealed): beyond, one full read
# A full read now and then whatever the log says: a safety net that costs one read per process per interval,
# however often the overview is polled.
FULL_READ_SECONDS = 600


class ClaimTally:
    def __init__(self) -> None:
        self.seen: int | None = None  # every change at or below it is reflected, but those in ``missing``
        self.missing: set[int] = set()
        self.read_at = 0.0
        self.phases: dict[int, str] = {}
        self.pending: dict[int, datetime] = {}  # id -> created_at of the pending claims
        self.counts: dict[str, int] = {p.value: 0 for p in Phase}
        self.lock = threading.Lock()

    def summary(self, log: tuple[int, int, int]) -> tuple[dict[str, int], int | None]:
        """(claims per phase, the id of the oldest pending claim), up to date with the change log as ``log``
        describes it: (highest seq, settled seq, compacted through). Nothing is read when every change up to
        the highest seq is reflected already."""
        last_seq, settled, compacted = log
        with self.lock:
            # seen > last_seq: the log was emptied and its sequence restarted (``manage.py flush``).
            if self.seen is None or self.seen < compacted or self.seen > last_seq \
                    or time.monotonic() - self.read_at > FULL_READ_SECONDS:
                self._read_all(last_seq, settled)
            else:
                self.missing = {seq for seq in self.missing if seq > settled}
                if self.seen < last_seq or self.missing:
                    self._follow(settled)
            oldest = min(self.pending.items(), key=lambda kv: (kv[1], kv[0]))[0] if self.pending else None
            return dict(self.counts), oldest

    def _follow(self, settled: int) -> None:
        assert self.seen is not None
        rows = list(Change.objects.filter(seq__gt=self.seen).order_by("seq")
                    .values_list("seq", "resource", "row_id")[:MAX_CHANGES + 1])
        if len(rows) > MAX_CHANGES:
            self._read_all(rows[-1][0], settled)
            return
        # Seqs skipped between those read are changes still in flight (or rolled back): looked up by seq
        # until they appear or the log's settled seq passes them.
        previous = self.seen
        for seq, _, _ in rows:
            self.missing.update(s for s in range(previous + 1, seq) if s > settled)
            previous = seq
        if len(self.missing) > MAX_MISSING:
            self._read_all(previous, settled)
            return
        if self.missing:
            late = list(Change.objects.filter(seq__in=self.missing).values_list("seq", "resource", "row_id"))
            self.missing.difference_update(seq for seq, _, _ in late)
            rows += late
        ids = {row_id for _, resource, row_id in rows if resource == RESOURCE}
        found = set()
        for claim_id, phase, created_at in ResourceClaim.objects.filter(id__in=ids).values_list(
                "id", "phase", "created_at"):
            found.add(claim_id)
            self._set(claim_id, phase, created_at)
        for claim_id in ids - found:  # deleted
            self._set(claim_id, None, None)
        self.seen = max(previous, self.seen)

    def _read_all(self, last_seq: int, settled: int) -> None:
        # Seqs up to the highest one not in the log yet are in flight (or rolled back): remembered as missing,
        # within the last MAX_MISSING seqs; a writer that holds its seq while more changes than that commit
        # after it is caught by the next full read (FULL_READ_SECONDS).
        floor = max(settled, last_seq - MAX_MISSING)
        present = set(Change.objects.filter(seq__gt=floor, seq__lte=last_seq).values_list("seq", flat=True))
        self.phases, self.pending = {}, {}
        self.counts = {p.value: 0 for p in Phase}
        for claim_id, phase, created_at in ResourceClaim.objects.order_by().values_list("id", "phase", "created_at") \
                .iterator(chunk_size=5000):
            self._set(claim_id, phase, created_at)
        self.seen, self.missing = last_seq, set(range(floor + 1, last_seq + 1)) - present
        self.read_at = time.monotonic()

    def _set(self, claim_id: int, phase: str | None, created_at: datetime | None) -> None:
        old = self.phases.pop(claim_id, None)
        if old is not None:
            self.counts[old] -= 1
        self.pending.pop(claim_id, None)
        if phase is None:
            return
        self.phases[claim_id] = phase
        self.counts[phase] = self.counts.get(phase, 0) + 1
        if phase == Phase.PENDING:
            self.pending[claim_id] = created_at  # type: ignore[assignment]
