# The two commands of the README. Both bootstrap first (idempotent, see scripts/bootstrap.sh).
.PHONY: demo test bootstrap unit services clean test-clean-bootstrap

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

# The README's promise, proven in a fresh Debian 12 root file system (root; ~10 minutes;
# not part of `make test`). SOURCE=worktree tests the working tree instead of HEAD.
test-clean-bootstrap:
	./scripts/test-clean-bootstrap.sh

clean:
	rm -rf build *.egg-info rulesets/_native*.so
