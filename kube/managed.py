"""``metadata.managedFields``: who manages which fields, and server-side apply's merge, as kube-apiserver's
fieldmanager does it (structured-merge-diff's Updater). Pure: no Django; the door's glue is ``kube.apply``.

An entry per manager and operation: ``Apply`` (one per manager, whatever the version it applied) and ``Update``
(one per manager and apiVersion: creates, updates and patches). An apply:
- sets the fields of its configuration, merged over the live object by the schema's list types;
- conflicts with every other manager owning a field whose value it would change (409, unless forced: then the
  fields move to the applier);
- removes the fields it applied last time and no longer applies, unless another manager owns them;
- leaves the applier owning exactly its configuration's fields.
An update takes the fields it changed (added or modified) from everyone, and nobody keeps fields it removed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from kube import fieldsets
from kube.fieldsets import Path
from kube.schema_nodes import Node

APPLY, UPDATE = "Apply", "Update"


@dataclass
class Owner:
    manager: str
    operation: str
    api_version: str
    time: str
    paths: set[Path] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str, str]:
        # Upstream's manager identifier: an applier is one whatever the version it applied.
        return self.manager, self.operation, "" if self.operation == APPLY else self.api_version

    @property
    def label(self) -> str:
        """As upstream prints a manager in a conflict: ``"kubectl" `` or ``"x" using apps/v1`` (an updater)."""
        name = json.dumps(self.manager, ensure_ascii=False)
        return f"{name} using {self.api_version}" if self.operation == UPDATE else name


@dataclass(frozen=True)
class Conflict:
    owner: str  # Owner.label
    path: Path


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[Conflict]):
        super().__init__(conflict_message(conflicts))
        self.conflicts = conflicts


def conflict_message(conflicts: list[Conflict]) -> str:
    """kube-apiserver's words (``fieldmanager/internal.NewConflictError``)."""
    if len(conflicts) == 1:
        c = conflicts[0]
        return f"Apply failed with 1 conflict: conflict with {c.owner}: {fieldsets.path_string(c.path)}"
    lines = []
    for owner in sorted({c.owner for c in conflicts}):
        lines.append(f"conflicts with {owner}")
        lines += [f"- {fieldsets.path_string(c.path)}" for c in conflicts if c.owner == owner]
    return f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)


def conflict_causes(conflicts: list[Conflict]) -> list[dict]:
    return [{"reason": "FieldManagerConflict", "message": f"conflict with {c.owner}",
             "field": fieldsets.path_string(c.path)} for c in conflicts]


def decode(entries: object) -> list[Owner]:
    """Owners from ``metadata.managedFields``; an entry that is not one is left out."""
    out = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("manager"), str) or e.get("operation") not in (
                APPLY, UPDATE):
            continue
        out.append(Owner(e["manager"], e["operation"], str(e.get("apiVersion") or ""), str(e.get("time") or ""),
                         fieldsets.from_fields_v1(e.get("fieldsV1"))))
    return out


def encode(owners: list[Owner]) -> list[dict]:
    """Entries in upstream's order: operation (Apply first), time, manager, apiVersion."""
    ordered = sorted((o for o in owners if o.paths), key=lambda o: (o.operation, o.time, o.manager, o.api_version))
    return [{"manager": o.manager, "operation": o.operation, "apiVersion": o.api_version, "time": o.time,
             "fieldsType": "FieldsV1", "fieldsV1": fieldsets.to_fields_v1(o.paths)} for o in ordered]


def _find(owners: list[Owner], key: tuple[str, str, str]) -> Owner | None:
    return next((o for o in owners if o.key == key), None)


def _copy(owners: list[Owner]) -> list[Owner]:
    return [Owner(o.manager, o.operation, o.api_version, o.time, set(o.paths)) for o in owners]


def _settle(owners: list[Owner], mine: Owner, paths: set[Path], api_version: str, now: str) -> list[Owner]:
    """``mine`` owning ``paths`` (its time renewed when anything about it changes); empty entries dropped."""
    if mine.paths != paths or mine.api_version != api_version or not mine.time:
        mine.time = now
    mine.paths, mine.api_version = paths, api_version
    if mine not in owners:
        owners.append(mine)
    return [o for o in owners if o.paths]


def apply(live: dict, config: dict, owners: list[Owner], manager: str, api_version: str, force: bool,
          node: Node, now: str) -> tuple[dict, list[Owner]]:
    """The managed part of the object after the apply, and its owners. ``live`` is {} for an object the apply
    creates. Raises ApplyConflict (not forced)."""
    before = fieldsets.managed_part(live)
    wanted = fieldsets.managed_part(config)
    applied = fieldsets.field_set(wanted, node)
    merged = fieldsets.merge(before, wanted, node)
    owners = _copy(owners)
    mine = _find(owners, (manager, APPLY, "")) or Owner(manager, APPLY, api_version, "")
    conflicts = [Conflict(o.label, p) for o in owners if o is not mine
                 for p in sorted(o.paths & applied) if fieldsets.differs(before, merged, p, node)]
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    for o in owners:
        if o is not mine:
            o.paths -= {c.path for c in conflicts if c.owner == o.label}
    kept = set().union(*(o.paths for o in owners if o is not mine))
    dropped = {p for p in mine.paths - applied if not any(q[:len(p)] == p for q in kept)}
    merged = fieldsets.remove(merged, dropped, node)
    return merged, _settle(owners, mine, applied, api_version, now)


def update(before: dict, after: dict, owners: list[Owner], manager: str, api_version: str, node: Node,
           now: str) -> list[Owner]:
    """The owners after a create, update or patch by ``manager`` turned ``before`` ({} on a create) into
    ``after``."""
    old, new = fieldsets.managed_part(before), fieldsets.managed_part(after)
    old_set, new_set = fieldsets.field_set(old, node), fieldsets.field_set(new, node)
    changed = {p for p in new_set if p not in old_set or fieldsets.differs(old, new, p, node)}
    gone = old_set - new_set
    owners = _copy(owners)
    mine = _find(owners, (manager, UPDATE, api_version)) or Owner(manager, UPDATE, api_version, "")
    for o in owners:
        o.paths -= gone
        if o is not mine:
            o.paths -= changed
    if not changed and not mine.paths:
        return [o for o in owners if o.paths]
    return _settle(owners, mine, (mine.paths | changed) - gone, api_version, now)
