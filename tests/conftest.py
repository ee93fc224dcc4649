"""Suite-wide fixtures. The Django suites use the machine's real PostgreSQL (DATABASE_URL, set by `make test`);
the pure library's suites (tests/cel, tests/engine) need no service at all.

Shared material (upstream's conformance vectors, real slices and selectors) is read through one place:
``shared_path()``, which the ``shared_dir`` fixture returns and ``pytest_generate_tests`` uses to parametrize
tests marked ``@pytest.mark.vectors(file, ...)`` (parametrization needs the data at collection, before fixtures).
"""
import importlib
import json
import os
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.apps import apps as django_apps
from django.conf import settings
from django.core.management import sql as management_sql
from django.core.management.commands import flush as flush_command
from django.db.models.signals import post_migrate

SHARED_LOCATION = os.path.join(os.path.dirname(__file__), "..", "..", "shared")


def pytest_configure(config):
    # One test database per pytest process: several suites running at once on one machine (developers,
    # helpers, CI, and each xdist worker of `make test`) must not drop each other's database mid-run.
    # (Settings only: nothing connects here.)
    default = settings.DATABASES["default"]
    worker = xdist_worker_index(config)
    name = os.environ.get("TEST_DATABASE_NAME")
    name = f"{name}_gw{worker}" if name and worker is not None else name
    default.setdefault("TEST", {})["NAME"] = name or f"test_{default['NAME']}_{os.getpid()}"
    # The tests' sessions commit without waiting for the WAL flush: a commit is then ~0.5 ms instead of the
    # disk's fsync (4 ms and more on this shared machine; the suite commits tens of thousands of times: every
    # request of a transactional test, every worker round, every migration). Visibility, locking and isolation
    # are unchanged; only a PostgreSQL crash could lose the last commits, which no test does. In os.environ
    # (libpq reads PGOPTIONS), so the Celery workers and live services the tests start commit the same way.
    os.environ.setdefault("PGOPTIONS", "-c synchronous_commit=off")
    if worker is not None and os.environ.get("TEST_BROKER_URL"):
        # In os.environ, so that every reader (fixtures, tests, the Celery workers they start) sees it.
        os.environ["TEST_BROKER_URL"] = broker_url_for_worker(os.environ["TEST_BROKER_URL"], worker)


def xdist_worker_index(config) -> int | None:
    """N for pytest-xdist's worker gwN; None in a plain (serial) run. Read from the worker's config, not from
    PYTEST_XDIST_WORKER: a pytest that a test starts in a subprocess inherits that variable but is no worker."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput["workerid"].removeprefix("gw")) if workerinput else None


def broker_url_for_worker(url: str, worker: int) -> str:
    """TEST_BROKER_URL names the first of consecutive Redis databases: worker N uses the Nth after it. The keys
    are already per test database (draservice.notify.key_prefix), but the Celery queues' bookkeeping and any
    test that reads a whole Redis database must not see another worker's traffic."""
    parts = urlsplit(url)
    first = int(parts.path.strip("/") or 0)
    if first + worker > REDIS_LAST_DB:
        raise pytest.UsageError(f"TEST_BROKER_URL {url}: xdist worker gw{worker} needs Redis database "
                                f"{first + worker}, beyond {REDIS_LAST_DB}; name a lower first database")
    return urlunsplit(parts._replace(path=f"/{first + worker}"))


REDIS_LAST_DB = 15  # Redis' default `databases 16`

# Test files that must run in one xdist worker, because they share a session-wide live service that takes many
# seconds to start (the fixture named): split across workers, each would start its own. Only those files: the
# rest of their folder (tests/kube's in-process door and workload tests, minutes of them) is free to go to
# another worker. pytest_collection_modifyitems refuses a test that uses the fixture from a file not listed.
SHARED_SERVICES = {"kube_service": ("tests/kube/test_kubectl.py", "tests/kube/test_workloads_kubectl.py",
                                   "tests/kube/test_kubectl_truth.py", "tests/kube/test_python_clients.py",
                                   "tests/kube/test_watch_server.py", "tests/kube/test_schemas_kubectl.py",
                                   "tests/kube/test_access_reviews.py", "tests/kube/test_taint_rules_kubectl.py",
                                   "tests/kube/test_server_side_apply_kubectl.py")}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: a file is one unit of work (module-scoped services start once), the files of
    one SHARED_SERVICES entry one unit together, and units are handed out in collection order (see
    pytest_collection_modifyitems) rather than by their number of tests."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.parallel import ServiceScheduling

    return ServiceScheduling(config, log, SHARED_SERVICES)


# The tiers (README, "Tests"): a test is **live** when it needs a real service, **pure** otherwise; **long** is a
# separate, explicit mark for full-budget and soak-style versions of tests whose reduced versions are in the
# default run. A test's tier follows from what it uses: the database (any pytest-django marker or fixture reaches
# django_db_setup), a real worker, broker, live server or browser (the fixtures below, directly or through other
# fixtures), or an explicit ``pytest.mark.live`` for a test that reaches a service some other way (a subprocess
# of its own, a socket). ``make test-fast`` runs ``-m pure`` with PostgreSQL and Redis pointed at a port where
# nothing listens, so a test that needs a service but is not marked so fails there instead of passing by luck.
LIVE_FIXTURES = frozenset({"django_db_setup", "browser", "worker_pool", "live_broker",
                           "live_server", "kube_service"})

PURE_LIBRARY_SUITES = ("tests/cel/", "tests/engine/")


def tier_of(item) -> str:
    if item.get_closest_marker("live") or item.get_closest_marker("django_db") or item.get_closest_marker("browser"):
        return "live"
    return "live" if LIVE_FIXTURES.intersection(getattr(item, "fixturenames", ())) else "pure"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers given here
def pytest_collection_modifyitems(config, items):
    """Every test gets its tier's marker (``-m pure`` / ``-m live`` select them). Under xdist, the files with slow
    tests first: a long file handed out last would keep one worker busy while the others idle. (A stable sort:
    within a file, and among fast files, the order is unchanged.)"""
    for item in items:
        if tier_of(item) == "live":
            if item.nodeid.startswith(PURE_LIBRARY_SUITES):
                raise pytest.UsageError(f"{item.nodeid} needs a service, but the pure library's suites "
                                        f"({', '.join(PURE_LIBRARY_SUITES)}) run with none: `dra/` is pure")
            item.add_marker(pytest.mark.live)
        elif not item.get_closest_marker("pure"):
            item.add_marker(pytest.mark.pure)
    shared_files = tuple(file for files in SHARED_SERVICES.values() for file in files)
    for item in items:
        for fixture, files in SHARED_SERVICES.items():
            if fixture in getattr(item, "fixturenames", ()) and not item.nodeid.startswith(files):
                raise pytest.UsageError(f"{item.nodeid} uses {fixture}: list its file in tests/conftest.py "
                                        "SHARED_SERVICES, so that xdist runs it in the worker that has the service")
    if xdist_worker_index(config) is None:
        return
    slow_files = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")}
    slow_files |= {item.nodeid.split("::", 1)[0] for item in items if item.nodeid.startswith(shared_files)}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow_files)


@pytest.fixture(scope="session")
def _require_postgresql():
    """The gate of the Django suites: they run against PostgreSQL, as production does."""
    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine and not os.environ.get("ALLOW_NON_POSTGRES_TESTS"):
        pytest.fail(f"The tests that use the database run against PostgreSQL (DATABASE_URL); got {engine}. "
                    "Use `make test`.", pytrace=False)


@pytest.fixture(scope="session")
def django_db_setup(_require_postgresql, django_db_setup):
    """pytest-django's test database, behind the PostgreSQL gate (only tests that use the database get here)."""
    post_migrate.connect(_restore_migration_rows, dispatch_uid="tests-restore-migration-rows")
    flush_command.sql_flush = _sql_flush_tables_with_rows
    yield
    flush_command.sql_flush = management_sql.sql_flush


# Each database test starts with empty tables (a rolled-back transaction, or a flush after a transactional
# test): changes no production database makes, and neither writes the change log that the per-process state
# follows (the rows in use, the fleet view, the engines built on them). Rows a rolled-back test allocated would
# stay "in use" on devices of the same names in the next test, so each live test starts that state afresh.
@pytest.fixture(autouse=True)
def _fresh_process_state(request):
    if request.node.get_closest_marker("live") is not None:
        from claims.services import engines, fleet

        fleet.invalidate(hard=True)
        fleet.reset_rows()
        engines.engines.reset()
    yield


def _sql_flush_tables_with_rows(style, connection, reset_sequences=True, allow_cascade=False):
    """Django's flush (a transactional test's teardown), truncating only the tables that have a row, with
    CASCADE (PostgreSQL refuses to truncate a table that an untruncated one references, even an empty one).
    The end is the same, every table empty; but a TRUNCATE costs by the table (new files for it and each of
    its indexes), and the whole schema's ~70 took 1-3 s after each of the suite's ~160 transactional tests
    where the dozen a test wrote take a fraction of that."""
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    if connection.vendor == "postgresql" and tables:
        with connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(
                f"SELECT %s WHERE EXISTS (SELECT 1 FROM {connection.ops.quote_name(table)})" for table in tables),
                tables)
            tables = [row[0] for row in cursor.fetchall()]
        allow_cascade = True
    return connection.ops.sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)


# The rows the data migrations create (the ``default`` queue, the fleet state singleton). A transactional test
# ends with a flush that empties every table; tests that run after it in the same process and read those rows
# would fail. A serial run hides this (pytest-django runs every transactional test last); an xdist worker, given
# whole files in turn, does not. Django's flush sends post_migrate: put the rows back then, with the migrations'
# own functions.
DATA_MIGRATIONS = {"queues": ("queues.migrations.0002_default_queue", "create_default"),
                   "claims": ("claims.migrations.0001_initial", "create_fleet_state")}


def _restore_migration_rows(sender, using="default", **kwargs):
    seed = DATA_MIGRATIONS.get(sender.label)
    if seed is not None:
        getattr(importlib.import_module(seed[0]), seed[1])(django_apps, None)


# ------------------------------------------------------------------------------------------ shared material

def shared_path(*parts: str) -> str:
    """A path inside the shared material (``../shared`` beside the repository)."""
    root = os.path.abspath(SHARED_LOCATION)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"shared material not found at {root}")
    return os.path.join(root, *parts)


def load_json(*parts: str):
    with open(os.path.join(*parts), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="session")
def shared_dir():
    try:
        return shared_path()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def cel_cases(shared_dir):
    """Upstream's CEL table (cel/compile_test.go, Kubernetes 1.35)."""
    return load_json(shared_dir, "conformance", "k8s-cel-cases.json")


@pytest.fixture(scope="session")
def allocator_cases(shared_dir):
    """Upstream's structured allocator table (Kubernetes 1.35)."""
    return load_json(shared_dir, "conformance", "k8s-allocator-cases.json")


def pytest_generate_tests(metafunc):
    """``@pytest.mark.vectors("conformance/k8s-cel-cases.json", select=..., xfail={name: reason})``: one test
    per vector (id: its name) in the argument ``case``, those ``select`` keeps, strict xfail where listed."""
    marker = metafunc.definition.get_closest_marker("vectors")
    if marker is None:
        return
    select = marker.kwargs.get("select") or (lambda case: True)
    xfail = marker.kwargs.get("xfail") or {}
    params = [pytest.param(case, id=case["name"],
                           marks=[pytest.mark.xfail(reason=xfail[case["name"]], strict=True)]
                           if case["name"] in xfail else [])
              for case in load_json(shared_path(), *marker.args[0].split("/")) if select(case)]
    metafunc.parametrize(marker.kwargs.get("argname", "case"), params)


# ------------------------------------------------------------------------------------- API clients (all suites)

def client_for(secret: str | None):
    """An API client that sends ``Authorization: Bearer <secret>`` (none without a secret)."""
    from rest_framework.test import APIClient

    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def admin_client(db):
    from draservice.models import APIToken
    from draservice.tokens import issue_token

    _, secret = issue_token(kind=APIToken.ADMIN, name="test admin")
    return client_for(secret)


@pytest.fixture
def ns_client(db):
    """``ns_client("team-a", read_only=False)``: a client holding a namespace token for those namespaces."""
    from draservice.models import APIToken
    from draservice.tokens import issue_token

    def make(*namespaces: str, read_only: bool = False):
        _, secret = issue_token(kind=APIToken.NAMESPACE, namespaces=list(namespaces), read_only=read_only)
        return client_for(secret)
    return make


# ------------------------------------------------------------------------- real Celery workers (claims, gangs)

@pytest.fixture(scope="module")
def worker_pool(request, django_db_setup, django_db_blocker):
    """Real Celery worker processes (module-wide; ``WORKERS`` in the module, default 1) on the test database
    and TEST_BROKER_URL's Redis."""
    from tests.claims.workers import WorkerPool

    url = os.environ.get("TEST_BROKER_URL")
    if not url:
        pytest.fail("TEST_BROKER_URL is not set (make test sets it): the worker tests need a real Redis")
    pool = WorkerPool(url, race=getattr(request.module, "RACE", False))
    with django_db_blocker.unblock():
        pool.start(getattr(request.module, "WORKERS", 1))
    yield pool
    pool.stop()


@pytest.fixture
def live_broker(worker_pool, settings):
    """This process enqueues to the real broker (as the web server does) instead of running tasks eagerly."""
    from draservice.celery import app

    keys = ("broker_url", "task_always_eager", "task_default_queue")
    saved = {k: app.conf[k] for k in keys}
    settings.CELERY_BROKER_URL = worker_pool.broker_url
    app.conf.update(broker_url=worker_pool.broker_url, task_always_eager=False,
                    task_default_queue=worker_pool.queue)
    _reset_celery_connections(app)
    from tests.claims.workers import reset_dispatch_state, wait_until_idle

    reset_dispatch_state(worker_pool.broker_url)
    yield worker_pool
    app.conf.update(saved)
    _reset_celery_connections(app)
    wait_until_idle(worker_pool.broker_url, worker_pool.queue)


def _reset_celery_connections(app):
    # Celery caches its connection and producer pools (in kombu's global registry) on first use; a changed
    # broker URL needs new ones.
    from kombu import pools

    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None


# ------------------------------------------------------------------------------------- the browser (all suites)
# One Chromium for the whole session: Playwright's sync API runs an event loop in this thread, and a second
# sync_playwright() in the same thread (another module's own browser fixture) fails.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install chromium) to run browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()
