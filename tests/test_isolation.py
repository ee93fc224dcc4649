"""Test isolation: what a transactional test's flush removes, the next test in the same process gets back.

The two tests run in this order (pytest-django runs a transactional test before tests that take the database
without the marker): the flush at the end of the first empties every table, data migrations' rows included."""
import pytest

from claims.models import FleetState
from queues.models import Queue


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_ends_with_a_flush():
    assert Queue.objects.filter(name="default").exists()


def test_the_data_migrations_rows_are_back_after_the_flush(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        assert Queue.objects.filter(name="default").exists()
        assert FleetState.objects.filter(pk=1).exists()
