"""Dashboard tests: real PostgreSQL, the real demo fleet and claims made through the claims services, and for
the ``browser`` tests the real pages in headless Debian Chromium (Playwright, explicit executable path)."""
import os

import pytest

# Playwright's sync API runs an asyncio loop in this thread; Django then refuses synchronous ORM calls from it
# (SynchronousOnlyOperation) although nothing here is async. The tests' own DB work is plain sync code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def fresh_overview_tallies(monkeypatch):
    """The overview's tallies live per process and follow the database's own records of change (row ids, the
    change log). A test database flushed between tests (TRUNCATE, no triggers) is a change no production
    database makes: each test starts with tallies that have seen nothing."""
    from claims.services.figures import fleet
    from claims.services.figures.claim_tally import ClaimTally
    from claims.services.figures.fleet_tally import FleetTally

    monkeypatch.setattr(fleet, "_claims", ClaimTally())
    monkeypatch.setattr(fleet, "_tally", FleetTally())


@pytest.fixture
def page(browser):
    # A laptop screen: the layout must work at this size.
    context = browser.new_context(viewport={"width": 1366, "height": 800})
    context.set_default_timeout(15_000)
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def people(django_user_model):
    """An operator (staff) and a read-only viewer."""
    ops = django_user_model.objects.create_user("ops", "ops@example.com", PASSWORD, is_staff=True)
    viewer = django_user_model.objects.create_user("viewer", "viewer@example.com", PASSWORD)
    return {"ops": ops, "viewer": viewer}


@pytest.fixture
def demo():
    """The demo fleet (24 nodes over the demo clusters) plus the demo workload (see frontend.demo)."""
    from frontend import demo as demo_mod

    demo_mod.load_fleet(nodes=24)
    return demo_mod.build_workload()


def login(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
