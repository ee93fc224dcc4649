"""The web process of the chaos runs: the product's WSGI application, enqueueing to the test run's queue
(``CLAIMS_TEST_QUEUE``, read by ``tests.claims.celery_test_app``) so that its kicks reach the run's workers."""
import tests.claims.celery_test_app  # noqa: F401 - routes this process's tasks to the run's queue
from draservice.wsgi import application

__all__ = ["application"]
