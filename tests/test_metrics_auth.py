"""/metrics names every cluster with its allocation counts: an admin token by default, public only by choice
(``METRICS_PUBLIC=true``)."""
import os
import subprocess
import sys

import pytest
from django.test import Client

from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.services.clusters import create_cluster
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def scrape(client):
    return client.get("/metrics", HTTP_ACCEPT="text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def assert_refused(resp, status):
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    body = resp.json()
    assert body["status"] == status and body["errors"] and body["errors"][0]["field"] == "Authorization"
    assert b"draservice_" not in resp.content


def test_without_credentials_it_is_a_401_that_says_how(settings):
    assert settings.METRICS_PUBLIC is False  # the default
    resp = scrape(Client())
    assert_refused(resp, 401)
    assert resp["WWW-Authenticate"].startswith("Bearer")
    assert "METRICS_PUBLIC" in resp.json()["detail"]


@pytest.mark.parametrize("header", ["Bearer dra_nope_nope", "Bearer", "Basic dXNlcjpwYXNz", "Bearer a b"])
def test_a_bad_or_foreign_authorization_is_a_401(header):
    assert_refused(Client().get("/metrics", HTTP_AUTHORIZATION=header), 401)


def test_namespace_and_cluster_tokens_are_refused(ns_client):
    assert_refused(scrape(ns_client("team-a")), 403)
    _, secret = create_cluster(name="c1", labels={})
    assert_refused(scrape(client_for(secret)), 403)


def test_admin_tokens_and_staff_sessions_scrape(admin_client, django_user_model):
    resp = scrape(admin_client)
    assert resp.status_code == 200 and b"draservice_http_requests_total" in resp.content
    assert resp["Content-Type"].startswith("text/plain")
    _, read_only = issue_token(kind=APIToken.ADMIN, name="prometheus", read_only=True)
    assert scrape(client_for(read_only)).status_code == 200
    staff, viewer = Client(), Client()
    staff.force_login(django_user_model.objects.create_user("ops", password="x", is_staff=True))
    viewer.force_login(django_user_model.objects.create_user("viewer", password="x"))
    assert scrape(staff).status_code == 200
    assert_refused(scrape(viewer), 403)


def test_metrics_public_opens_it(settings):
    settings.METRICS_PUBLIC = True
    resp = scrape(Client())
    assert resp.status_code == 200 and b"draservice_http_requests_total" in resp.content


@pytest.mark.parametrize("value, public", [(None, False), ("", False), ("false", False), ("true", True), ("1", True)])
def test_the_setting_comes_from_the_environment(value, public):
    env = {k: v for k, v in os.environ.items() if k != "METRICS_PUBLIC"}
    if value is not None:
        env["METRICS_PUBLIC"] = value
    out = subprocess.run([sys.executable, "-c", "import draservice.settings as s; print(s.METRICS_PUBLIC)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(public)
