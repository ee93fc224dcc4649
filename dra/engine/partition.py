"""A cluster's usable devices in groups that a selector set cannot tell apart, so it is evaluated once per group.

A selector reads a few attributes (its footprint, ``dra.cel.analysis``); devices that agree on them get equal
answers. Which devices a selector set selects in a cluster is then a choice of whole groups, and CI pipelines
that write a commit id into an always-true clause produce thousands of texts with one footprint and one choice:
their key indexes are one and the same. The engine therefore keeps a ``Partition`` per (cluster, footprints) and
shares a key index between the selector sets that choose the same groups of the same partition. A new text costs
one evaluation per group (a few, however many devices the cluster has) instead of one memo lookup per device.

When the footprints read per-device values (a uuid) or cannot be determined, a partition would have about as
many groups as devices: ``build`` gives up past ``max_groups`` and the engine evaluates per device as before.
"""
from __future__ import annotations

import itertools

from .model import REACH_NONE, ClusterModel, Device
from .selectors import MATCH, SelectorSet, cel_device_of

_serials = itertools.count(1)


def max_groups(devices: int) -> int:
    """Beyond this many groups the per-device evaluation is about as cheap (and keeps no lists)."""
    return max(64, devices // 8)


class Partition:
    """Groups of a cluster's usable devices, each in cluster order; ``serial`` names it in index keys (a rebuilt
    partition gets a new one, so an index of an evicted partition is never mistaken for a current one)."""

    __slots__ = ("serial", "groups", "_placed")

    def __init__(self, groups: list[list[Device]]):
        self.serial = next(_serials)
        self.groups = groups
        self._placed: list[list[Device]] | None = None

    def placed(self) -> list[list[Device]]:
        """Per group, the members that some node can reach (a device of a slice without any node field reaches
        none); the group's own list when that is all of them, as it nearly always is. Made once per partition,
        for failure explanations (``explain_walk``), which would otherwise look at every device per new text."""
        if self._placed is None:
            self._placed = [g if all(d.reach != REACH_NONE for d in g) else [d for d in g if d.reach != REACH_NONE]
                            for g in self.groups]
        return self._placed

    def chosen(self, sel: SelectorSet) -> tuple[int, ...]:
        """The groups whose devices ``sel`` matches (a selector failing at run time on a device is no match:
        ``selectors``). One evaluation per group, memoised by ``sel``."""
        return tuple(i for i, group in enumerate(self.groups) if sel.evaluate(group[0]) is MATCH)

    def members(self, chosen: tuple[int, ...]) -> list[Device]:
        groups = self.groups
        return [d for i in chosen for d in groups[i]]


def usable_devices(engine, cluster: ClusterModel) -> list[Device]:
    """The devices a key index may count: of complete, valid pools, and without binding conditions unless the
    feature is on."""
    binding_ok = engine.features.device_binding_and_status
    return [d for d in cluster.devices if d.pool_ref.usable and (binding_ok or not d.binding_conditions)]


def build(engine, sel: SelectorSet, cluster: ClusterModel) -> Partition | None:
    """Devices with equal ``content`` (all CEL can see: the same model in the same slot on many nodes) project
    alike, so only one device per content is projected: the first claim of a shape does not build a CEL view of
    every device of the cluster. Groups keep the order of their first device, members the cluster's order."""
    devices = usable_devices(engine, cluster)
    content_of: dict[tuple, int] = {}
    distinct: list[Device] = []
    kinds = []
    for d in devices:
        k = content_of.get(d.content)
        if k is None:
            k = content_of[d.content] = len(distinct)
            distinct.append(d)
        kinds.append(k)
    positions = engine.cel_cache.group_by_projection(
        sel.class_exprs + sel.request_exprs, [cel_device_of(d) for d in distinct], max_groups(len(devices)))
    if positions is None:
        return None
    group_of = [0] * len(distinct)
    for g, members in enumerate(positions):
        for k in members:
            group_of[k] = g
    groups: list[list[Device]] = [[] for _ in positions]
    for d, k in zip(devices, kinds, strict=True):
        groups[group_of[k]].append(d)
    return Partition(groups)
