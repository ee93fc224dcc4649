"""Consumers: what uses claims (a pod, a CI job), with ``spec.resourceClaims`` shaped as in a Pod.

Each entry names either an existing claim (``resourceClaimName``, which may be shared by up to 256
consumers: that is how GPU sharing works) or a template (``resourceClaimTemplateName``: one new claim is
made for this consumer, named ``<consumer>-<entry>-<random>`` as upstream does, and deleted with it).
The consumer is added to each claim's ``status.reservedFor``. The allocator then places all pending claims
of the consumer together, on one node, or none of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from claims import dispatch, k8s
from claims.models import Consumer, Namespace, Phase, Reservation, ResourceClaim, ResourceClaimTemplate
from claims.services import caps, history, queueing
from claims.services import events as ev
from claims.services.claims import _release_locked, build_claim, get_namespace_for_write
from draservice.errors import AlreadyExists, Conflict, Invalid
from draservice.etag import check_precondition

MAX_RESERVED_FOR = 256  # upstream ResourceClaimReservedForMaxSize
MAX_ENTRIES = 32
KIND = "Consumer"
API_VERSION = "draservice.io/v1alpha1"


@dataclass(frozen=True)
class Generated:
    """What a workload adds to the claims made for one of its consumers (``workloads``: a pod's).

    ``prefix`` names them ``<prefix>-<entry>-<random>`` (default: the consumer's name; a gang member's consumer
    is ``<gang>-<member>``, its pod's claims are still named after the pod, as upstream names them);
    ``labels`` are added to each (the pod's queue label, so the claims go where the pod says); ``inline``
    are (entry, v1 claim spec) made from a spec rather than a template (a container's extended resources).
    """

    prefix: str | None = None
    labels: dict = field(default_factory=dict)
    inline: tuple[tuple[str, dict], ...] = ()


def _parse_entries(spec, path: str, allow_empty: bool = False) -> list[dict]:
    if not isinstance(spec, dict):
        raise Invalid([(path, "must be an object")])
    entries = spec.get("resourceClaims")
    if allow_empty and not entries:
        return []
    if not isinstance(entries, list) or not entries:
        raise Invalid([(f"{path}.resourceClaims", "must be a non-empty list")])
    if len(entries) > MAX_ENTRIES:
        raise Invalid([(f"{path}.resourceClaims", f"must have at most {MAX_ENTRIES} items")])
    errors, out = [], []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        epath = f"{path}.resourceClaims[{i}]"
        if not isinstance(entry, dict):
            errors.append((epath, "must be an object"))
            continue
        name = entry.get("name")
        errors += k8s.check_listed_name(name, f"{epath}.name", names)
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if bool(claim) == bool(template):
            errors.append((epath, "must specify exactly one of resourceClaimName or resourceClaimTemplateName"))
            continue
        field = "resourceClaimName" if claim else "resourceClaimTemplateName"
        errors += k8s.check_dns_subdomain(claim or template, f"{epath}.{field}")
        out.append({"name": name, **({"resourceClaimName": claim} if claim else
                                     {"resourceClaimTemplateName": template})})
    if errors:
        raise Invalid(errors)
    return out


def create_consumer(ns_name: str, obj: dict, path: str = "", generated: Generated | None = None) -> Consumer:
    """One transaction: the consumer, its claims from templates, and its reservations."""
    generated = generated or Generated()
    prefix = f"{path}." if path else ""
    if not isinstance(obj, dict):
        raise Invalid([(path, "must be a Consumer object")])
    if obj.get("kind") not in (None, "", KIND) or obj.get("apiVersion") not in (None, "", API_VERSION):
        raise Invalid([(f"{prefix}kind", f"must be {KIND} ({API_VERSION})")])
    with transaction.atomic():
        ns = get_namespace_for_write(ns_name)
        meta = k8s.parse_metadata(obj, f"{prefix}metadata", namespace=ns.name)
        entries = _parse_entries(obj.get("spec"), f"{prefix}spec", allow_empty=bool(generated.inline))
        if Consumer.objects.filter(namespace=ns, name=meta["name"]).exists():
            raise AlreadyExists([(f"{prefix}metadata.name", f'consumers "{meta["name"]}" already exists')])
        try:
            with transaction.atomic():
                consumer = Consumer.objects.create(namespace=ns, name=meta["name"], labels=meta["labels"],
                                                   annotations=meta["annotations"], spec={"resourceClaims": entries})
        except IntegrityError as exc:
            raise Conflict(f'consumers "{meta["name"]}" was created concurrently') from exc
        claims = _claims_for(ns, consumer, entries, f"{prefix}spec", generated)
        Reservation.objects.bulk_create([Reservation(claim=c, consumer=consumer, entry=e) for e, c in claims])
        ev.record([ev.event(c, ev.RESERVED, "Reserved", f"reserved for consumer {consumer.name}",
                            {"consumer": consumer.name, "uid": str(consumer.uid)}) for _, c in claims])
        transaction.on_commit(dispatch.request_allocation)
    return consumer


def _claims_for(ns: Namespace, consumer: Consumer, entries: list[dict], path: str,
                generated: Generated) -> list[tuple[str, ResourceClaim]]:
    named = {e["resourceClaimName"]: i for i, e in enumerate(entries) if "resourceClaimName" in e}
    errors = []
    # Lock the shared claims in id order (every writer does), then count their reservations under the lock:
    # the 256 limit cannot be overrun by concurrent consumers.
    existing = {c.name: c for c in ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                .filter(namespace=ns, name__in=list(named)).order_by("id")}
    counts = dict(Reservation.objects.filter(claim__in=list(existing.values())).values("claim_id")
                  .annotate(n=Count("id")).values_list("claim_id", "n"))
    out: list[tuple[str, ResourceClaim]] = []
    for name, i in named.items():
        field = f"{path}.resourceClaims[{i}].resourceClaimName"
        claim = existing.get(name)
        if claim is None:
            errors.append((field, f'resourceclaims "{name}" not found'))
        elif claim.phase in (Phase.RELEASED, Phase.FAILED):
            errors.append((field, f'resourceclaims "{name}" is {claim.phase} and cannot be used'))
        elif counts.get(claim.id, 0) >= MAX_RESERVED_FOR:
            errors.append((field, f"reservedFor of this claim already has {MAX_RESERVED_FOR} consumers (the maximum)"))
        else:
            out.append((entries[i]["name"], claim))
    templates_wanted = {e["resourceClaimTemplateName"] for e in entries if "resourceClaimTemplateName" in e}
    templates = {t.name: t for t in ResourceClaimTemplate.objects.filter(namespace=ns, name__in=templates_wanted)}
    made = []
    now = timezone.now()
    for i, entry in enumerate(entries):
        tname = entry.get("resourceClaimTemplateName")
        if not tname:
            continue
        template = templates.get(tname)
        if template is None:
            errors.append((f"{path}.resourceClaims[{i}].resourceClaimTemplateName",
                           f'resourceclaimtemplates "{tname}" not found'))
            continue
        meta = template.spec.get("metadata") or {}
        claim = _generated_claim(ns, consumer, entry["name"], meta, template.spec["spec"], generated, now)
        claim.template = template
        made.append((entry["name"], claim))
    taken = {e["name"] for e in entries}
    for entry_name, spec in generated.inline:
        if entry_name in taken:
            errors.append((f"{path}.resourceClaims", f'Duplicate value: "{entry_name}" (a generated claim\'s name)'))
            continue
        made.append((entry_name, _generated_claim(ns, consumer, entry_name, {}, spec, generated, now)))
    # A consumer's claims are admitted together: one queue for all of them.
    errors += queueing.check_new_claims(ns.name, [(path, c) for _, c in out + made], unit=True)
    if errors:
        raise Invalid(errors)
    if made:
        caps.check_pending_claims(ns.name, len(made))
        ResourceClaim.objects.bulk_create([c for _, c in made])
        history.record([c for _, c in made])
        ev.record([ev.event(c, ev.CREATED, "Created", (f"made from template {c.template.name}" if c.template else
                                                       "made from its consumer's spec") + f" for consumer "
                                                      f"{consumer.name}") for _, c in made])
    return out + made


def _generated_claim(ns: Namespace, consumer: Consumer, entry: str, meta: dict, spec: dict, generated: Generated,
                     now) -> ResourceClaim:
    base = f"{generated.prefix or consumer.name}-{entry}"[:253 - 6]
    labels = {**(meta.get("labels") or {}), **generated.labels}
    claim = build_claim(ns, {"apiVersion": k8s.V1, "kind": "ResourceClaim",
                             "metadata": {"name": f"{base}-{k8s.random_suffix()}", "labels": labels or None,
                                          "annotations": meta.get("annotations")},
                             "spec": spec}, now=now)
    claim.owner = consumer
    return claim


def delete_consumer(consumer_id: int, *, if_match: str | None = None) -> None:
    """Unreserve the consumer's claims; release and delete the claims made for it from templates."""
    with transaction.atomic():
        consumer = Consumer.objects.select_for_update().get(pk=consumer_id)
        check_precondition(consumer, if_match)
        now = timezone.now()
        owned = list(ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                     .filter(owner=consumer).order_by("id"))
        _release_locked(owned, "ConsumerDeleted", f"consumer {consumer.name} was deleted", now)
        shared = (ResourceClaim.objects.select_related("namespace")
                  .filter(reservations__consumer=consumer).exclude(owner=consumer))
        ev.record([ev.event(c, ev.UNRESERVED, "Unreserved", f"consumer {consumer.name} was deleted")
                   for c in shared]
                  + [ev.event(c, ev.DELETED, "Deleted", f"consumer {consumer.name} was deleted") for c in owned])
        for claim in owned:
            claim.delete()
        consumer.delete()
