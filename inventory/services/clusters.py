"""Cluster registration and freshness."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from draservice.etag import check_if_match
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.models import Cluster
from inventory.signals import send_after_commit


@transaction.atomic
def create_cluster(*, name: str, labels: dict, with_token: bool = True) -> tuple[Cluster, str | None]:
    """Register a cluster; returns (cluster, secret of its new cluster token or None)."""
    cluster = Cluster.objects.create(name=name, labels=labels or {})
    secret = None
    if with_token:
        _, secret = issue_token(kind=APIToken.CLUSTER, cluster=cluster, name=f"cluster {name}")
    return cluster, secret


@transaction.atomic
def update_cluster(cluster: Cluster, *, labels: dict | None = None, if_match: list[str] | None = None) -> Cluster:
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    check_if_match(if_match, cluster.resource_version)
    if labels is not None:
        cluster.labels = labels
    cluster.resource_version = F("resource_version") + 1
    cluster.save(update_fields=["labels", "resource_version", "updated_at"])
    cluster.refresh_from_db(fields=["resource_version"])
    send_after_commit(cluster=cluster.name, cluster_id=cluster.pk, inventory_version=cluster.inventory_version,
                      reason="cluster")
    return cluster


def delete_cluster(cluster: Cluster, *, if_match: list[str] | None = None) -> None:
    """Deletes the cluster with its whole inventory and tokens (allocations are the claims app's business)."""
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        check_if_match(if_match, cluster.resource_version)
        name, pk = cluster.name, cluster.pk
        cluster.delete()
        send_after_commit(cluster=name, cluster_id=pk, inventory_version=None, reason="cluster-deleted")


@transaction.atomic
def record_heartbeat(cluster: Cluster, *, agent_version: str = "", status: dict | None = None) -> Cluster:
    """Agent liveness. A heartbeat that revives a stale cluster tells the allocator its devices are back."""
    now = timezone.now()
    was_stale = cluster.is_stale(now) or cluster.stale_since is not None
    fields: dict[str, object] = {"last_heartbeat_at": now, "stale_since": None}
    if agent_version:
        fields["agent_version"] = agent_version[:128]
    if status is not None:
        fields["agent_status"] = status
    Cluster.objects.filter(pk=cluster.pk).update(**fields)
    for key, value in fields.items():
        setattr(cluster, key, value)
    if was_stale:
        send_after_commit(cluster=cluster.name, cluster_id=cluster.pk, inventory_version=cluster.inventory_version,
                          reason="heartbeat-fresh")
    return cluster


def stale_cutoff(now=None):
    return (now or timezone.now()) - timedelta(seconds=settings.STALE_CLUSTER_SECONDS)


def fresh_clusters_q(now=None) -> Q:
    """Clusters heard from within the window (sync or heartbeat), as a filter usable in queries."""
    cutoff = stale_cutoff(now)
    return Q(last_sync_at__gte=cutoff) | Q(last_heartbeat_at__gte=cutoff)


def sweep_stale_clusters(now=None) -> list[str]:
    """Mark clusters that went silent past the window as stale (for the worker's periodic task).

    Staleness itself is computed live everywhere (``Cluster.is_stale``); this records *when* a cluster went
    stale and tells the allocator once, so that it stops offering those devices. Existing allocations are
    not touched. Returns the names of clusters newly marked stale.
    """
    now = now or timezone.now()
    with transaction.atomic():
        newly = list(Cluster.objects.select_for_update(skip_locked=True)
                     .filter(stale_since__isnull=True).exclude(fresh_clusters_q(now)).order_by("pk"))
        if newly:
            Cluster.objects.filter(pk__in=[c.pk for c in newly]).update(stale_since=now)
        for cluster in newly:
            send_after_commit(cluster=cluster.name, cluster_id=cluster.pk,
                              inventory_version=cluster.inventory_version, reason="stale")
    return [c.name for c in newly]
