"""Who may do what with a namespace's objects: the API's DRF permission classes, each rule stated once.

The caller's access (``inventory.permissions.access_for``: admin, cluster or namespace token, or a session
user) is the inventory's; the rules for namespaced objects are here:

* admin token or staff user: everything (a read-only admin only reads);
* namespace token: reads and writes (unless read-only) its own namespaces only. A request for another
  namespace is refused (403) before anything is looked up, so the answer never reveals whether an object
  exists there;
* cluster token (the cluster's sync agent): reads every namespace; writes claims only (``ClaimAccess``):
  creates, edits (PUT, PATCH) and renews claims pinned to its own cluster by name
  (``draservice.io/allowed-clusters: name=<its cluster>``, how it mirrors the cluster's claims), and releases
  or deletes a claim pinned to its cluster OR allocated on it (its pods went away);
* anyone else (anonymous): nothing.
"""
from __future__ import annotations

from types import SimpleNamespace

from rest_framework.permissions import SAFE_METHODS, BasePermission

from inventory.models import APIToken
from inventory.permissions import (
    NO_ACCESS,
    CanWriteClusterInventory,
    IsAdminOrReadOnly,
    IsAdminToken,
    IsAuthenticatedPrincipal,
    access_for,
)

__all__ = ["CanWriteClusterInventory", "ClaimAccess", "IsAdminOrReadOnly", "IsAdminToken",
           "IsAuthenticatedPrincipal", "NamespaceAccess", "pinned_cluster", "readable_namespaces"]


def pinned_cluster(selector: dict | None) -> str | None:
    """The one cluster a claim is restricted to by name, if that is all its selector says."""
    if selector and set(selector) == {"name"}:
        return selector["name"]
    return None


def readable_namespaces(request) -> frozenset[str] | None:
    """None: every namespace; otherwise the names this caller may read (for lists across namespaces)."""
    access = access_for(request)
    return access.namespaces if access.kind == APIToken.NAMESPACE else None


class NamespaceAccess(BasePermission):
    """Objects under ``/namespaces/{namespace}/``: decided from the URL, before any lookup."""

    cluster_tokens_write = False  # ClaimAccess lets them through to the per-claim rule

    def has_permission(self, request, view) -> bool:
        access = access_for(request)
        if access is NO_ACCESS:
            return False
        namespace = view.kwargs.get("namespace")
        if namespace is None:
            return True  # lists across namespaces filter by readable_namespaces
        readable = access.can_read_namespace(namespace)
        if request.method in SAFE_METHODS:
            self.message = f'this token may not read namespace "{namespace}"'
            return readable
        if access.read_only:
            self.message = ("this token is read-only" if readable
                            else f'this token may not write namespace "{namespace}"')
            return False
        if access.kind == APIToken.CLUSTER:
            self.message = f'this token may not write namespace "{namespace}"'
            return self.cluster_tokens_write
        self.message = f'this token may not write namespace "{namespace}"'
        return access.can_write_namespace(namespace)


class ClaimAccess(NamespaceAccess):
    """ResourceClaims: ``NamespaceAccess`` plus the cluster token's per-claim rule (module docstring).

    Views name what a write does with ``claim_verb`` ("create", "edit", "renew", "release", "delete"; by default
    from the method) and call ``check_object_permissions`` with the claim, or for a create with
    ``ClaimAccess.new_claim(pin)`` (the cluster the body pins the claim to, if any)."""

    cluster_tokens_write = True
    VERBS = {"POST": "create", "PUT": "edit", "PATCH": "edit", "DELETE": "delete"}

    @staticmethod
    def new_claim(pin: str | None) -> SimpleNamespace:
        return SimpleNamespace(allowed_cluster_selector={"name": pin} if pin else None, cluster="")

    def has_object_permission(self, request, view, claim) -> bool:
        if request.method in SAFE_METHODS:
            return True
        access = access_for(request)
        if access.kind != APIToken.CLUSTER:
            return True  # decided by has_permission
        verb = getattr(view, "claim_verb", None) or self.VERBS.get(request.method, "edit")
        pinned = pinned_cluster(claim.allowed_cluster_selector)
        if verb in ("release", "delete"):
            allowed = access.cluster_name in (pinned, claim.cluster or None)
            self.message = (f"this cluster token may {verb} only claims pinned to or allocated on cluster "
                            f'"{access.cluster_name}"')
        else:
            allowed = pinned is not None and pinned == access.cluster_name
            self.message = f'this cluster token may {verb} only claims pinned to cluster "{access.cluster_name}"'
        return allowed
