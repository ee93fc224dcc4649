"""Incremental per-selector indexes: for one choice of devices in one cluster, the free matching devices per node.

One choice: what a selector set selects there. Selector sets that select the same devices (texts differing
only in a commit id) share one index (``partition``).

They answer "which nodes could possibly hold this request, best first" without a fleet rescan per claim. The
counts are upper bounds (a free device may still be blocked by counters, capacity, taints or constraints), so
pruning with them never loses a solution; the exact search on a node decides.

An index is not told of every change as it happens: the engine appends each availability change of a cluster
to that cluster's change log, and an index catches up when it is next used (``catch_up``). So the cost of an
allocation does not grow with the number of indexes a worker keeps (one per distinct selector it has seen),
and an index nobody uses costs nothing until the engine evicts it.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from .model import REACH_NODE, ClusterModel, Device
from .policy import node_score


class KeyIndex:
    """Free devices matching one choice of devices in one cluster: per node (node-local) and network-attached.

    ``members`` are the usable devices that the selector set (or sets: see ``partition``) does not rule out."""

    def __init__(self, engine, cluster: ClusterModel, members: Iterable[Device], position: int = 0,
                 choice: tuple = ()):
        self.engine = engine
        self.cluster = cluster
        self.position = position  # the cluster change-log position this index reflects
        self.choice = choice  # its key in the engine's index LRU (``selector_state``)
        self.evicted = False  # dropped from that LRU: a selector set holding it must look its index up again
        self.base = cluster.devices[0].idx if cluster.devices else 0
        self.member = bytearray(len(cluster.devices))  # device idx - base -> 1 if the selector set matches
        self.local_free: dict[str, int] = {n: 0 for n in cluster.node_order}
        self.net_free = 0
        self.score: dict[str, tuple] = {}
        self.buckets: dict[tuple, list[str]] = {}
        self._sorted_scores: list[tuple] | None = None
        self.multi = False  # any member can be shared: one device may serve several requests
        avail, member, base = engine.avail, self.member, self.base
        local_free = self.local_free
        for d in members:
            member[d.idx - base] = 1
            if d.allow_multiple:
                self.multi = True
            if not avail[d.idx]:
                continue
            if d.reach == REACH_NODE:
                assert d.node_name is not None  # a node-local device names its node
                local_free[d.node_name] = local_free.get(d.node_name, 0) + 1
            else:
                self.net_free += 1
        for node in cluster.node_order:
            self._place(node)

    # ------------------------------------------------------------------------------------------ maintenance
    def _place(self, node: str) -> None:
        bucket: list[str] | None
        score = node_score(self.engine.node_used.get((self.cluster.name, node), 0) > 0, self.local_free.get(node, 0))
        old = self.score.get(node)
        if old == score:
            return
        if old is not None:
            bucket = self.buckets[old]
            del bucket[bisect.bisect_left(bucket, node)]
            if not bucket:
                del self.buckets[old]
                self._sorted_scores = None
        self.score[node] = score
        bucket = self.buckets.get(score)
        if bucket is None:
            self.buckets[score] = [node]
            self._sorted_scores = None
        else:
            bisect.insort(bucket, node)

    def catch_up(self, changes: list[int | str]) -> None:
        """Apply the cluster's change-log entries since ``position``: ``idx << 1 | 1`` when device ``idx`` became
        free, ``idx << 1`` when it stopped being free, a node's name when it went from unused to used or back."""
        member, base, devices = self.member, self.base, self.engine.devices
        for entry in changes:
            if isinstance(entry, str):  # a node name
                self._place(entry)
            elif member[(entry >> 1) - base]:
                self.device_changed(devices[entry >> 1], 1 if entry & 1 else -1)

    def device_changed(self, d: Device, delta: int) -> None:
        """``delta`` is +1 when ``d`` became free, -1 when it stopped being free."""
        if d.reach == REACH_NODE:
            assert d.node_name is not None
            self.local_free[d.node_name] += delta
            self._place(d.node_name)
        else:
            self.net_free += delta

    def node_usage_changed(self, node: str) -> None:
        self._place(node)

    # ------------------------------------------------------------------------------------------ queries
    def free_on(self, node: str) -> int:
        return self.local_free.get(node, 0) + self.net_free

    def nodes(self, need: int):
        """Node names in policy order that have at least ``need`` free matching devices (local + network)."""
        if self._sorted_scores is None:
            self._sorted_scores = sorted(self.buckets)
        for score in list(self._sorted_scores):
            if score[1] + self.net_free < need:
                continue
            bucket = self.buckets.get(score)
            if bucket:
                for node in list(bucket):
                    yield score, node
