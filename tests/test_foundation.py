import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_livez_needs_nothing():
    resp = Client().get("/livez")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}


def test_readyz_checks_database():
    resp = Client().get("/readyz")
    assert resp.status_code == 200
    assert resp.json()["checks"]["database"] == "ok"


def test_metrics_exposes_prometheus_text(admin_client):
    Client().get("/livez")
    resp = admin_client.get("/metrics")  # token-protected by default: tests/test_metrics_auth.py
    assert resp.status_code == 200
    assert b"draservice_http_requests_total" in resp.content


def test_openapi_schema_generates():
    resp = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    assert resp.json()["openapi"].startswith("3.")


def test_unauthenticated_api_gets_problem_json():
    resp = Client().get("/api/schema/")  # schema is public
    assert resp.status_code == 200
