"""Webhook safety (issue 28, Why item 5): targets matched exactly and checked again at delivery, no redirects,
non-public addresses refused, Standard Webhooks signatures with server-made secrets, a total deadline per
attempt, retries to the captured URL, and the deliveries list. Real receivers on local sockets."""
from __future__ import annotations

import base64
import importlib
import socket
import ssl
import subprocess
import time

import pytest
from django.apps import apps
from standardwebhooks.webhooks import Webhook

from draservice import deliveries, webhooks
from draservice.models import DeliveryStatus, WebhookDelivery, WebhookEvent
from queues.models import Queue
from tests.queues.conftest import queue_body
from tests.queues.receivers import Receiver

Q = "/api/v1/queues"
ALLOWED = "http://127.0.0.1:18250"
FORGED = [
    "http://127.0.0.1:18250@169.254.169.254/",  # userinfo: the host is 169.254.169.254
    "http://127.0.0.1:182500/",  # no such port (a prefix of the allowed one)
    "http://127.0.0.1:18250.attacker.example/",  # the allowed entry as a prefix of another host
    "http://127.0.0.1:1825/",  # a different port whose text the allowed entry starts with
    "https://127.0.0.1:18250/",  # another scheme
    "http://127.0.0.2:18250/",
    "http://[::1",  # not a URL at all: a 422, not a 500
    "http://\u00fc.example:18250/",  # not ASCII
]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def hooked_queue(client, url: str, secret: str | None = None, name: str = "team-a") -> dict:
    hook = {"url": url, **({"secret": secret} if secret else {})}
    namespaces = ["a"] if name == "team-a" else []
    resp = client.post(Q, queue_body(name, namespaces=namespaces, gpus=1, preemption={"webhook": hook}),
                       format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def new_delivery(url: str, secret: str | None = None, namespace: str = "a", owner: str = "queue/team-a"):
    return deliveries.create("preemption.pending", owner, url, secret or webhooks.generate_secret(),
                             {"kind": "PreemptionNotice", "claim": {"namespace": namespace, "name": "v"}},
                             namespace=namespace)


# ------------------------------------------------------------------------------------------------ targets

@pytest.mark.parametrize("url", FORGED)
def test_forged_targets_are_refused_at_write_naming_the_field(admin_client, settings, url):
    settings.WEBHOOK_ALLOWED_TARGETS = [ALLOWED]
    body = queue_body("bad", gpus=1, preemption={"webhook": {"url": url}})
    resp = admin_client.post(Q, body, format="json")
    assert resp.status_code == 422, resp.content
    assert [e["field"] for e in resp.json()["errors"]] == ["spec.preemption.webhook.url"]
    assert not Queue.objects.filter(name="bad").exists()


def test_the_exact_target_is_accepted_in_any_spelling(admin_client, settings):
    settings.WEBHOOK_ALLOWED_TARGETS = ["https://hooks.example.com", ALLOWED]
    for i, url in enumerate(["https://hooks.example.com/a?x=1", "https://HOOKS.example.com:443/b",
                             "http://127.0.0.1:18250/notice"]):
        hooked_queue(admin_client, url, name=f"ok{i}")


@pytest.mark.django_db
@pytest.mark.parametrize("url", FORGED[:3])
def test_forged_targets_are_refused_again_at_delivery(receiver, settings, url):
    settings.WEBHOOK_ALLOWED_TARGETS = [ALLOWED, receiver.target]
    d = new_delivery(url.replace("18250", str(receiver.port)))
    assert deliveries.attempt(d.id)[0].startswith("failed: refused")
    d.refresh_from_db()
    assert (d.status, d.attempts, receiver.connections) == (DeliveryStatus.FAILED, 1, 0)


@pytest.mark.django_db
def test_a_target_taken_off_the_list_and_a_name_resolving_to_loopback_are_refused(receiver, settings):
    settings.WEBHOOK_ALLOWED_TARGETS = [f"http://localhost:{receiver.port}"]
    d = new_delivery(f"http://localhost:{receiver.port}/notice")
    outcome, retry = deliveries.attempt(d.id)
    assert "not public" in outcome and retry is None  # localhost is loopback: only the literal may be allowed
    settings.WEBHOOK_ALLOWED_TARGETS = []
    d2 = new_delivery(receiver.url())  # created while allowed (say), refused once the list no longer has it
    assert "allow-list" in deliveries.attempt(d2.id)[0]
    assert receiver.connections == 0


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fd00::1", "::ffff:169.254.169.254",
                                     "::ffff:8.8.8.8", "2002:a9fe:a9fe::1", "224.0.0.1"])
def test_a_name_resolving_to_a_non_public_address_is_refused(settings, monkeypatch, address):
    settings.WEBHOOK_ALLOWED_TARGETS = ["https://hooks.example.com"]
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    # The DNS answer is the attacker's to choose: here, the one address under test.
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(family, socket.SOCK_STREAM, 6, "", (address, 443))])
    with pytest.raises(webhooks.TargetRefused, match="not public"):
        webhooks.resolve(webhooks.check_url("https://hooks.example.com/x"))


def test_a_public_answer_is_used_as_resolved(settings, monkeypatch):
    settings.WEBHOOK_ALLOWED_TARGETS = ["https://hooks.example.com"]
    answers = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 443)),
               (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answers)
    assert webhooks.resolve(webhooks.check_url("https://hooks.example.com/x")) == "93.184.215.14"


# -------------------------------------------------------------------------------------------- the transport

@pytest.mark.django_db
def test_redirects_are_not_followed(settings):
    elsewhere = Receiver()
    redirect = Receiver(answers=[("status", 307, {"Location": elsewhere.url()})])
    try:
        settings.WEBHOOK_ALLOWED_TARGETS = [redirect.target, elsewhere.target]
        d = new_delivery(redirect.url())
        outcome, retry = deliveries.attempt(d.id)
        assert outcome == "failed: HTTP 307: redirects are not followed" and retry is None
        d.refresh_from_db()
        assert d.status == DeliveryStatus.FAILED and elsewhere.connections == 0 and redirect.connections == 1
    finally:
        redirect.close()
        elsewhere.close()


def test_the_deadline_covers_the_whole_answer(settings):
    trickle = Receiver(answers=[("trickle", 0.25)])  # a byte every 0.25 s: each read succeeds, the whole never
    settings.WEBHOOK_ALLOWED_TARGETS = [trickle.target]
    try:
        started = time.monotonic()
        with pytest.raises(webhooks.AttemptFailed, match="^timeout"):
            webhooks.post(trickle.url(), b"{}", {}, deadline_seconds=1.0)
        took = time.monotonic() - started
        assert 1.0 <= took < 1.5, took
        time.sleep(0.3)
        assert trickle.requests[0].closed is not None and trickle.requests[0].closed - started < 1.5
    finally:
        trickle.close()


# ------------------------------------------------------------------------------------------------ signing

def test_a_generated_secret_is_shown_once_and_signs_verifiable_notices(admin_client, receiver, settings):
    receiver.answers = [("status", 503, {}), ("status", 204, {})]
    settings.WEBHOOK_ALLOWED_TARGETS = [receiver.target]
    created = hooked_queue(admin_client, receiver.url())
    secret = created["spec"]["preemption"]["webhook"]["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert secret not in admin_client.get(f"{Q}/team-a").content.decode()  # once: never again
    assert secret not in admin_client.get(Q).content.decode()
    d = new_delivery(receiver.url(), secret=Queue.objects.get(name="team-a").spec["preemption"]["webhook"]["secret"])
    assert deliveries.attempt(d.id) == ("failed: HTTP 503", 2)
    WebhookDelivery.objects.filter(id=d.id).update(next_attempt_at=d.created_at)  # the backoff passes
    assert deliveries.attempt(d.id) == ("delivered", None)
    first, second = receiver.requests
    assert first.head["webhook-id"] == second.head["webhook-id"] == d.message_id  # stable: receivers dedupe
    for request in (first, second):
        assert Webhook(secret).verify(request.body, request.head)["kind"] == "PreemptionNotice"
        forged = {**request.head, "webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()}
        with pytest.raises(Exception, match="No matching signature"):
            Webhook(secret).verify(request.body, forged)
    stale = {**first.head, "webhook-timestamp": str(int(time.time()) - 3600)}  # a replay an hour later
    with pytest.raises(Exception, match="too old"):
        Webhook(secret).verify(first.body, stale)


@pytest.mark.django_db
def test_a_webhook_without_a_valid_secret_is_never_signed_with_an_empty_key(receiver, settings):
    settings.WEBHOOK_ALLOWED_TARGETS = [receiver.target]
    d = deliveries.create("preemption.pending", "queue/x", receiver.url(), "", {"kind": "PreemptionNotice"})
    assert deliveries.attempt(d.id)[0] == "failed: the webhook has no valid signing secret"
    assert receiver.connections == 0


def test_a_retry_goes_to_the_url_captured_with_the_notice(admin_client, settings):
    first, later = Receiver(answers=[("status", 500, {}), ("status", 204, {})]), Receiver()
    try:
        settings.WEBHOOK_ALLOWED_TARGETS = [first.target, later.target]
        hooked_queue(admin_client, first.url())
        hook = Queue.objects.get(name="team-a").spec["preemption"]["webhook"]
        d = new_delivery(hook["url"], hook["secret"])
        assert deliveries.attempt(d.id)[0] == "failed: HTTP 500"
        resp = admin_client.patch(f"{Q}/team-a", {"spec": {"preemption": {"webhook": {"url": later.url()}}}},
                                  format="json")
        assert resp.status_code == 200, resp.content
        WebhookDelivery.objects.filter(id=d.id).update(next_attempt_at=d.created_at)
        assert deliveries.attempt(d.id)[0] == "delivered"
        assert (first.connections, later.connections) == (2, 0)
    finally:
        first.close()
        later.close()


# ---------------------------------------------------------------------------------------- the deliveries list

def test_deliveries_are_listed_for_those_who_read_their_namespace(admin_client, ns_client, receiver, settings):
    settings.WEBHOOK_ALLOWED_TARGETS = [receiver.target]
    hooked_queue(admin_client, receiver.url())
    mine = [new_delivery(receiver.url(), namespace="a") for _ in range(3)]
    new_delivery(receiver.url(), namespace="b")
    new_delivery(receiver.url(), owner="queue/other")
    deliveries.attempt(mine[0].id)
    page = admin_client.get(f"{Q}/team-a/deliveries?limit=2").json()
    assert page["kind"] == "WebhookDeliveryList" and len(page["items"]) == 2 and page["metadata"]["continue"]
    item = page["items"][0]
    assert set(item) == {"id", "event", "url", "attempts", "status", "lastError", "createdAt", "lastAttemptAt",
                         "nextAttemptAt", "finishedAt"}
    assert (item["id"], item["status"], item["attempts"], item["url"]) == (
        mine[0].message_id, "Delivered", 1, receiver.url())
    rest = admin_client.get(f"{Q}/team-a/deliveries?limit=2&continue={page['metadata']['continue']}").json()
    assert len(rest["items"]) == 2 and "continue" not in rest["metadata"]
    assert [i["id"] for i in ns_client("a").get(f"{Q}/team-a/deliveries").json()["items"]] == [
        d.message_id for d in mine]
    assert ns_client("c").get(f"{Q}/team-a/deliveries").json()["items"] == []
    assert ns_client("c").get(f"{Q}/team-a/webhook-events").json()["items"] == []  # admins only
    assert admin_client.get(f"{Q}/nowhere/deliveries").status_code == 404
    assert "secret" not in str(page)


@pytest.mark.django_db
def test_secretless_webhooks_get_a_secret_and_an_event_by_migration(admin_client, settings):
    settings.WEBHOOK_ALLOWED_TARGETS = [ALLOWED]
    hooked_queue(admin_client, ALLOWED + "/a", name="bare")
    hooked_queue(admin_client, ALLOWED + "/b", name="old")
    for name, secret in (("bare", None), ("old", "0123456789abcdef-secret")):  # as stored before this version
        q = Queue.objects.get(name=name)
        q.spec["preemption"]["webhook"] = {"url": q.spec["preemption"]["webhook"]["url"],
                                           **({"secret": secret} if secret else {})}
        q.save()
    migration = importlib.import_module("draservice.migrations.0004_webhook_secrets")
    migration.forwards(apps, None)
    bare = Queue.objects.get(name="bare").spec["preemption"]["webhook"]["secret"]
    assert webhooks.secret_key(bare) is not None and len(webhooks.secret_key(bare)) == 32
    old = Queue.objects.get(name="old").spec["preemption"]["webhook"]["secret"]
    assert webhooks.secret_key(old) == b"0123456789abcdef-secret"  # the same key, the new spelling
    events = admin_client.get(f"{Q}/bare/webhook-events").json()["items"]
    assert [e["reason"] for e in events] == ["SecretGenerated"] and "PATCH" in events[0]["message"]
    assert list(WebhookEvent.objects.filter(owner="queue/old").values_list("reason", flat=True)) == ["SecretConverted"]


def test_https_goes_to_the_address_resolved_once_with_the_urls_host_as_sni_and_host(settings, monkeypatch, tmp_path):
    """hooks.test resolves (once) to an address that stands for a public one here; the connection goes to that
    address, the TLS server name and Host header are the URL's host, and the certificate is checked for it."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-keyout", str(key), "-out", str(cert), "-subj", "/CN=hooks.test",
                    "-addext", "subjectAltName=DNS:hooks.test"], check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    names: list = []
    server.sni_callback = lambda sock, name, ctx: names.append(name)
    receiver = Receiver(tls=server)
    lookups: list[str] = []
    real = socket.getaddrinfo

    def dns(host, *args, **kwargs):
        if host.endswith(".test"):
            lookups.append(host)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", receiver.port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    monkeypatch.setattr(webhooks, "_reachable", lambda address: True)  # 127.0.0.1 plays a public address
    settings.WEBHOOK_CA_FILE = str(cert)
    settings.WEBHOOK_ALLOWED_TARGETS = [f"https://hooks.test:{receiver.port}", f"https://other.test:{receiver.port}"]
    try:
        assert webhooks.post(f"https://hooks.test:{receiver.port}/n?x=1", b"{}", {"webhook-id": "msg_1"}) == 204
        assert lookups == ["hooks.test"] and names == ["hooks.test"]
        request = receiver.requests[0]
        assert request.head["host"] == f"hooks.test:{receiver.port}" and request.head["request-line"] == \
            "POST /n?x=1 HTTP/1.1" and request.head["webhook-id"] == "msg_1"
        # The same address under another name: the certificate is not for it, so no request is sent.
        with pytest.raises(webhooks.AttemptFailed, match="TLS failed.*certificate verify failed"):
            webhooks.post(f"https://other.test:{receiver.port}/n", b"{}", {})
        assert len(receiver.requests) == 1
    finally:
        receiver.close()


def test_a_notice_enqueued_by_the_previous_version_becomes_a_delivery(admin_client, receiver, settings, h100_fleet,
                                                                     django_capture_on_commit_callbacks):
    from claims.models import ResourceClaim
    from queues.models import Preemption
    from queues.tasks import notify_preemption
    from tests.queues.test_admission import submit

    settings.WEBHOOK_ALLOWED_TARGETS = [receiver.target]
    hooked_queue(admin_client, receiver.url())
    submit(admin_client, "a", "victim")
    p = Preemption.objects.create(victim=ResourceClaim.objects.get(name="victim"), queue="team-a",
                                  deadline="2030-01-01T00:00:00Z")
    with django_capture_on_commit_callbacks(execute=True):
        assert notify_preemption(p.id) == 1
    assert notify_preemption(p.id) == 0  # once
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.owner, delivery.namespace) == (DeliveryStatus.DELIVERED, "queue/team-a", "a")
