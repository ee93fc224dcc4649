"""The dashboard's Replays pages (issue 39: "A dashboard page shows the comparison"): the comparison per queue is
the Replay resource's, figure for figure; only admins see replays and only writing admins start one (the API's
rule); the form goes through the API's service, and a bad input is a 4xx naming the field; each page costs a
bounded number of statements however many queues a replay compares."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from scheduler.models import Replay, ReplayState
from scheduler.services import replays
from tests.history.cells import cells, rows
from tests.history.trace import HAPPENED, recorded_day
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db

STAMP = "%Y-%m-%dT%H:%M:%SZ"


def person(name: str, staff: bool) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(name, is_staff=staff))
    return client


def share(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.2f} %"


def test_the_replay_page_shows_the_api_figures_side_by_side(admin_client, django_capture_on_commit_callbacks):
    start, end = recorded_day(admin_client)
    ops = person("ops", staff=True)
    form = {"start": start.strftime(STAMP), "end": end.strftime(STAMP), "weight:b": "3", "weight:a": ""}
    with django_capture_on_commit_callbacks(execute=True):  # no broker, no runner: it runs after the commit
        resp = ops.post("/replays/start/", form)
    replay = Replay.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/replays/{replay.uid}/"
    # What the API would have stored for the same body: the override, the author, the window.
    assert replay.configuration == {"queues": [{"name": "b", "spec": {"weight": 3}}]}
    assert (replay.author, replay.state) == ("user:ops", ReplayState.SUCCEEDED), replay.message
    assert (replay.window_start, replay.window_end) == (start, end)

    doc = ops.get(f"/api/v1/replays/{replay.uid}").json()  # the Replay resource, as the API gives it
    html = ops.get(f"/replays/{replay.uid}/").content.decode()
    assert 'data-testid="replay-state">Succeeded<' in html and "user:ops" in html
    shown = {r["attrs"]["data-queue"]: r for r in rows(html, "comparison-row")}
    results = doc["status"]["results"]
    assert list(shown) == [q["name"] for q in results["queues"]] == ["a", "b"]
    for q in results["queues"]:
        row, sides = shown[q["name"]], (q["actual"], q["replayed"])
        assert [c["text"] for c in cells(row, "started")] == [f"{s['started']} / {s['claims']}" for s in sides]
        for cell, key in (("p50", "waitP50Seconds"), ("p95", "waitP95Seconds")):
            assert [c["attrs"]["data-value"] for c in cells(row, cell)] == [str(s[key]) for s in sides], cell
        assert [c["text"] for c in cells(row, "share")] == [share(s["shareOfDeviceHours"]) for s in sides]
        assert [c["text"] for c in cells(row, "deviceHours")] == [str(s["deviceHours"]) for s in sides]
        assert [c["text"] for c in cells(row, "preemptions")] == [str(s["preemptions"]) for s in sides]
    # What happened is known by construction: the API's figures, and the page's words for them.
    assert {q["name"]: q["actual"] for q in results["queues"]} == HAPPENED
    b = shown["b"]
    assert [c["text"] for c in cells(b, "p50")][0] == "2h 30m" and [c["text"] for c in cells(b, "p95")][0] == "3h"
    assert [c["text"] for c in cells(b, "share")][0] == "23.81 %"
    assert [c["text"] for c in cells(shown["a"], "p50")][0] == "0 s"
    # The configuration used: the override, and the weights in force (b's overridden for the whole window).
    assert [[c["text"] for c in r["cells"]] for r in rows(html, "override-row")] == [["Queue", "b", '{"weight": 3}']]
    used = [[c["text"] for c in r["cells"]] for r in rows(html, "configuration-row")]
    assert used[0][0] == f"{start:%Y-%m-%d %H:%M:%S} UTC"  # one configuration, from the window's start
    assert [r[-4:-2] for r in used] == [["a", "1"], ["b", "3"], ["default", "1"]], used

    listed = ops.get("/replays/").content.decode()
    (row,) = rows(listed, "replay-row")
    texts = [c["text"] for c in row["cells"]]
    assert row["attrs"]["data-replay"] == str(replay.uid)
    assert texts[1] == "Succeeded" and texts[4] == "user:ops" and texts[3] == 'Queue b: {"weight": 3}'
    assert texts[2] == f"{start:%Y-%m-%d %H:%M} UTC – {end:%Y-%m-%d %H:%M} UTC"


def test_only_admins_see_replays_and_only_writing_admins_start_one(admin_client):
    replay = replays.create({"window": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}}, "me")
    pages = ["/replays/", f"/replays/{replay.uid}/"]
    anonymous = Client()
    for url in pages:
        resp = anonymous.get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/"), url
    assert anonymous.post("/replays/start/", {}).status_code == 302
    viewer, ops = person("viewer", staff=False), person("ops", staff=True)
    for url in pages:
        assert viewer.get(url).status_code == 403, url
        assert ops.get(url).status_code == 200, url
    body = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}
    assert viewer.post("/replays/start/", body).status_code == 403
    assert Replay.objects.count() == 1  # the viewer's POST made none
    assert viewer.get("/api/v1/replays").status_code == 403  # the API says the same to the same person
    # The navigation names the page to admins only.
    assert 'data-testid="nav-replays"' not in viewer.get("/queues/").content.decode()
    assert 'data-testid="nav-replays"' in ops.get("/queues/").content.decode()
    assert ops.get("/replays/nope/").status_code == 404


def test_the_form_refuses_bad_input_naming_the_field(admin_client):
    assert admin_client.post("/api/v1/queues", queue_body("b"), format="json").status_code == 201
    ops = person("ops", staff=True)
    bad = {"start": "yesterday", "end": "2026-01-02T00:00:00Z", "weight:b": "-1", "budgetSeconds": "lots"}
    resp = ops.post("/replays/start/", bad)
    assert resp.status_code == 422
    html = resp.content.decode()
    fields = sorted(re.findall(r'data-testid="problem" data-field="([^"]*)"', html))
    assert fields == ["budgetSeconds", "configuration.queues[0].spec.weight", "window.start"], html
    # Each reason beside its input, which is marked, and what was typed is kept.
    start_input = html.split('id="r-start"')[1].split(">")[0]
    assert 'value="yesterday"' in start_input and 'aria-invalid="true"' in start_input
    weight_input = html.split('name="weight:b"')[1].split(">")[0]
    assert 'value="-1"' in weight_input and 'aria-invalid="true"' in weight_input
    assert html.split('name="weight:b"')[1].split("</td>")[0].count('class="field-error"') == 1
    assert Replay.objects.count() == 0

    not_json = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z", "configuration": "{queues"}
    resp = ops.post("/replays/start/", not_json)
    assert resp.status_code == 422 and "configuration: Invalid value: not JSON" in resp.content.decode()
    for weight in ("nan", "inf"):  # no JSON number: the service's "must be a number", not a database error
        resp = ops.post("/replays/start/", {**not_json, "configuration": "", "weight:b": weight})
        assert resp.status_code == 422 and "configuration.queues[0].spec.weight: Invalid value: &quot;" \
            f"{weight}&quot;: must be a number greater than 0" in resp.content.decode()
    resp = ops.post("/replays/start/", {**not_json, "configuration": '{"queues": [{"name": "b", "spec": '
                                                                     '{"weight": NaN}}]}'})
    assert resp.status_code == 422 and "configuration: Invalid value: not JSON: NaN" in resp.content.decode()
    unknown = {**not_json, "configuration": '{"queues": [{"name": "b", "spec": {"weight": 2}}], "nodes": []}'}
    resp = ops.post("/replays/start/", unknown)
    assert resp.status_code == 422 and "configuration.nodes: Unsupported value" in resp.content.decode()

    # Too many replays waiting: the service's 409, its message on the form.
    for _ in range(replays.MAX_ACTIVE):
        replays.create({"window": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}}, "me")
    resp = ops.post("/replays/start/", {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"})
    assert resp.status_code == 409 and f"{replays.MAX_ACTIVE} replays are waiting or running" in resp.content.decode()


def test_the_pages_cost_the_same_statements_however_many_queues(admin_client, django_capture_on_commit_callbacks,
                                                                 django_assert_max_num_queries):
    start, end = recorded_day(admin_client, more_queues=20)  # 22 queues with claims, all in the day's replay
    with django_capture_on_commit_callbacks(execute=True):
        few = replays.create({"window": {"start": start.strftime(STAMP),
                                         "end": (start + timedelta(hours=5)).strftime(STAMP)}}, "me")
        many = replays.create({"window": {"start": start.strftime(STAMP), "end": end.strftime(STAMP)}}, "me")
    ops = person("ops", staff=True)
    for replay, queues in ((few, 2), (many, 22)):
        # The session, its user, the replay: the comparison is the replay's own results.
        with django_assert_max_num_queries(3):
            html = ops.get(f"/replays/{replay.uid}/").content.decode()
        assert len(rows(html, "comparison-row")) == queues
    # The session, its user, the count and the page of replays, the queues for the form's weights.
    with django_assert_max_num_queries(5):
        html = ops.get("/replays/").content.decode()
    assert len(rows(html, "replay-row")) == 2 and html.count('aria-label="weight of ') == 23  # and "default"
