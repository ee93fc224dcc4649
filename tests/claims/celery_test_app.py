"""The project's Celery app, routed to a queue of the test run's own (``CLAIMS_TEST_QUEUE``).

Worker subprocesses load this module (``celery -A tests.claims.celery_test_app worker``) so that tasks they
enqueue themselves (fan-out, retries) stay on the test run's queue and never meet another run's workers.
"""
import os

from draservice.celery import app

app.conf.task_default_queue = os.environ.get("CLAIMS_TEST_QUEUE", "celery")
app.conf.task_always_eager = False
if os.environ.get("CLAIMS_TEST_QUEUE"):
    # Webhook deliveries go to the run's own notify queue too (tests/queues/test_webhook_workers.py).
    from django.conf import settings

    settings.NOTIFY_QUEUE = f"{os.environ['CLAIMS_TEST_QUEUE']}-notify"
    # And replays to its own replay queue (tests/history/test_replay_workers.py).
    settings.REPLAY_QUEUE = f"{os.environ['CLAIMS_TEST_QUEUE']}-replay"

if os.environ.get("CLAIMS_TEST_RACE") == "1":
    # Let the workers decide concurrently (no per-cluster turns: scheduler.services.turns), so that only the
    # database checks stand between them and a double allocation.
    from django.conf import settings

    settings.CLAIMS_CLUSTER_TURNS = False

if os.environ.get("QUEUES_TEST_ADMIT_DELAY"):
    # The queue race tests widen the window between the quota check and the write of the charges: a seam
    # installed in the workers' process only, once Django is set up (Celery's Django fixup does it on
    # worker_init, connected before this receiver); product code reads no setting for it.
    from celery.signals import worker_init

    @worker_init.connect(weak=False)
    def _delay_admission_writes(**kwargs) -> None:
        from tests.queues.seams import delay_admission_writes

        delay_admission_writes(float(os.environ["QUEUES_TEST_ADMIT_DELAY"]))
