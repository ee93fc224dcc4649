"""Who may do what, for tokens and for session users alike: the caller's access and the API's DRF permission
classes, each rule stated once.

The caller's access (``access_for(request)``), and what it may do with the fleet:

- admin token: reads and writes everything (a read-only admin token only reads);
- cluster token: writes its own cluster's inventory only; reads the fleet's inventory;
- namespace token: reads the inventory;
- session user: staff is an admin, anyone else reads only.

Namespaced objects (``NamespaceAccess``, ``ClaimAccess``):

* admin token or staff user: everything (a read-only admin only reads);
* namespace token: reads and writes (unless read-only) its own namespaces only. A request for another
  namespace is refused (403) before anything is looked up, so the answer never reveals whether an object
  exists there;
* cluster token (the cluster's sync agent): reads every namespace; writes claims only (``ClaimAccess``):
  creates, edits (PUT, PATCH) and renews claims pinned to its own cluster by name
  (``draservice.io/allowed-clusters: name=<its cluster>``, how it mirrors the cluster's claims), and releases
  or deletes a claim pinned to its cluster OR allocated on it (its pods went away);
* anyone else (anonymous): nothing.

Other modules use ``access_for(request)`` or the ``token_can_*`` helpers, which accept an ``APIToken``, an
``Access`` or a DRF request.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace

from rest_framework.permissions import SAFE_METHODS, BasePermission

from draservice.models import APIToken


@dataclass(frozen=True)
class Access:
    kind: str  # "admin" | "cluster" | "namespace" | "user"
    read_only: bool = True
    cluster_id: int | None = None
    cluster_name: str | None = None
    namespaces: frozenset[str] = field(default_factory=frozenset)
    token: APIToken | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == APIToken.ADMIN

    @property
    def can_write_fleet(self) -> bool:
        """Manage clusters, fleet-wide DeviceClasses and DeviceTaintRules."""
        return self.is_admin and not self.read_only

    def can_write_cluster(self, cluster_name: str) -> bool:
        """Push inventory (slices, nodes, the cluster's own classes and rules) into ``cluster_name``."""
        if self.read_only:
            return False
        if self.is_admin:
            return True
        return self.kind == APIToken.CLUSTER and self.cluster_name == cluster_name

    def can_read_namespace(self, namespace: str) -> bool:
        if self.kind == APIToken.NAMESPACE:
            return namespace in self.namespaces
        return True

    def can_write_namespace(self, namespace: str, cluster: str | None = None) -> bool:
        if self.read_only:
            return False
        if self.is_admin:
            return True
        if self.kind == APIToken.NAMESPACE:
            return namespace in self.namespaces
        if self.kind == APIToken.CLUSTER:
            return cluster is not None and cluster == self.cluster_name
        return False


NO_ACCESS = Access(kind="none", read_only=True)


def access_of_token(token: APIToken) -> Access:
    return Access(
        kind=token.kind, read_only=token.read_only, cluster_id=token.cluster_id,
        cluster_name=token.cluster.name if token.cluster is not None else None,
        namespaces=frozenset(token.namespaces or ()), token=token,
    )


def access_for(request) -> Access:
    """The caller's access, cached on the request."""
    cached = getattr(request, "_dra_access", None)
    if cached is not None:
        return cached
    token = getattr(request, "auth", None)
    if isinstance(token, APIToken):
        access = access_of_token(token)
    else:
        user = getattr(request, "user", None)
        if user is not None and getattr(user, "is_authenticated", False) and getattr(user, "is_active", True):
            access = Access(kind=APIToken.ADMIN, read_only=False) if user.is_staff else Access(kind="user")
        else:
            access = NO_ACCESS
    with contextlib.suppress(AttributeError):
        request._dra_access = access
    return access


def _access(subject) -> Access:
    if isinstance(subject, Access):
        return subject
    if isinstance(subject, APIToken):
        return access_of_token(subject)
    if subject is None:
        return NO_ACCESS
    return access_for(subject)  # a request


def token_can_read_namespace(token, namespace: str) -> bool:
    """``token``: an APIToken, an Access or a request (session users included)."""
    access = _access(token)
    return access is not NO_ACCESS and access.can_read_namespace(namespace)


def token_can_write_namespace(token, namespace: str, cluster: str | None = None) -> bool:
    """``cluster``: the cluster the write targets; lets a cluster token write claims of its own cluster."""
    return _access(token).can_write_namespace(namespace, cluster)


class IsAuthenticatedPrincipal(BasePermission):
    """A valid token or a logged-in user (DRF's IsAuthenticated, but robust to UNAUTHENTICATED_USER=None)."""

    def has_permission(self, request, view):
        return access_for(request) is not NO_ACCESS


class IsAdminToken(BasePermission):
    """Only a writing admin (admin token or staff user)."""

    message = "This needs an admin token."

    def has_permission(self, request, view):
        return access_for(request).can_write_fleet


class IsAdminOrReadOnly(BasePermission):
    """Everyone authenticated reads; only admins write."""

    message = "Only an admin token may change this."

    def has_permission(self, request, view):
        access = access_for(request)
        if access is NO_ACCESS:
            return False
        return request.method in SAFE_METHODS or access.can_write_fleet


class CanWriteClusterInventory(BasePermission):
    """Sync endpoints: the URL's cluster must be the token's own cluster (or the caller an admin)."""

    message = "This token may not write this cluster's inventory."
    url_kwarg = "cluster"

    def has_permission(self, request, view):
        access = access_for(request)
        if access is NO_ACCESS:
            return False
        if request.method in SAFE_METHODS:
            return True
        return access.can_write_cluster(view.kwargs.get(self.url_kwarg, ""))


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
