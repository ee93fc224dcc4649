"""``draservice.bulk.pg_execute`` and ``draservice.prepared``: the service's bulk statements and compiled lookups
are prepared on the connection, so PostgreSQL parses and plans each once per connection instead of at every run
(``DB_PREPARED_STATEMENTS``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from claims.models import Namespace
from draservice.bulk import pg_execute
from draservice.prepared import PreparedValues

pytestmark = pytest.mark.django_db

SQL = "SELECT count(*) FROM unnest(%b::bigint[]) AS k WHERE k > %b::bigint"


def _prepared(like: str = "%unnest($1%") -> list[str]:
    with connection.cursor() as cursor:  # Django's own cursor: never prepared, so it does not count itself
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", [like])
        return [row[0] for row in cursor.fetchall()]


def _run(values: list[int], floor: int) -> int:
    cursor = pg_execute(SQL, [values, floor])
    try:
        return cursor.fetchone()[0]
    finally:
        cursor.close()


def test_a_bulk_statement_is_prepared_after_a_few_runs_and_reused_with_any_number_of_rows():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's prepared statements")
    for n in range(5):
        assert _run(list(range(n + 3)), 1) == n + 1
    assert _prepared() == []  # a statement run a few times only is not worth preparing
    assert _run(list(range(1000)), 10) == 989  # the sixth run, with many more rows: the same text
    assert len(_prepared()) == 1
    assert _run([1, 2, 3], 1) == 2 and len(_prepared()) == 1


def test_behind_a_transaction_pooler_nothing_is_prepared():
    """``DB_PREPARED_STATEMENTS=0``: the connections are opened without psycopg's prepared statements."""
    out = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                          "print(settings.DATABASES['default'].get('OPTIONS', {}).get('prepare_threshold'))"],
                         env={**os.environ, "DB_PREPARED_STATEMENTS": "0",
                              "DJANGO_SETTINGS_MODULE": "draservice.settings"},
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "None"
    if connection.vendor == "postgresql":
        assert connection.connection.prepare_threshold == 5  # on by default


_BY_NAME = PreparedValues(lambda name: Namespace.objects.filter(name=name).values_list("id", "name"), ["?stand-in"])


def test_a_compiled_lookup_is_prepared_too_and_still_counted_as_a_query():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's prepared statements")
    ns = Namespace.objects.create(name="prepared-ns")
    with CaptureQueriesContext(connection) as ran:
        for _ in range(6):
            assert _BY_NAME.rows("prepared-ns") == [(ns.id, "prepared-ns")]
        assert _BY_NAME.rows("nobody") == []
    assert len(ran.captured_queries) == 7  # query counts (tests, debug logging) still see every run
    assert all(q["sql"].startswith('SELECT "claims_namespace"."id"') for q in ran.captured_queries)
    assert len(_prepared('%FROM "claims_namespace" WHERE%')) == 1
