"""Placement hints and leases, carried as annotations so that a claim stays a plain Kubernetes object.

``draservice.io/allowed-clusters``   equality label selector over cluster labels, ``region=eu,provider=gke``
                                     (all must match); ``name=<cluster>`` matches a cluster by name.
``draservice.io/preferred-cluster``  a cluster name tried first when it can hold the claim.
``draservice.io/lease-ttl``          ``90s``, ``15m``, ``2h``: the walltime. The claim is released when the lease
                                     is not renewed (``POST …/renew``) within this time, counted from its
                                     allocation (Slurm's ``--time``): waiting in a queue costs none of it.
``draservice.io/pending-timeout``    ``30m``, ``1d``: how long the claim may wait for its first allocation; past
                                     it the claim is released (reason ``PendingTimeout``). Counted from
                                     creation; a claim requeued by preemption was admitted once and waits on.
``draservice.io/node``               a node name: the claim is placed on that node only (the engine's node
                                     restriction, like a pod's ``nodeName``). Needs ``allowed-clusters:
                                     name=<cluster>``, since node names are unique only within a cluster.
                                     Defragmentation plans pin moved claims and the plan's target with it.

Annotations were chosen over a top-level field because ``kubectl``-shaped manifests round-trip them
untouched, and an unknown top-level field would be rejected by strict Kubernetes clients.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from dra.engine import ClaimGroup
from dra.k8s.fields import V1
from draservice.errors import Invalid

ALLOWED_CLUSTERS = "draservice.io/allowed-clusters"
PREFERRED_CLUSTER = "draservice.io/preferred-cluster"
LEASE_TTL = "draservice.io/lease-ttl"
PENDING_TIMEOUT = "draservice.io/pending-timeout"
NODE_PIN = "draservice.io/node"

MIN_LEASE = timedelta(seconds=5)
MAX_LEASE = timedelta(days=7)
MAX_PENDING_TIMEOUT = timedelta(days=30)
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS subdomain, as node names are
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str, path: str) -> timedelta:
    match = _DURATION.match(str(text).strip())
    if not match:
        raise Invalid([(path, f"invalid duration {text!r}: use a number followed by s, m, h or d (e.g. 15m)")])
    try:
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    except OverflowError:  # past timedelta's ~2.7 million years (was a 500): out of any range we accept
        raise Invalid([(path, f"Invalid value: {text!r}: must be between {int(MIN_LEASE.total_seconds())}s "
                                 "and 7d")]) from None


@dataclass
class Placement:
    allowed_cluster_selector: dict | None
    preferred_cluster: str
    lease: timedelta | None
    node: str = ""
    pending_timeout: timedelta | None = None


def parse_selector(text: str, path: str) -> dict:
    selector: dict[str, str] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip().lstrip("=")  # accept k==v like kubectl
        if not sep or not key:
            raise Invalid([(path, f"{part!r}: expected label=value (equality selectors only)")])
        if key in selector and selector[key] != value:
            raise Invalid([(path, f"label {key!r} given twice with different values")])
        selector[key] = value
    if not selector:
        raise Invalid([(path, "must not be empty")])
    return selector


def parse_annotations(annotations: dict, path: str = "metadata.annotations") -> Placement:
    selector = None
    if annotations.get(ALLOWED_CLUSTERS):
        selector = parse_selector(annotations[ALLOWED_CLUSTERS], f"{path}[{ALLOWED_CLUSTERS}]")
    lease = None
    if annotations.get(LEASE_TTL):
        lpath = f"{path}[{LEASE_TTL}]"
        lease = parse_duration(annotations[LEASE_TTL], lpath)
        if not MIN_LEASE <= lease <= MAX_LEASE:
            raise Invalid([(lpath, f"must be between {int(MIN_LEASE.total_seconds())}s and 7d")])
    return Placement(selector, str(annotations.get(PREFERRED_CLUSTER) or ""), lease,
                     _node_pin(annotations, selector, path), _pending_timeout(annotations, path))


def _pending_timeout(annotations: dict, path: str) -> timedelta | None:
    if not annotations.get(PENDING_TIMEOUT):
        return None
    tpath = f"{path}[{PENDING_TIMEOUT}]"
    timeout = parse_duration(annotations[PENDING_TIMEOUT], tpath)
    if not MIN_LEASE <= timeout <= MAX_PENDING_TIMEOUT:
        raise Invalid([(tpath, f"must be between {int(MIN_LEASE.total_seconds())}s and 30d")])
    return timeout


def _node_pin(annotations: dict, selector: dict | None, path: str) -> str:
    node = annotations.get(NODE_PIN)
    if not node:
        return ""
    npath = f"{path}[{NODE_PIN}]"
    if not isinstance(node, str) or not _NODE_NAME.match(node):
        raise Invalid([(npath, f"Invalid value: {node!r}: must be a node name (a lowercase DNS subdomain)")])
    if not selector or set(selector) != {"name"}:
        raise Invalid([(npath, f"needs {ALLOWED_CLUSTERS}: name=<cluster> (node names are unique only "
                                  "within a cluster)")])
    return node


def node_pin(annotations: dict | None) -> str | None:
    """The node a stored claim is pinned to (its annotations were validated when written), or None."""
    return (annotations or {}).get(NODE_PIN) or None


def clusters_matching(selector: dict | None, clusters: list[tuple[str, dict]]) -> list[str] | None:
    """Names of the clusters whose labels match; None means "no restriction"."""
    if not selector:
        return None
    out = []
    for name, labels in clusters:
        if all((name == v) if k == "name" else (labels.get(k) == v) for k, v in selector.items()):
            out.append(name)
    return out


def body_pin(obj) -> str | None:
    """The cluster a claim body pins itself to by name, for cluster tokens (the agent); None when unpinned or
    unreadable (the body's own validation reports that)."""
    try:
        annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        if not annotations.get(ALLOWED_CLUSTERS):
            return None
        selector = parse_selector(annotations[ALLOWED_CLUSTERS], "")
    except (Invalid, AttributeError, TypeError):
        return None
    return selector["name"] if selector and set(selector) == {"name"} else None


def claim_object(claim) -> dict:
    """A stored claim as the engine reads it (a ``resource.k8s.io/v1`` object)."""
    return {"apiVersion": V1, "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace.name, "uid": str(claim.uid)},
            "spec": claim.spec}


def claim_group(claims: list, cluster_labels: list[tuple[str, dict]], *, key: str, pin_cluster: str | None = None,
                pin_node: str | None = None, avoid: frozenset[tuple[str, str]] = frozenset()) -> ClaimGroup:
    """The engine's question for ``claims`` allocated together: the clusters their selectors allow (and
    ``pin_cluster``), the preferred cluster, and the node they are pinned to (``pin_node``: where allocated
    members are; else a claim's own node pin)."""
    allowed: set[str] | None = None
    for claim in claims:
        names = clusters_matching(claim.allowed_cluster_selector, cluster_labels)
        if names is not None:
            allowed = set(names) if allowed is None else allowed & set(names)
    if pin_cluster:
        allowed = {pin_cluster} if allowed is None else allowed & {pin_cluster}
    preferred = next((c.preferred_cluster for c in claims if c.preferred_cluster), None)
    node = pin_node or next((pin for c in claims if (pin := node_pin(c.annotations))), None)
    return ClaimGroup(claims=[claim_object(c) for c in claims],
                      allowed_clusters=sorted(allowed) if allowed is not None else None,
                      preferred_cluster=preferred, node=node, key=key, avoid_nodes=avoid)
