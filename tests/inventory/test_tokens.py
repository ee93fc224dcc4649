"""Bearer tokens: issuing, authentication, expiry, scoping helpers and the create_token command."""
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from draservice.models import APIToken
from draservice.permissions import access_for, token_can_read_namespace, token_can_write_namespace
from draservice.tokens import issue_token, parse_duration
from inventory.models import Cluster

pytestmark = pytest.mark.django_db


def test_secret_is_stored_hashed_and_shown_once():
    token, secret = issue_token(kind=APIToken.ADMIN, name="ops")
    token.refresh_from_db()
    assert secret not in (token.secret_hash, token.prefix)
    assert token.secret_hash == APIToken.hash_secret(secret)
    assert secret.startswith(f"dra_{token.prefix}_")


def test_create_token_command_prints_a_working_secret():
    out = StringIO()
    call_command("create_token", "--admin", "--name", "ci", stdout=out, stderr=StringIO())
    secret = out.getvalue().strip()
    assert APIToken.objects.get(name="ci").kind == APIToken.ADMIN
    from draservice.auth import BearerTokenAuthentication

    assert BearerTokenAuthentication.authenticate_secret(secret).name == "ci"


def test_create_token_command_namespace_and_expiry():
    out = StringIO()
    call_command("create_token", "--namespace", "team-a", "--namespace", "team-b", "--read-only",
                 "--expires", "7d", stdout=out, stderr=StringIO())
    token = APIToken.objects.get(kind=APIToken.NAMESPACE)
    assert token.namespaces == ["team-a", "team-b"] and token.read_only
    assert timedelta(days=6, hours=23) < token.expires_at - timezone.now() <= timedelta(days=7)


def test_create_token_command_rejects_unknown_cluster_and_bad_input():
    with pytest.raises(CommandError, match="no cluster named"):
        call_command("create_token", "--cluster", "nope", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="invalid duration"):
        call_command("create_token", "--admin", "--expires", "soon", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match="namespace"):
        call_command("create_token", "--namespace", "Not_A_Label", stdout=StringIO(), stderr=StringIO())
    out = StringIO()
    call_command("create_token", "--cluster", "c1", "--create-cluster", stdout=out, stderr=StringIO())
    assert APIToken.objects.get(kind=APIToken.CLUSTER).cluster.name == "c1"


@pytest.mark.parametrize("text,expected", [("90s", timedelta(seconds=90)), ("12h", timedelta(hours=12)),
                                           ("2w", timedelta(weeks=2))])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


def test_unknown_expired_and_malformed_tokens_get_401_problem_json():
    client = APIClient()
    _, secret = issue_token(kind=APIToken.ADMIN, expires_in=timedelta(seconds=-1) + timedelta(seconds=0))
    for header in ("Bearer dra_nope_nope", f"Bearer {secret}", "Bearer", "Bearer a b"):
        resp = client.get("/api/v1/clusters", HTTP_AUTHORIZATION=header)
        assert resp.status_code == 401, header
        assert resp["Content-Type"] == "application/problem+json"
        assert resp.json()["status"] == 401
    expired = client.get("/api/v1/clusters", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert "expired" in expired.json()["detail"]


def test_no_credentials_get_401():
    resp = APIClient().get("/api/v1/clusters")
    assert resp.status_code == 401
    assert resp["Content-Type"] == "application/problem+json"


def test_valid_token_authenticates_and_records_last_use():
    token, secret = issue_token(kind=APIToken.ADMIN)
    resp = APIClient().get("/api/v1/clusters", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert resp.status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_namespace_helpers():
    cluster = Cluster.objects.create(name="c1")
    admin, _ = issue_token(kind=APIToken.ADMIN)
    ro_admin, _ = issue_token(kind=APIToken.ADMIN, read_only=True)
    tenant, _ = issue_token(kind=APIToken.NAMESPACE, namespaces=["team-a"])
    ro_tenant, _ = issue_token(kind=APIToken.NAMESPACE, namespaces=["team-a"], read_only=True)
    agent, _ = issue_token(kind=APIToken.CLUSTER, cluster=cluster)
    assert token_can_write_namespace(admin, "anything")
    assert token_can_read_namespace(ro_admin, "x") and not token_can_write_namespace(ro_admin, "x")
    assert token_can_read_namespace(tenant, "team-a") and not token_can_read_namespace(tenant, "team-b")
    assert token_can_write_namespace(tenant, "team-a") and not token_can_write_namespace(tenant, "team-b")
    assert token_can_read_namespace(ro_tenant, "team-a") and not token_can_write_namespace(ro_tenant, "team-a")
    assert token_can_read_namespace(agent, "team-a")
    assert not token_can_write_namespace(agent, "team-a")
    assert token_can_write_namespace(agent, "team-a", cluster="c1")
    assert not token_can_write_namespace(agent, "team-a", cluster="c2")
    assert not token_can_read_namespace(None, "team-a")


def test_session_users_staff_is_admin_others_read_only():
    class Req:
        auth = None

    staff, plain = Req(), Req()
    staff.user = User.objects.create_user("boss", password="x", is_staff=True)
    plain.user = User.objects.create_user("viewer", password="x")
    assert access_for(staff).can_write_fleet and token_can_write_namespace(staff, "ns")
    assert not access_for(plain).can_write_fleet and not token_can_write_namespace(plain, "ns")
    assert token_can_read_namespace(plain, "ns")
