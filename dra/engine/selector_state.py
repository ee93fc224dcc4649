"""The engine's per-selector state, bounded: selector sets, their key indexes and node candidates.

A worker's engine lives for hours and meets an endless stream of distinct selectors (CI pipelines put commit
ids, product names and versions in them). Everything kept per selector is therefore held in LRU order with a
cap, and what the cap evicts is rebuilt on demand from the snapshot (results are identical; only time is
spent). Allocation cost does not depend on how many selectors are kept either: availability changes go to a
per-cluster change log that each ``KeyIndex`` replays when it is next used (``index.KeyIndex.catch_up``).
A new selector text is evaluated once per group of alike devices (``partition``), and shares the key index of
any set that selects the same devices.
"""
from __future__ import annotations

from collections import OrderedDict

from . import partition
from .index import KeyIndex
from .model import ClusterModel, Device, Node
from .partition import Partition
from .selectors import MATCH, SelectorSet

# Defaults; an Engine may be built with others. A selector set costs one byte per device of the fleet plus a
# bounded memo by device content; a key index a few dict entries per node of its cluster.
MAX_SELECTOR_SETS = 1024
MAX_KEY_INDEXES = 512
MAX_NODE_CANDIDATE_LISTS = 50_000
# Partitions (one per cluster and distinct footprints of selector sets, see partition.py): a list entry per usable
# device of the cluster, ~80 KB per 10,000 devices. Distinct footprints are few (texts differ in literals).
MAX_PARTITIONS = 128


class SelectorState:
    def __init__(self, engine, max_selector_sets: int = MAX_SELECTOR_SETS, max_key_indexes: int = MAX_KEY_INDEXES):
        self.engine = engine
        self.max_selector_sets = max(1, max_selector_sets)
        self.max_key_indexes = max(1, max_key_indexes)
        self.sets: OrderedDict[tuple, SelectorSet] = OrderedDict()
        # The set last made most recent (None once another may have become so): a group touches its sets several
        # times per allocation and consecutive groups share them, so most touches have nothing to move.
        self._latest: SelectorSet | None = None
        # (choice, cluster) -> index. The choice is ("set", selector key) for a set evaluated per device, or
        # ("groups", partition serial, chosen groups): then every set choosing those groups shares the index.
        self.indexes: OrderedDict[tuple, KeyIndex] = OrderedDict()
        self.index_of: dict[tuple, dict[str, tuple]] = {}  # selector key -> cluster -> its index's key
        self.partitions: OrderedDict[tuple, Partition | None] = OrderedDict()  # (cluster, footprints) -> groups
        self.node_cand_lists = 0  # node candidate lists kept on the sets (``SelectorSet.node_cands``)
        # The index last made most recent in ``indexes`` (as ``_latest`` for sets).
        self._latest_index: KeyIndex | None = None
        # Per cluster: availability changes not yet seen by every index of the cluster, and the absolute log
        # position of the first entry kept. A cluster without an index logs nothing. An entry is an int for a
        # device, ``idx << 1 | 1`` when it became free and ``idx << 1`` when it stopped being free, or a node's
        # name when the node went from unused to used or back: no tuple per change for the collector to track.
        self.log: dict[str, list[int | str]] = {}
        self.log_start: dict[str, int] = {}
        self.log_limit: dict[str, int] = {}
        self.evicted_sets = 0
        self.evicted_indexes = 0
        self.rebuilt_indexes = 0
        self.shared_indexes = 0  # a new selector set found the index of its choice already built

    # ------------------------------------------------------------------------------------------ selector sets
    def selector_set(self, key: tuple, make) -> SelectorSet:
        sel = self.sets.get(key)
        self._latest = None
        if sel is None:
            sel = self.sets[key] = make()
            self._evict_sets()
        else:
            self.sets.move_to_end(key)
        return sel

    def touch(self, sel: SelectorSet) -> None:
        """``sel`` is in use (perhaps from a cached plan after it was evicted): keep it, most recent first."""
        if sel is self._latest:
            return
        held = self.sets.get(sel.key)
        if held is sel:
            self.sets.move_to_end(sel.key)
            self._latest = sel
            return
        if held is not None:  # another set of the same text (made after this one's eviction) gives way
            self._drop_lists(held)
        self._latest = None
        self.sets[sel.key] = sel
        self._evict_sets()

    def _drop_lists(self, sel: SelectorSet) -> None:
        self.node_cand_lists -= len(sel.node_cands)
        sel.node_cands = {}
        sel.key_indexes = {}

    def _evict_sets(self) -> None:
        while len(self.sets) > self.max_selector_sets:
            key, sel = self.sets.popitem(last=False)
            if sel is self._latest:
                self._latest = None
            # Its own indexes go with it; shared ones stay for the other sets choosing the same devices (the
            # index LRU bounds them).
            for cluster in self.engine.clusters:
                ki = self.indexes.pop((("set", key), cluster), None)
                if ki is not None:
                    ki.evicted = True
                    if ki is self._latest_index:
                        self._latest_index = None
                    self._index_gone(cluster)
            self.index_of.pop(key, None)
            self._drop_lists(sel)
            sel.forget()
            self.evicted_sets += 1

    # ------------------------------------------------------------------------------------------ key indexes
    def key_index(self, sel: SelectorSet, cluster: ClusterModel) -> KeyIndex:
        if sel is not self._latest:
            self.touch(sel)
        name = cluster.name
        ki = sel.key_indexes.get(name)
        log = self.log.get(name)
        if ki is None or ki.evicted or log is None or ki.position < self.log_start[name]:
            ki = self._resolve_index(sel, cluster)
            sel.key_indexes[name] = ki
            log = self.log[name]
        elif ki is not self._latest_index:
            self.indexes.move_to_end(ki.choice)
            self._latest_index = ki
        end = self.log_start[name] + len(log)
        if ki.position < end:
            ki.catch_up(log[ki.position - self.log_start[name]:])
            ki.position = end
        return ki

    def _resolve_index(self, sel: SelectorSet, cluster: ClusterModel) -> KeyIndex:
        """``sel``'s index in ``cluster`` through the LRU: its own, another set's of the same choice, or new."""
        name = cluster.name
        log = self.log.setdefault(name, [])
        if name not in self.log_limit:
            self.log_limit[name] = max(4096, 2 * len(cluster.devices))
        start = self.log_start.setdefault(name, 0)
        end = start + len(log)
        known = self.index_of.get(sel.key)
        k: tuple = known.get(name, ()) if known is not None else ()  # () names no index
        ki = self.indexes.get(k)
        if ki is None or ki.position < start:
            # First use in this cluster, its index was evicted, or it fell behind the kept log (a rebuild is
            # cheaper than the replay would have been). Find what the set chooses (cheap with a partition) and
            # whether another set's current index already counts exactly those devices.
            behind = ki is not None
            self.rebuilt_indexes += behind
            k, members = self._choice(sel, cluster)
            self.index_of.setdefault(sel.key, {})[name] = k
            ki = self.indexes.get(k)
            if ki is None or ki.position < start:
                return self._new_index(k, cluster, members(), end)
            self.shared_indexes += not behind
        self.indexes.move_to_end(k)
        self._latest_index = ki
        return ki

    def _new_index(self, k: tuple, cluster: ClusterModel, members: list[Device], end: int) -> KeyIndex:
        old = self.indexes.pop(k, None)
        if old is not None:  # fell behind the log: replaced
            old.evicted = True
        ki = self.indexes[k] = KeyIndex(self.engine, cluster, members, end, k)
        self._latest_index = ki
        self._evict_indexes(keep=k)
        return ki

    def _choice(self, sel: SelectorSet, cluster: ClusterModel):
        """(index key, devices of the index) for ``sel`` in ``cluster``; the devices are listed on demand."""
        part = self.partition(sel, cluster)
        if part is None:
            def members() -> list[Device]:
                return [d for d in partition.usable_devices(self.engine, cluster) if sel.evaluate(d) is MATCH]
            return (("set", sel.key), cluster.name), members
        chosen = part.chosen(sel)
        return (("groups", part.serial, chosen), cluster.name), lambda: part.members(chosen)

    def partition(self, sel: SelectorSet, cluster: ClusterModel) -> Partition | None:
        pk = (cluster.name, self.engine.cel_cache.footprint_key(sel.class_exprs + sel.request_exprs))
        if pk in self.partitions:
            self.partitions.move_to_end(pk)
            return self.partitions[pk]
        part = self.partitions[pk] = partition.build(self.engine, sel, cluster)
        if len(self.partitions) > MAX_PARTITIONS:
            self.partitions.popitem(last=False)
        return part

    def _evict_indexes(self, keep: tuple) -> None:
        while len(self.indexes) > self.max_key_indexes:
            k = next(iter(self.indexes))
            if k == keep:
                break
            ki = self.indexes.pop(k)
            ki.evicted = True
            if ki is self._latest_index:
                self._latest_index = None
            self._index_gone(k[1])
            self.evicted_indexes += 1

    def _index_gone(self, cluster: str) -> None:
        if not any(c == cluster for _, c in self.indexes):
            self.log.pop(cluster, None)
            self.log_start.pop(cluster, None)
            self.log_limit.pop(cluster, None)

    def note_device(self, cluster: str, d: Device, free: bool) -> None:
        """``d`` became free (``free``) or stopped being free."""
        log = self.log.get(cluster)
        if log is not None:
            log.append(d.idx << 1 | free)
            if len(log) > self.log_limit[cluster]:
                self._cut(cluster, log)

    def note_node(self, cluster: str, node: str) -> None:
        """``node`` went from unused to used or back (its place in the node order changes)."""
        log = self.log.get(cluster)
        if log is not None:
            log.append(node)
            if len(log) > self.log_limit[cluster]:
                self._cut(cluster, log)

    def _cut(self, cluster: str, log: list) -> None:
        # Keep the newer half. An index behind the cut is rebuilt when next used: replaying more changes than its
        # cluster has devices would cost more than building it afresh.
        cut = len(log) // 2
        del log[:cut]
        self.log_start[cluster] += cut

    # ------------------------------------------------------------------------------------------ node candidates
    def node_candidates(self, sel: SelectorSet, cluster: ClusterModel, node: Node) -> list[Device]:
        """Devices reachable from ``node`` that ``sel`` does not rule out, in allocation order (static)."""
        if sel is not self._latest:
            self.touch(sel)
        k = (cluster.name, node.name)
        cands = sel.node_cands.get(k)
        if cands is None:
            if self.node_cand_lists >= MAX_NODE_CANDIDATE_LISTS:
                for held in self.sets.values():
                    held.node_cands = {}
                self.node_cand_lists = 0
            binding_ok = self.engine.features.device_binding_and_status
            cands = sel.node_cands[k] = [d for d in cluster.node_candidates(node)
                                         if (binding_ok or not d.binding_conditions) and sel.evaluate(d) is MATCH]
            self.node_cand_lists += 1
        return cands

    def stats(self) -> dict:
        return {"selector_sets": len(self.sets), "key_indexes": len(self.indexes),
                "evicted": self.evicted_sets, "evicted_indexes": self.evicted_indexes,
                "rebuilt_indexes": self.rebuilt_indexes, "shared_indexes": self.shared_indexes,
                "partitions": len(self.partitions), "logged": sum(len(v) for v in self.log.values())}
