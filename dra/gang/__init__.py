"""Gangs: all-or-nothing groups of members, placed close together, on top of the matching engine.

Pure Python: no Django, no database. The worker (``gangs.services``), the simulate endpoint and the
benchmark all call this one library.

Contract
--------
* ``Gang(name, members=[GangMember(name, claims=[v1 ResourceClaim...])], min_member, topology=Topology(levels,
  required, preferred), allowed_clusters=None, preferred_cluster=None)``. Members' claims must be defaulted
  and validated as for the engine; each member's claims are allocated together on one node (one consumer).
* ``GangPlacer(engine, snapshot)`` wraps a long-lived ``dra.engine.Engine`` built from ``snapshot``.
  ``place(gang, commit=True) -> GangOutcome``: on success at least ``min_member`` members are placed, all in
  one domain of the required level, and (with ``commit``) the engine counts their devices as in use; the
  caller persists ``outcome.placements`` or gives them back with ``release_placements``. On failure nothing
  is held, and the outcome says why (``GangReason``), which domain came closest (``closest``) and what the
  other domains had (``domains``).
* ``place(gang, within=(cluster, domain labels))`` places members inside one given domain only: how a gang
  already placed gets its remaining members.

Invalid input (a member's claims wrong for the engine) comes back as ``GangOutcome(reason=InvalidGang,
error=AllocationError, error_member=...)``; an invalid gang (bad topology, ``min_member`` out of range)
raises ``GangSpecError``.
"""
from .placer import MAX_DOMAIN_TRIALS, GangPlacer, GangSpecError
from .topology import TopologyIndex
from .types import DomainReport, Gang, GangMember, GangOutcome, GangReason, MemberPlacement, Topology

__all__ = ["GangPlacer", "GangSpecError", "MAX_DOMAIN_TRIALS", "TopologyIndex", "DomainReport", "Gang",
           "GangMember", "GangOutcome", "GangReason", "MemberPlacement", "Topology"]
