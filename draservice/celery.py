"""The Celery application.

With no broker configured (``CELERY_BROKER_URL`` empty) tasks run eagerly in the
calling process, so the service works with nothing but Python.
"""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")

app = Celery("draservice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
