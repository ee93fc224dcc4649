"""``draservice.bulk.pg_execute``: the service's bulk statements are prepared on the connection, so PostgreSQL
parses and plans each once per connection instead of at every run (``DB_PREPARED_STATEMENTS``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection

from draservice.bulk import pg_execute

pytestmark = pytest.mark.django_db

SQL = "SELECT count(*) FROM unnest(%b::bigint[]) AS k WHERE k > %b::bigint"


def _prepared() -> list[str]:
    with connection.cursor() as cursor:  # Django's own cursor: never prepared, so it does not count itself
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s", ["%unnest($1%"])
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
