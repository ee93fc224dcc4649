from django.apps import AppConfig
from django.db.backends.signals import connection_created

from draservice.connections import spread_close


class DraserviceConfig(AppConfig):
    """The platform pieces' app: ``manage.py serve`` and the one beat schedule collected from the apps.
    Listed last in INSTALLED_APPS, so every domain app is ready when it collects."""

    name = "draservice"

    def ready(self):
        from draservice import beat
        from draservice.celery import app

        beat.install()
        connection_created.connect(spread_close, dispatch_uid="draservice.spread_close")
        # Register every app's tasks in this process too (the web process runs them without a broker, and the
        # runner by name): Celery's own autodiscovery is lazy and only a worker's start triggers it.
        app.autodiscover_tasks(force=True)
