# The two commands of the README. Both bootstrap first (idempotent, see scripts/bootstrap.sh).
.PHONY: demo test bootstrap unit services services-tests faults-tests slow-tests clean test-clean-bootstrap

PY := .venv/bin/python

bootstrap:
	./scripts/bootstrap.sh

demo: bootstrap
	$(PY) -m delvefs.devtools.demo

# WORKERS pytest-xdist processes share the tests (--dist worksteal), each starting its own
# MinIO and RabbitMQ (the session fixtures are per process): the CPU-bound unit and core
# tests fill the time the services tests spend waiting for processes. WORKERS=0 runs every
# test in this process, one by one.
WORKERS ?= 2
XDIST = -n $(WORKERS) $(if $(filter 0,$(WORKERS)),,--dist worksteal)

test: bootstrap
	$(PY) -m pytest -ra $(XDIST) $(PYTEST_ARGS)

# The tiers without services (tests/unit, tests/core): CI's first step, about a minute.
unit: bootstrap
	$(PY) -m pytest -ra tests/unit tests/core $(XDIST) $(PYTEST_ARGS)

# Everything `make unit` leaves out: real MinIO/RabbitMQ, handlers and FUSE mounts (CI's
# second step). `PYTEST_ARGS='-m "not slow"'` leaves out the tests of tests/slow_tests.txt.
SERVICES_TIERS := tests --ignore=tests/unit --ignore=tests/core
services-tests: bootstrap
	$(PY) -m pytest -ra $(SERVICES_TIERS) $(XDIST) $(PYTEST_ARGS)

# The fault tier alone (part of services-tests): the object store, the broker and the handler
# killed, stopped and slowed under writes, a small cache disk filled (docs/OPERATIONS.md).
faults-tests: bootstrap
	$(PY) -m pytest -ra tests/faults $(XDIST) $(PYTEST_ARGS)

# Re-measure which tests are slow: the services tiers one by one with every duration into
# build/durations.txt (15-25 minutes), then tests/slow_tests.txt from it (5 s or more).
# DURATIONS=report.txt skips the run and uses that pytest --durations=0 output instead.
slow-tests: bootstrap
	@if [ -z "$(DURATIONS)" ]; then mkdir -p build; \
	  $(PY) -m pytest -ra $(SERVICES_TIERS) -n 0 --durations=0 $(PYTEST_ARGS) | tee build/durations.txt; fi
	$(PY) scripts/slow_tests.py $(or $(DURATIONS),build/durations.txt) --write

services: bootstrap
	$(PY) -m delvefs.devtools.localservices

# Benchmarks are run one by one: docs/PERFORMANCE.md lists their commands.

# The README's promise, proven in a fresh Debian 12 root file system (root; ~10 minutes;
# not part of `make test`). SOURCE=worktree tests the working tree instead of HEAD.
test-clean-bootstrap:
	./scripts/test-clean-bootstrap.sh

clean:
	rm -rf build *.egg-info rulesets/_native*.so
