"""Creating, releasing and deleting gangs, and reading a gang's members with their claims.

A gang's members are consumers of the claims app, created through its own service (``create_consumer``),
so claims from templates, reservations and their events are made exactly as for any consumer. The gang
then puts the hold on the member claims (``hold``) in the same transaction, before anyone can see them.

Lock order, everywhere in this app: the gang row, then its member claims (by id), then what the claims
app's own services lock after that. Never the other way round.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from claims.models import Phase, Reservation, ResourceClaim
from claims.services import claims as claim_services
from claims.services import consumers as consumer_services
from claims.services import queueing
from claims.services.conditions import set_condition
from draservice.errors import AlreadyExists, Conflict, Invalid, ServiceError
from draservice.etag import check_precondition
from gangs import dispatch
from gangs.models import Gang, GangMember, GangPhase, MemberPhase
from gangs.services import events as ev
from gangs.services import hold
from gangs.spec import parse_gang

PLACED_CONDITION = "Placed"


def set_gang_condition(gang: Gang, status: bool, reason: str, message: str, now) -> None:
    gang.conditions = set_condition(gang.conditions, PLACED_CONDITION, status, reason, message, now)


# --------------------------------------------------------------------------------------------- create

def create_gang(ns_name: str, obj: dict,
                generated: dict[str, consumer_services.Generated] | None = None) -> Gang:
    """One transaction: the gang, one consumer per member (with claims from templates), the hold on every
    member claim. Placement is requested after commit. ``generated``: per member name, what its consumer's
    claims carry (a pod group's pods: claims named after the pod, the pod's queue label)."""
    meta, spec = parse_gang(obj, ns_name)
    with transaction.atomic():
        ns = claim_services.get_namespace_for_write(ns_name)
        if Gang.objects.filter(namespace=ns, name=meta["name"]).exists():
            raise AlreadyExists([("metadata.name", f'gangs "{meta["name"]}" already exists')])
        now = timezone.now()
        timeout = spec.get("scheduleTimeoutSeconds")
        n = len(spec["members"])
        gang = Gang(namespace=ns, name=meta["name"], labels=meta["labels"], annotations=meta["annotations"],
                    spec=spec, min_member=spec["minMember"], member_count=n, schedule_timeout_seconds=timeout,
                    deadline=now + timedelta(seconds=timeout) if timeout else None, waiting_count=n,
                    reason="WaitingForPlacement", message="waiting for the gang worker")
        set_gang_condition(gang, False, gang.reason, gang.message, now)
        try:
            with transaction.atomic():
                gang.save()
        except IntegrityError as exc:
            raise Conflict(f'gangs "{gang.name}" was created concurrently') from exc
        consumers = [_member_consumer(ns_name, gang, i, m, (generated or {}).get(m["name"]))
                     for i, m in enumerate(spec["members"])]
        claims = _hold_member_claims(gang, consumers, now)
        GangMember.objects.bulk_create([GangMember(gang=gang, name=m["name"], index=i, consumer=c)
                                        for i, (m, c) in enumerate(zip(spec["members"], consumers, strict=False))])
        ev.record([ev.event(gang, ev.CREATED, "Created",
                            f"{n} members ({len(claims)} claims), minMember {gang.min_member}")])
        gang_id = gang.id
        transaction.on_commit(lambda: dispatch.request_placement(gang_id))
    return gang


def _member_consumer(ns_name: str, gang: Gang, i: int, member: dict,
                     generated: consumer_services.Generated | None = None):
    path = f"spec.members[{i}]"
    body = {"metadata": {"name": f"{gang.name}-{member['name']}", "labels": {hold.GANG_LABEL: gang.name}},
            "spec": {"resourceClaims": member["resourceClaims"]}}
    try:
        return consumer_services.create_consumer(ns_name, body, path, generated)
    except ServiceError as exc:
        # The claims app words paths for a Consumer body; say them in terms of the gang's spec.
        errors = [(e["field"].replace(f"{path}.spec.", f"{path}.").replace(f"{path}.metadata.name", f"{path}.name"),
                   e["reason"]) for e in exc.errors]
        raise exc.with_errors(errors) from exc


def _hold_member_claims(gang: Gang, consumers: list, now) -> list[ResourceClaim]:
    by_claim: dict[int, list[int]] = {}
    for consumer_id, claim_id in Reservation.objects.filter(consumer__in=consumers).values_list("consumer_id",
                                                                                               "claim_id"):
        by_claim.setdefault(claim_id, []).append(consumer_id)
    claims = list(ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                  .filter(id__in=list(by_claim)).order_by("id"))
    others = dict(Reservation.objects.filter(claim_id__in=list(by_claim)).exclude(consumer__in=consumers)
                  .values("claim_id").annotate(n=Count("id")).values_list("claim_id", "n"))
    errors = []
    for c in claims:
        # The gang allocates its members' claims itself, all or nothing. A claim someone else also uses, or one
        # that is already allocated, would tie the gang to decisions made outside it.
        if c.phase != Phase.PENDING:
            errors.append(("spec.members", f'resourceclaims "{c.name}" is {c.phase}: a gang member\'s claims must '
                                           "be pending (the gang allocates them)"))
        elif len(by_claim[c.id]) > 1 or others.get(c.id):
            errors.append(("spec.members", f'resourceclaims "{c.name}" is shared: a gang member\'s claims are its '
                                           "own (share devices through the claims API instead)"))
    # The whole gang is one unit of admission: one queue for every member's claims.
    errors += queueing.check_new_claims(gang.namespace.name, [("spec.members", c) for c in claims], unit=True)
    if errors:
        raise Invalid(errors)
    hold.hold(claims, gang.name, f"allocated together with gang {gang.name}", now)
    return claims


# --------------------------------------------------------------------------------------------- members

@dataclass
class MemberClaims:
    member: GangMember
    claims: list[ResourceClaim] = field(default_factory=list)  # in the consumer's resourceClaims order

    @property
    def state(self) -> str:
        """pending | placed | stray (allocated outside the gang) | lost."""
        if self.member.consumer_id is None or not self.claims:
            return "lost"
        phases = {c.phase for c in self.claims}
        if phases == {Phase.PENDING}:
            return "pending"
        if phases == {Phase.ALLOCATED}:
            return "placed" if self.member.phase == MemberPhase.PLACED else "stray"
        return "lost"


def member_claims(gang: Gang, *, lock: bool = False, skip_locked: bool = False
                  ) -> tuple[list[MemberClaims], str | None]:
    """The members and their claims; with ``lock`` the claims are locked FOR UPDATE (by id).

    The second value is "busy" when ``skip_locked`` found a member claim locked by another transaction.
    """
    members = list(gang.members.select_related("consumer").order_by("index"))
    consumer_ids = [m.consumer_id for m in members if m.consumer_id]
    entries = list(Reservation.objects.filter(consumer_id__in=consumer_ids).values_list("consumer_id", "claim_id",
                                                                                         "entry"))
    ids = sorted({claim_id for _, claim_id, _ in entries})
    qs = ResourceClaim.objects.select_related("namespace").filter(id__in=ids).order_by("id")
    if lock:
        qs = qs.select_for_update(skip_locked=skip_locked, of=("self",))
    claims = {c.id: c for c in qs}
    problem = None
    if len(claims) < len(ids) and skip_locked:
        missing = set(ids) - set(claims)
        if ResourceClaim.objects.filter(id__in=missing).exists():
            problem = "busy"
    by_consumer: dict[int | None, list[tuple[str, ResourceClaim]]] = {}  # looked up by a member's consumer_id
    for consumer_id, claim_id, entry in entries:
        if claim_id in claims:
            by_consumer.setdefault(consumer_id, []).append((entry, claims[claim_id]))
    out = []
    for m in members:
        order = [e.get("name") for e in ((m.consumer.spec or {}).get("resourceClaims") or [])] if m.consumer else []
        rows = sorted(by_consumer.get(m.consumer_id, []), key=lambda ec: order.index(ec[0]) if ec[0] in order else 99)
        out.append(MemberClaims(m, [c for _, c in rows]))
    return out, problem


# --------------------------------------------------------------------------------------------- release

def fail_timeout(gang: Gang, mcs: list[MemberClaims], now) -> None:
    why = f": {gang.message}" if gang.message and gang.reason not in ("WaitingForPlacement", "") else ""
    finish_locked(gang, mcs, GangPhase.FAILED, "ScheduleTimeout",
                  f"not placed within scheduleTimeoutSeconds={gang.schedule_timeout_seconds}{why}", now)


def finish_locked(gang: Gang, mcs: list[MemberClaims], phase: str, reason: str, message: str, now) -> None:
    """Fail or release a gang whose row and member claims the caller has locked: every member claim that is
    pending or allocated is released (its devices freed at once), members and gang say why."""
    claim_reason = f"Gang{reason}" if not reason.startswith("Gang") else reason
    for mc in mcs:
        for c in mc.claims:
            if c.phase in (Phase.PENDING, Phase.ALLOCATED):
                # The claims app's own release: devices freed, events, freed devices counted and offered.
                claim_services.release_claim(c.id, reason=claim_reason, message=f"gang {gang.name}: {message}")
        if mc.member.phase != MemberPhase.LOST:
            mc.member.phase = MemberPhase.RELEASED
    GangMember.objects.bulk_update([mc.member for mc in mcs], ["phase"])
    gang.phase = phase
    gang.reason, gang.message = reason, message
    gang.placed_count = gang.waiting_count = 0
    gang.finished_at = now
    gang.resource_version += 1
    set_gang_condition(gang, False, reason, message, now)
    gang.save()
    ev.record([ev.event(gang, ev.FAILED if phase == GangPhase.FAILED else ev.RELEASED, reason, message)])
    transaction.on_commit(dispatch.request_placement)  # devices may be free for other gangs now


def release_gang(gang_id: int, *, if_match: str | None = None) -> Gang:
    """Free everything the gang holds; its claims are released. Releasing twice is a no-op."""
    with transaction.atomic():
        gang = Gang.objects.select_for_update(of=("self",)).select_related("namespace").get(pk=gang_id)
        check_precondition(gang, if_match)
        if gang.phase in (GangPhase.FAILED, GangPhase.RELEASED):
            return gang
        mcs, _ = member_claims(gang, lock=True)
        finish_locked(gang, mcs, GangPhase.RELEASED, "Released", "released by its owner", timezone.now())
    return gang


def delete_gang(gang_id: int, *, if_match: str | None = None) -> None:
    """Release everything, then delete the members' consumers (and the claims made for them) and the gang."""
    with transaction.atomic():
        gang = Gang.objects.select_for_update(of=("self",)).select_related("namespace").get(pk=gang_id)
        check_precondition(gang, if_match)
        mcs, _ = member_claims(gang, lock=True)
        if gang.phase not in (GangPhase.FAILED, GangPhase.RELEASED):
            finish_locked(gang, mcs, GangPhase.RELEASED, "Deleted", "deleted", timezone.now())
        for mc in mcs:
            if mc.member.consumer_id:
                consumer_services.delete_consumer(mc.member.consumer_id)
        ev.record([ev.event(gang, ev.DELETED, "Deleted", "gang deleted")])
        gang.delete()
