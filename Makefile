# The two commands a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# docs: the docs site into site/ (mkdocs build --strict; `make test` runs it through
# tests/packaging/test_docs_site.py); docs-serve
# previews it on http://127.0.0.1:8000
.PHONY: docs docs-serve demo test test-floors test-scripts soak soak-batches timings lint typecheck bench venv dist clean screenshots

$(BIN)/duetime: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/duetime

venv: $(BIN)/duetime

demo: venv
	$(BIN)/duetime demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/python .ci/typecheck.py
	@command -v chromedriver >/dev/null 2>&1 || echo "note: no chromium/chromedriver: the web console's \
	browser tests are skipped (apt-get install -y chromium chromium-driver to run them)"
	$(BIN)/python -m pytest -q -n 4 --dist loadfile $(PYTEST_ARGS)

# the fast lane: the tests that prove lua/ on Redis, Valkey and the in-memory backend, under a
# minute (docs/testing.md); `pytest -m scripts` adds the cluster, failover and worker-process ones
test-scripts: venv
	$(BIN)/python -m pytest -q -m "scripts and not slow" $(PYTEST_ARGS)

# the tests again with the latency bounds CI cannot promise on a loaded machine asserted too,
# and the tests CI runs smaller at their issues' sizes: 1,000 upsert rounds, 20 checkpoint
# kills, a 10,000-member batch (DUETIME_SOAK=1, docs/testing.md), for a quiet machine
SOAK_TESTS ?= tests/integration/test_failover.py \
	tests/integration/test_concurrent_upsert.py \
	tests/chaos/test_worker_faults.py::test_a_worker_cut_off_past_its_lease_tells_its_sync_task_the_lease_is_lost \
	tests/workloads/test_checkpoints.py::test_an_iteration_killed_again_and_again_redoes_nothing_before_its_last_checkpoint \
	tests/workloads/test_batches.py::test_a_big_batch_with_random_failures_drained_by_two_workers
soak: venv
	DUETIME_SOAK=1 $(BIN)/python -m pytest -q $(SOAK_TESTS) $(PYTEST_ARGS)

# the suite once as `make test` runs it, writing how long each file took to tests/timings.txt
# (`make test` starts the longest first: tests/timing.py); commit it when the order changed much
timings: venv
	DUETIME_RECORD_TIMINGS=tests/timings.txt $(BIN)/python -m pytest -q -n 4 --dist loadfile $(PYTEST_ARGS)

# the batch chaos test at the issue's size: one batch of 10,000 members (200 of them added by
# members with batch_add), 10% failing, workers SIGKILLed every 2-4 s; ~1 min, exit 1 when a
# check failed (tests/workloads/batch_chaos_kit.py; result in bench/RESULTS.md)
soak-batches: venv
	$(BIN)/python -m bench.batches --chaos

# The declared lower bounds are true: one fresh venv with every dependency at the lowest
# version pyproject.toml allows (constraints/floors.txt), duetime installed there, and the fast
# lane run in it (pip's cache keeps this to a few seconds after the first time), with the
# asyncio connection's own read and write paths (they override redis-py's). The outbox's
# tests run here but its worker-process one and its CLI error line (`duetime worker` at the
# structlog and click floors does not start, and an error exit of any command fails on
# click 8.1.0: floors of the core dependencies to raise, outside the outbox extra).
FLOORS_VENV := .venv-floors
FLOORS_TESTS ?= tests/unit tests/integration/test_scripts.py tests/client/test_reload.py \
	tests/integration/test_connection_reads.py tests/integration/test_connection_writes.py \
	tests/property/test_calendars.py tests/integration/test_calendars.py \
	tests/integrations/test_otel.py tests/integrations/test_sentry.py \
	tests/outbox \
	tests/packaging/test_floors.py::test_floors_match_pyproject \
	tests/packaging/test_floors.py::test_floored_extras_are_pinned_and_installed
test-floors:
	$(PY) -m venv --clear $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/pip install -q -c constraints/floors.txt -e '.[embedded,testing,calendars,docs,dev,otel,sentry,outbox]' 'pytest>=8' 'hypothesis>=6.100'
	$(FLOORS_VENV)/bin/python -m pip check
	$(FLOORS_VENV)/bin/python -m pytest -q -p no:cacheprovider $(FLOORS_TESTS)
	NO_MKDOCS_2_WARNING=1 $(FLOORS_VENV)/bin/mkdocs build --strict -d .cache/site-floors

# the README's pictures of the web console, taken by its browser tests (needs chromium)
screenshots: venv
	DUETIME_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/web/test_browser.py

docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

lint: venv
	$(BIN)/ruff check .

# mypy --strict on duetime/, common/, worker/, scheduler/ as one installed package (see the script)
typecheck: venv
	$(BIN)/python .ci/typecheck.py

# duetime's own burst benchmark; the others (precision, schedules, script_cost, peers_run) are
# listed with their arguments at the top of each bench/*.py
bench: venv
	$(BIN)/python -m bench.throughput --runs 20000 --repeat 3

# the wheel users install (tests/packaging/test_wheel.py installs one into a fresh venv)
dist: venv
	rm -rf dist
	$(BIN)/pip wheel --no-deps -q -w dist .

clean:
	rm -rf $(VENV) $(FLOORS_VENV) *.egg-info build dist
