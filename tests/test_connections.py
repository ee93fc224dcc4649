"""Persistent database connections expire at spread-out times (draservice.connections): opened together (every
thread of a web worker at start), they had all reconnected in the same second of every period, and the server's
new backends' first statements held up everything running then."""
from __future__ import annotations

import time

import pytest
from django.db import connections


@pytest.mark.django_db(transaction=True)
def test_connections_opened_together_expire_at_different_times(settings):
    max_age = settings.DATABASES["default"]["CONN_MAX_AGE"]
    assert max_age == 300  # the default (DB_CONN_MAX_AGE)
    connection = connections["default"]
    left: list[float] = []
    for _ in range(20):  # 20 connections opened within milliseconds, as a web worker's threads open theirs
        connection.close()
        connection.ensure_connection()
        left.append(connection.close_at - time.monotonic())
    assert len(left) == 20
    assert all(0.5 * max_age - 5 <= x <= max_age for x in left), left  # in the last half of the period
    assert max(left) - min(left) > 0.1 * max_age, left  # not all in the same second (Django's: all within ~0.1 s)


@pytest.mark.django_db(transaction=True)
def test_a_connection_closed_after_every_request_stays_so(settings):
    connection = connections["default"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = 0
    try:
        connection.ensure_connection()
        assert connection.close_at <= time.monotonic()  # Django closes it at the end of the request
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = settings.DATABASES["default"]["CONN_MAX_AGE"]
