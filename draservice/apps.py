from django.apps import AppConfig


class DraserviceConfig(AppConfig):
    """The platform pieces' app: ``manage.py serve`` and the one beat schedule collected from the apps.
    Listed last in INSTALLED_APPS, so every domain app is ready when it collects."""

    name = "draservice"

    def ready(self):
        from draservice import beat

        beat.install()
