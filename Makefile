# Two commands for a fresh machine:  `make run`  and  `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PORT ?= 8000
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/draservice
# The first of the suite's Redis databases: xdist worker gwN uses the Nth after it (tests/conftest.py).
TEST_BROKER_URL ?= redis://127.0.0.1:6379/12
# pytest-xdist processes: the suite mostly waits on live services (gunicorn, Celery, kubectl, Chromium), so two
# overlap well even on two cores. TEST_WORKERS=0 runs it serially in one process.
TEST_WORKERS ?= 2

.PHONY: run test venv bench clean

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

## run: the service with its demo fleet on the embedded default (SQLite, tasks in-process) at http://127.0.0.1:$(PORT)/
run: venv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py serve --demo --port $(PORT)

## test: ruff, mypy, then the whole suite (with coverage, in TEST_WORKERS parallel processes) against the machine's real PostgreSQL and Redis (and Debian Chromium for browser tests)
test: venv
	./scripts/ensure-services.sh
	./scripts/ensure-chromium.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	DATABASE_URL=$(TEST_DATABASE_URL) TEST_BROKER_URL=$(TEST_BROKER_URL) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --cov --cov-report=term $(PYTEST_ARGS)

bench: venv
	./scripts/ensure-services.sh
	# soak_bench.py runs for a long time by design (--minutes 10 and more): run it on its own.
	for b in benchmarks/[!_]*.py; do [ "$$b" = benchmarks/soak_bench.py ] || DATABASE_URL=$(TEST_DATABASE_URL) $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var staticfiles
