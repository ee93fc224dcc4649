"""The overview's claim counts (claims per phase, the pending ones and the oldest), maintained from the change log.

Counting phases reads every claim row (tens of thousands of wide rows), too much for each change of a busy
fleet. Every write that changes a claim bumps its ``resource_version``, which puts a row in the change log
(``draservice.models.Change``, written by a trigger: no write path can forget it). So the tally reads the
whole claim table once per process, then only the claims the log names since its watermark.

The tally's watermark is a seq at or below which every change is reflected. Seqs are handed out in write
order, not commit order, so the watermark advances only along seqs that follow each other (or to the log's
settled seq, which the beat's ``seal`` moves past rolled-back ones: ``draservice.changes``); changes above a
gap are read again on the next refresh until the watermark passes them. So a change that commits late is
never missed, and reading a claim twice is harmless (its current phase is what is counted). A watermark the
log no longer reaches back to (compacted), or too many changes at once, costs one full read instead.
Rows removed without the trigger (TRUNCATE: a test database's flush) are not seen until the process restarts.
"""
from __future__ import annotations

import threading
from datetime import datetime

from claims.models import Phase, ResourceClaim
from draservice.models import Change

RESOURCE = "resourceclaims"
MAX_CHANGES = 5000  # beyond this many log rows since the watermark, one full read is cheaper


class ClaimTally:
    def __init__(self) -> None:
        self.mark: int | None = None  # every change at or below it is reflected
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
            if self.mark is None or self.mark < compacted:
                self._read_all(settled)
            elif self.mark < last_seq:
                self._follow(settled)
            oldest = min(self.pending.items(), key=lambda kv: (kv[1], kv[0]))[0] if self.pending else None
            return dict(self.counts), oldest

    def _follow(self, settled: int) -> None:
        assert self.mark is not None
        rows = list(Change.objects.filter(seq__gt=self.mark).order_by("seq")
                    .values_list("seq", "resource", "row_id")[:MAX_CHANGES + 1])
        if len(rows) > MAX_CHANGES:
            self._read_all(settled)
            return
        # The new watermark: past everything the beat's seal settled (rolled-back seqs included), then along
        # the seqs read here while they follow each other. A gap is a change still in flight (or rolled back
        # and not yet sealed): everything above it is read again next time.
        mark = max(self.mark, settled)
        for seq, _, _ in rows:
            if seq == mark + 1:
                mark = seq
            elif seq > mark:
                break
        ids = {row_id for _, resource, row_id in rows if resource == RESOURCE}
        found = set()
        for claim_id, phase, created_at in ResourceClaim.objects.filter(id__in=ids).values_list(
                "id", "phase", "created_at"):
            found.add(claim_id)
            self._set(claim_id, phase, created_at)
        for claim_id in ids - found:  # deleted
            self._set(claim_id, None, None)
        self.mark = mark

    def _read_all(self, settled: int) -> None:
        # Every change at or below ``settled`` is committed, so visible to the read below.
        self.phases, self.pending = {}, {}
        self.counts = {p.value: 0 for p in Phase}
        for claim_id, phase, created_at in ResourceClaim.objects.order_by().values_list("id", "phase", "created_at") \
                .iterator(chunk_size=5000):
            self._set(claim_id, phase, created_at)
        self.mark = settled

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
