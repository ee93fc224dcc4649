# Two commands for a fresh machine:  `make run`  and  `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PORT ?= 8000
# make run's HTTPS (for kubectl, which sends its token only over TLS), beside plain HTTP on PORT
HTTPS_PORT ?= $(shell expr $(PORT) + 443)
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/draservice
# The first of the suite's Redis databases: xdist worker gwN uses the Nth after it (tests/conftest.py).
TEST_BROKER_URL ?= redis://127.0.0.1:6379/12
# pytest-xdist processes: the suite mostly waits on live services (gunicorn, Celery, kubectl, Chromium), so two
# overlap well even on two cores. TEST_WORKERS=0 runs it serially in one process.
TEST_WORKERS ?= 2

.PHONY: run test test-fast test-long coverage venv bench clean

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	# The newest official Python client, apart from the pinned one (tests/kube/test_python_clients.py)
	$(VENV)/bin/pip install -q --target $(VENV)/kubernetes37 'kubernetes==37.*'
	touch $@

venv: $(VENV)/.installed

## run: the service with its demo fleet on the embedded default (SQLite, tasks in-process) at http://127.0.0.1:$(PORT)/
## and https://127.0.0.1:$(HTTPS_PORT)/ (self-signed; var/kubeconfig is an admin's kubeconfig for kubectl there)
run: venv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py serve --demo --port $(PORT) --https-port $(HTTPS_PORT)

# The tiers (README, "Tests and benchmarks"). pure: no service at all, run with PostgreSQL and Redis pointed at a
# port where nothing listens, so that a test reaching for one fails instead of passing by luck. live: real
# PostgreSQL, Redis, Celery workers, gunicorn, kubectl, Chromium. long: full budgets and soak-style scenarios
# (never in `make test`). A test's tier follows from what it uses (tests/conftest.py). PYTEST_ARGS narrows any of
# them (a file, -k); a tier left with no test then counts as passed (pytest's exit 5).
NOWHERE := DATABASE_URL=postgresql://nobody@127.0.0.1:1/none CELERY_BROKER_URL=redis://127.0.0.1:1/0 TEST_BROKER_URL=
LIVE := DATABASE_URL=$(TEST_DATABASE_URL) TEST_BROKER_URL=$(TEST_BROKER_URL)
XDIST := -n $(TEST_WORKERS) --dist loadfile

## test-fast: the pure tier (engine, CEL, doctor, config and architecture checks): no PostgreSQL, no Redis, < 1 minute
test-fast: venv
	$(NOWHERE) $(PY) -m pytest -m "pure and not long" $(XDIST) $(PYTEST_ARGS) || [ $$? = 5 ]

## test: ruff, mypy, the import layers (lint-imports), then the pure tier and the live tier (what CI runs: .ci/run)
test: venv
	./scripts/ensure-services.sh
	./scripts/ensure-chromium.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(NOWHERE) $(PY) -m pytest -m "pure and not long" $(XDIST) -q $(PYTEST_ARGS) || [ $$? = 5 ]
	$(LIVE) $(PY) -m pytest -m "live and not long" $(XDIST) $(PYTEST_ARGS) || [ $$? = 5 ]

## test-long: the long tier (schemathesis' long budget, soak-style scenarios) against the live services
test-long: venv
	./scripts/ensure-services.sh
	./scripts/ensure-chromium.sh
	$(LIVE) $(PY) -m pytest -m long $(XDIST) $(PYTEST_ARGS)

## coverage: the pure and live tiers under coverage (the product's packages, in the test processes); slower
coverage: venv
	./scripts/ensure-services.sh
	./scripts/ensure-chromium.sh
	$(NOWHERE) $(PY) -m pytest -m "pure and not long" $(XDIST) -q --cov --cov-report= $(PYTEST_ARGS)
	$(LIVE) $(PY) -m pytest -m "live and not long" $(XDIST) --cov --cov-append --cov-report=term $(PYTEST_ARGS)

bench: venv
	./scripts/ensure-services.sh
	# soak_bench.py and replay_bench.py run for a long time by design (10 minutes, 2 hours): run them on their own.
	for b in benchmarks/[!_]*.py; do case "$$b" in benchmarks/soak_bench.py|benchmarks/replay_bench.py) continue;; esac; DATABASE_URL=$(TEST_DATABASE_URL) $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var staticfiles
