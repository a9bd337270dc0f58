# The two commands of the README. Both bootstrap first (idempotent, see scripts/bootstrap.sh).
.PHONY: demo test bootstrap unit services clean

PY := .venv/bin/python

bootstrap:
	./scripts/bootstrap.sh

demo: bootstrap
	$(PY) -m delvefs.devtools.demo

test: bootstrap
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# Faster loops for developers.
unit: bootstrap
	$(PY) -m pytest -ra tests/unit tests/core

services: bootstrap
	$(PY) -m delvefs.devtools.localservices

# Benchmarks are run one by one: docs/PERFORMANCE.md lists their commands.

clean:
	rm -rf build *.egg-info rulesets/_native*.so
