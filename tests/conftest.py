"""Fixtures shared by all test tiers.

Services are real (delvefs.devtools.localservices). When one cannot start, the test is
skipped on a developer machine but FAILS when ``CI`` is set: CI must never turn
green by skipping what it was meant to check.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from delvefs.devtools.localservices import LocalServices, ServiceError

IN_CI = bool(os.environ.get("CI"))

# Node ids measured slow (scripts/slow_tests.py, `make slow-tests`): marked `slow` here, so
# that no test body carries a timing. An id without its [parameters] marks every case.
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def _slow_test_ids() -> frozenset[str]:
    try:
        lines = SLOW_TESTS.read_text().splitlines()
    except FileNotFoundError:
        return frozenset()
    return frozenset(filter(None, (line.split("#", 1)[0].strip() for line in lines)))


def pytest_collection_modifyitems(config, items):
    slow = _slow_test_ids()
    for item in items:
        if item.nodeid in slow or item.nodeid.split("[", 1)[0] in slow:
            item.add_marker(pytest.mark.slow)


def service_unavailable(message: str):
    if IN_CI:
        pytest.fail(f"service unavailable in CI: {message}", pytrace=False)
    pytest.skip(f"service unavailable: {message}")


def _start_services(base: Path, **kwargs) -> LocalServices:
    services = LocalServices(base, **kwargs)
    try:
        return services.__enter__()
    except (ServiceError, OSError) as exc:
        services.__exit__(None, None, None)
        service_unavailable(str(exc))


@pytest.fixture(scope="session")
def services(tmp_path_factory):
    """MinIO + RabbitMQ shared by the session's tests (use a unique bucket per test)."""
    svc = _start_services(tmp_path_factory.mktemp("services"))
    yield svc
    svc.__exit__(None, None, None)


@pytest.fixture
def private_services(tmp_path_factory):
    """Factory of services owned by one test (for tests that stop or restart them)."""
    started = []

    def start(**kwargs) -> LocalServices:
        svc = _start_services(tmp_path_factory.mktemp("private-services"), **kwargs)
        started.append(svc)
        return svc

    yield start
    for svc in reversed(started):
        svc.__exit__(None, None, None)


@pytest.fixture
def service_env(services, monkeypatch):
    """The process environment pointed at the shared services."""
    for key, value in services.env().items():
        monkeypatch.setenv(key, value)
    return services.env()


@pytest.fixture
def s3(service_env):
    from delvefs.shared.s3 import make_client
    return make_client()


@pytest.fixture
def bucket(s3, services):
    """A fresh bucket with notifications wired to the broker."""
    from delvefs.shared.s3 import ensure_bucket, wire_notifications
    name = f"t-{uuid.uuid4().hex[:12]}"
    ensure_bucket(s3, name)
    wire_notifications(s3, name, services.minio.notify_arn)
    return name
