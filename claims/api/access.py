"""Who may read and write which namespace's claims (rules in ``inventory.permissions``).

* admin token or staff user: everything (a read-only admin only reads);
* namespace token: only its namespaces; read-only tokens cannot write. Another namespace answers 403
  before anything is looked up, so the answer never reveals whether an object exists there;
* cluster token (the sync agent): reads claims everywhere, and writes only claims pinned to its own
  cluster (``draservice.io/allowed-clusters: name=<its cluster>``), which is how it mirrors cluster claims.
"""
from __future__ import annotations

from rest_framework.exceptions import PermissionDenied

from inventory.permissions import (
    IsAuthenticatedPrincipal,
    access_for,
    token_can_read_namespace,
    token_can_write_namespace,
)

__all__ = ["IsAuthenticatedPrincipal", "check_read", "check_write", "pinned_cluster", "readable_namespaces"]


def pinned_cluster(selector: dict | None) -> str | None:
    """The one cluster a claim is restricted to by name, if that is all its selector says."""
    if selector and set(selector) == {"name"}:
        return selector["name"]
    return None


def check_read(request, namespace: str) -> None:
    if not token_can_read_namespace(request, namespace):
        raise PermissionDenied(f'this token may not read namespace "{namespace}"')


def check_write(request, namespace: str, cluster: str | None = None) -> None:
    if not token_can_write_namespace(request, namespace, cluster):
        access = access_for(request)
        why = "is read-only" if access.read_only and token_can_read_namespace(request, namespace) else \
            f'may not write namespace "{namespace}"'
        raise PermissionDenied(f"this token {why}")


def readable_namespaces(request) -> frozenset[str] | None:
    """None: every namespace; otherwise the names this caller may read."""
    access = access_for(request)
    if access.kind == "namespace":
        return access.namespaces
    return None
