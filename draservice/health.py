"""Liveness and readiness probes."""
from django.conf import settings
from django.db import connection
from django.http import JsonResponse


def livez(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    checks = {}
    ok = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # report, never raise: this is a probe
        checks["database"] = f"error: {exc}"
        ok = False
    if settings.CELERY_BROKER_URL:
        try:
            from draservice.celery import app

            with app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
            checks["broker"] = "ok"
        except Exception as exc:
            checks["broker"] = f"error: {exc}"
            ok = False
    else:
        checks["broker"] = "eager (no broker configured)"
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)
