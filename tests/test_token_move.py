"""API tokens moved from the inventory app to the platform (draservice.APIToken) keeping their table: a token
issued before the move authenticates after it, through the API."""
import hashlib

import pytest
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from draservice.models import APIToken
from tests.conftest import client_for

BEFORE = [("draservice", "0005_audit_events"), ("inventory", "0006_pool_event_key")]
AFTER = [("draservice", "0006_apitoken"), ("inventory", "0007_apitoken_moved_to_draservice")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def to_leaves():
    executor = MigrationExecutor(connection)
    migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_tokens_issued_before_the_move_authenticate_after_it():
    content_type = ContentType.objects.get_for_model(APIToken)
    try:
        old = migrate(BEFORE)
        assert old.get_model("inventory", "APIToken")._meta.db_table == "inventory_apitoken"
        with pytest.raises(LookupError):
            old.get_model("draservice", "APIToken")
        # The content type went back with the model: admin permissions follow it both ways.
        assert ContentType.objects.get(pk=content_type.pk).app_label == "inventory"
        cluster = old.get_model("inventory", "Cluster").objects.create(name="east")
        secrets = {"admin": "dra_0123456789ab_before-the-move-admin",
                   "cluster": "dra_ba9876543210_before-the-move-cluster"}
        rows = {kind: old.get_model("inventory", "APIToken").objects.create(
            name=f"old {kind}", prefix=secret.split("_")[1], kind=kind,
            secret_hash=hashlib.sha256(secret.encode()).hexdigest(),
            cluster=cluster if kind == "cluster" else None) for kind, secret in secrets.items()}
        migrate(AFTER)
    finally:
        to_leaves()

    assert ContentType.objects.get(pk=content_type.pk).app_label == "draservice"
    assert sorted(APIToken.objects.values_list("pk", "name", "kind", "cluster__name")) == [
        (rows["admin"].pk, "old admin", "admin", None), (rows["cluster"].pk, "old cluster", "cluster", "east")]
    answer = client_for(secrets["admin"]).get("/api/v1/clusters/")
    assert answer.status_code == 200, answer.content
    assert [c["name"] for c in answer.json()["results"]] == ["east"]
    assert client_for(secrets["cluster"]).get("/api/v1/clusters/").status_code == 200
    # The cluster token still writes only its own cluster, and a wrong secret is still refused.
    refused = client_for(secrets["cluster"]).post("/api/v1/clusters/", {"name": "west"}, format="json")
    assert refused.status_code == 403, refused.content
    assert client_for(secrets["admin"] + "x").get("/api/v1/clusters/").status_code == 401
    assert APIToken.objects.get(pk=rows["admin"].pk).last_used_at is not None
    # The admin lists the old rows at the platform's page (the model's new home).
    staff = Client()
    staff.force_login(User.objects.create_user("ops", is_staff=True, is_superuser=True))
    page = staff.get("/admin/draservice/apitoken/")
    assert page.status_code == 200 and b"old admin" in page.content and b"old cluster" in page.content
