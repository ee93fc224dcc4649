"""Settings, all from environment variables (12-factor), with safe development defaults.

Every knob is read once here; nothing else in the code reads ``os.environ``.
"""
import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
# The development key is only acceptable with DEBUG or on the embedded default; deployments set SECRET_KEY.
SECRET_KEY = os.environ.get("SECRET_KEY") or "dev-insecure-draservice-key-change-me-in-production"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "inventory",
    "claims",
    "frontend",
    "gangs",
    "queues",
    "scheduler",
    "kube",
    "usage",
    "workloads",
    "draservice",  # last: collects the beat schedule once every app is ready
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "draservice.middleware.RejectNULMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.common.CommonMiddleware",
    "draservice.middleware.BrowserMiddleware",  # BROWSER_MIDDLEWARE, for any request without a Bearer token
    "draservice.audit.ActorMiddleware",  # who makes a change, for the audit trail
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "draservice.metrics.RequestMetricsMiddleware",
    "draservice.dryrun.DryRunMiddleware",  # innermost: its transaction holds the view and nothing else
]

# Run by draservice.middleware.BrowserMiddleware, in this order, for every request but those with a Bearer token
# (which need none of them: the token alone says who the caller is).
BROWSER_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
# The checks look for these middlewares in MIDDLEWARE; BrowserMiddleware runs them (BROWSER_MIDDLEWARE) for every
# request that can carry a session, which is every request the admin and the dashboard serve.
SILENCED_SYSTEM_CHECKS = ["admin.E408", "admin.E409", "admin.E410", "security.W003"]
ROOT_URLCONF = "draservice.urls"
WSGI_APPLICATION = "draservice.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Embedded default: SQLite with IMMEDIATE transactions, so every write transaction takes the
# database write lock at BEGIN and allocations are serialized (no two writers interleave).
# PostgreSQL is the production database and the one the tests use.
VAR_DIR = Path(os.environ.get("DRASERVICE_VAR_DIR", BASE_DIR / "var"))
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'draservice.sqlite3'}"
# Persistent connections: each new one costs its server backend the catalog caches and the re-preparing of the
# service's statements. Each is closed at a random point of the last half of this many seconds
# (draservice.connections), so connections opened together do not all reconnect in the same second.
DB_CONN_MAX_AGE = int(os.environ.get("DB_CONN_MAX_AGE", "300"))
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=DB_CONN_MAX_AGE)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"}
    )
    DATABASES["default"]["ATOMIC_REQUESTS"] = False
# psycopg prepares a statement bound on the server (the service's bulk statements, draservice.bulk.pg_execute, and
# its compiled lookups, draservice.prepared) once it has run this many times on a connection; Django turns that
# off, for poolers. Off (0) only behind a pooler that hands a session's statements to other server connections
# (PgBouncer in transaction mode before 1.21). Django's other queries bind on the client, never prepared.
DB_PREPARED_STATEMENTS = env_bool("DB_PREPARED_STATEMENTS", True)
if DB_PREPARED_STATEMENTS and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5  # psycopg's own default
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- Celery -----------------------------------------------------------------------------------
# No broker configured: tasks run in-process (eager), so the embedded default needs no Redis.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message for another worker
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the database connections before and after EVERY task unless this is set (it reads
# no CONN_MAX_AGE): a worker then opened a PostgreSQL connection per task, and each one started a backend that
# loaded its catalog caches anew, on both sides of the socket. Set, the fixup closes them every 2 x this many
# tasks only; draservice.celery closes them after a task as Django does after a request (past CONN_MAX_AGE, or
# unusable).
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_BEAT_SCHEDULE: dict = {}  # filled by the apps' tasks modules (see claims/apps.py)

# --- Product knobs ----------------------------------------------------------------------------
# The change log (watch, list resourceVersion) keeps this long; a watch from an older resourceVersion
# gets 410 Gone and lists again, as against a compacted etcd.
CHANGES_RETENTION_SECONDS = int(os.environ.get("CHANGES_RETENTION_SECONDS", "3600"))
# The Kubernetes front door (/k8s): watches each hold a web thread, so each process allows this many at once
# (more get 429 with Retry-After) and none lasts longer than KUBE_WATCH_MAX_SECONDS (clients reconnect).
KUBE_MAX_WATCHES = int(os.environ.get("KUBE_MAX_WATCHES", "16"))
KUBE_WATCH_MAX_SECONDS = int(os.environ.get("KUBE_WATCH_MAX_SECONDS", "300"))
# Per-namespace object caps (claims.services.caps; an admin sets a namespace's own at
# /api/v1/namespaces/{ns}/objectquota): pending claims, and ResourcePoolStatusRequests kept (with a rate cap).
NAMESPACE_MAX_PENDING_CLAIMS = int(os.environ.get("NAMESPACE_MAX_PENDING_CLAIMS", "5000"))
NAMESPACE_MAX_POOL_STATUS_REQUESTS = int(os.environ.get("NAMESPACE_MAX_POOL_STATUS_REQUESTS", "100"))
POOL_STATUS_REQUESTS_PER_MINUTE = int(os.environ.get("POOL_STATUS_REQUESTS_PER_MINUTE", "30"))
# The watch server (``manage.py watch_server``, kube.watch_server) serves watches without threads: open
# watches per token (or session user) and per process, beyond which a watch gets 429 with Retry-After, and
# the threads (each with one database connection) that read the change log and render changed objects.
KUBE_MAX_WATCHES_PER_TOKEN = int(os.environ.get("KUBE_MAX_WATCHES_PER_TOKEN", "50"))
KUBE_WATCH_SERVER_MAX_WATCHES = int(os.environ.get("KUBE_WATCH_SERVER_MAX_WATCHES", "2000"))
KUBE_WATCH_SERVER_DB_THREADS = int(os.environ.get("KUBE_WATCH_SERVER_DB_THREADS", "4"))
# A cluster silent for longer than this is stale: its devices are not offered for new allocations.
STALE_CLUSTER_SECONDS = int(os.environ.get("STALE_CLUSTER_SECONDS", "300"))
# Pending claims a freed device wakes (the first it can serve in the scheduler's order), besides the queue
# head holding its node; the next ones are woken when the device is still free after they were decided.
WAKE_FANOUT = int(os.environ.get("WAKE_FANOUT", "4"))
# The plan (queues' first planDepth claims, their planned starts): recomputed at most this often (seconds), or
# sooner when a release or an arrival changes a queue's first planDepth. The round latency is the time from a
# walltime end's sweep to the round that gives the freed devices away (added to planned starts with the sweep).
PLAN_INTERVAL = float(os.environ.get("PLAN_INTERVAL", "10"))
PLAN_ROUND_LATENCY_SECONDS = float(os.environ.get("PLAN_ROUND_LATENCY_SECONDS", "1"))
# Claims' history (arrival, shape, walltime: claims.models.ClaimHistory) is kept this many days after the
# claim, for replays (POST /api/v1/replays); an hourly beat task prunes what is older.
HISTORY_DAYS = int(os.environ.get("HISTORY_DAYS", "30"))
# Replays run on a Celery queue of their own (`celery worker -Q replay`), never on the allocation workers';
# a replay stops (Failed) once it has used this much CPU time.
REPLAY_QUEUE = os.environ.get("REPLAY_QUEUE", "replay")
REPLAY_CPU_SECONDS = float(os.environ.get("REPLAY_CPU_SECONDS", "120"))
# The demo fleet loaded by `make run` (nodes in total, spread over several clusters).
DEMO_FLEET_NODES = int(os.environ.get("DEMO_FLEET_NODES", "48"))
# /metrics names every cluster and its allocation counts: it needs an admin token unless this is true
# (e.g. for a Prometheus that scrapes without credentials inside a trusted network).
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", False)
# /metrics names pending claims per namespace only for the namespaces with the most pending claims (a series
# per namespace would grow without bound with the tenants).
METRICS_TOP_NAMESPACES = int(os.environ.get("METRICS_TOP_NAMESPACES", "20"))
# The allocation histograms (submit->allocated latency, round duration) describe this trailing window, read
# from the database at scrape time; at most METRICS_WINDOW_ROWS of the newest rows are read per histogram.
METRICS_WINDOW_SECONDS = int(os.environ.get("METRICS_WINDOW_SECONDS", "900"))
METRICS_WINDOW_ROWS = int(os.environ.get("METRICS_WINDOW_ROWS", "20000"))
# Set by gunicorn.conf.py for its workers (prometheus_client's multiprocess mode: /metrics sums the request
# metrics of every worker of the server); empty in single-process runs (manage.py serve, Celery, tests).
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
# Prefix of every Redis key and pub/sub channel the service uses. Empty: derived from the database (host,
# port, name), so deployments sharing a Redis do not wake or silence each other (claims.notify.key_prefix).
REDIS_KEY_PREFIX = os.environ.get("REDIS_KEY_PREFIX", "")
# A process asks the broker for a debounced task (an allocation round after a claim POST, a release) at once, and
# then at most once more per this many seconds for everything committed meanwhile (draservice.dispatch): under a
# stream of POSTs most of them skip the broker's round trip; a claim waits this long for its round at most.
# 0: every commit asks.
DISPATCH_COALESCE_SECONDS = float(os.environ.get("DISPATCH_COALESCE_SECONDS", "0.01"))
# Keep the demo fleet's fake clusters fresh (a beat task heartbeats them). Off everywhere but where the demo was
# asked for (`make run` -> `manage.py serve --demo`): in production it would let claims land on fake nodes.
DEMO_FLEET = env_bool("DEMO_FLEET", False)
# Largest request body accepted (a 5,000-node x 8-GPU push is ~40 MB of JSON).
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("DATA_UPLOAD_MAX_MEMORY_SIZE", str(200 * 1024 * 1024)))

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "draservice.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer", "draservice.yaml.YAMLRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "draservice.parsers.JSONParser",
        "draservice.parsers.YAMLParser",
    ],
    "DEFAULT_METADATA_CLASS": "draservice.metadata.Metadata",
    "DEFAULT_FILTER_BACKENDS": [
        "draservice.filters.FilterBackend",
        "draservice.filters.FieldSelectorFilter",
        "draservice.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "draservice.pagination.ListPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "draservice.problems.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append("rest_framework.renderers.BrowsableAPIRenderer")

SPECTACULAR_SETTINGS = {
    "TITLE": "draservice API",
    "DESCRIPTION": "Kubernetes DRA (resource.k8s.io/v1) device inventory and allocation for a fleet of clusters.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # Task success lines every few seconds (the beat schedule) drown what an operator needs; failures still log.
    "loggers": {"django.db.backends": {"level": "WARNING"},
                "celery.app.trace": {"level": os.environ.get("CELERY_TRACE_LOG_LEVEL", "WARNING")}},
}

# Webhooks (draservice.webhooks): the only targets a webhook may call, comma-separated scheme://host[:port]
# entries matched exactly against the URL's parsed (scheme, host, port). A host that resolves to a loopback,
# private or link-local address is refused unless its entry is that address literally.
WEBHOOK_ALLOWED_TARGETS = [t.strip() for t in os.environ.get("WEBHOOK_ALLOWED_TARGETS", "").split(",") if t.strip()]
# One delivery attempt, all of it (connect, TLS, send, the answer's head), ends after this many seconds.
WEBHOOK_DEADLINE_SECONDS = 10.0
WEBHOOK_MAX_ATTEMPTS = int(os.environ.get("WEBHOOK_MAX_ATTEMPTS", "6"))
# A PEM file of the CAs that https webhook targets' certificates must chain to; empty: the system's.
WEBHOOK_CA_FILE = os.environ.get("WEBHOOK_CA_FILE", "")
# The Celery queue of webhook deliveries: a worker of its own (`celery worker -Q notify`), so that a slow
# receiver holds a notify worker, never an allocation worker.
NOTIFY_QUEUE = os.environ.get("NOTIFY_QUEUE", "notify")
# How often the notify workers look at the service's tables' statistics and dead rows, and ANALYZE or VACUUM
# those past autovacuum's thresholds -- only where the server runs without autovacuum (draservice.upkeep_sql).
DB_UPKEEP_SECONDS = float(os.environ.get("DB_UPKEEP_SECONDS", "30"))
