# The two README commands: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint clean

$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

demo: $(VENV)/.demo-installed
	rm -f demo.sqlite3 demo.sqlite3-wal demo.sqlite3-shm
	DBQUEUE_DB=sqlite $(PY) manage.py migrate --noinput -v0
	DBQUEUE_DB=sqlite $(PY) manage.py enqueue_demo --count 5000
	DBQUEUE_DB=sqlite $(PY) manage.py run_jobs --burst --concurrency 2 --progress-interval 0.5

test:
	bash scripts/test.sh

lint:
	bash scripts/test.sh --lint-only

clean:
	rm -rf $(VENV) .venv-demo* .nox .coverage-data demo.sqlite3* demo-queue.sqlite3* .test-db*.sqlite3* .test_dbq_*.sqlite3* .pytest_cache .mypy_cache .ruff_cache
