"""The project's Celery app on a queue of the test run's own (``GANGS_TEST_QUEUE``), for worker subprocesses.

``GANGS_TEST_RACE=1`` turns off the allocators' turn lock, so that concurrent gang workers decide at the same
time and only the database checks stand between them and a double or partial allocation.
"""
import os

from draservice.celery import app

app.conf.task_default_queue = os.environ.get("GANGS_TEST_QUEUE", "celery")
app.conf.task_always_eager = False

if os.environ.get("GANGS_TEST_RACE") == "1":
    from django.conf import settings

    settings.CLAIMS_SERIALIZE_ALLOCATION = False
