"""The dashboard's page frame, what every dashboard view (frontend's and the apps' own pages) shares:
rendering with the layout's context, and who may change things. Here, below the apps, so that their pages use it
without importing the dashboard, which sits on top and imports them."""
from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from draservice.permissions import access_for

# Who may act, not just look. Staff, or anyone granted the model permission explicitly in the admin, so a
# team can hand out "may release claims" without making someone staff. Everybody else is read-only.
RELEASE_PERMISSION = "claims.change_resourceclaim"
TAINT_PERMISSION = "inventory.add_devicetaintrule"


def can_release(user) -> bool:
    return bool(user.is_authenticated and (user.is_staff or user.has_perm(RELEASE_PERMISSION)))


def can_taint(user) -> bool:
    return bool(user.is_authenticated and (user.is_staff or user.has_perm(TAINT_PERMISSION)))


def require(allowed: bool) -> None:
    """403 for a read-only user who crafted a POST the page never offered them."""
    if not allowed:
        raise PermissionDenied("read-only users can look but not change anything")


def page(request, template: str, section: str, context: dict | None = None, status: int = 200):
    ctx = {
        "section": section,
        "can_write": can_release(request.user) or can_taint(request.user),
        "can_release": can_release(request.user),
        "can_taint": can_taint(request.user),
        # Admins (staff) see what names tokens and people or every queue's figures: the audit trail, replays.
        "is_admin": access_for(request).is_admin,
    }
    ctx.update(context or {})
    return render(request, template, ctx, status=status)


def is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"
