"""The sizing arithmetic of benchmarks/bench_clients.py (docs/PERFORMANCE.md, *Sizing a
shard*): the handler's CPU split into parts per commit, per event and per delivery is
recovered from points made with known parts; the cost table's ratios are to the first row.
(Arithmetic only: no benchmark runs here.)"""
from __future__ import annotations

import pytest

from benchmarks.bench_clients import cost_table, sizing, sizing_text

COMMIT_CONSUMER, EVENT, COMMIT_LOOP, DELIVERY = 0.3e-3, 0.1e-3, 0.2e-3, 0.02e-3


def point(clients: int, views: int, events: int, commits: int) -> dict:
    deliveries = events * clients // views
    loop = commits * COMMIT_LOOP + deliveries * DELIVERY
    return {"clients": clients, "views": views, "events": events, "batches": commits,
            "deliveries": deliveries, "rate": 1000.0, "window_s": 30.0, "handler_idle_cpu": 0.0,
            "handler_cpu_s": commits * COMMIT_CONSUMER + events * EVENT + loop, "loop_cpu_s": loop,
            "loop_system_s": loop / 4, "handler_rss_mib": 100.0, "handler_peak_rss_mib": 110.0}


def test_the_fit_recovers_the_parts_and_the_table_gives_ratios_to_the_first_row():
    rows = [point(10, 10, 30_000, 27_000), point(100, 100, 30_000, 20_000), point(1000, 100, 30_000, 7_000)]
    fit = sizing(rows)
    assert fit["per_commit_ms"] == pytest.approx(1000 * (COMMIT_CONSUMER + COMMIT_LOOP))
    assert fit["per_event_ms"] == pytest.approx(1000 * EVENT)
    assert fit["per_delivery_ms"] == pytest.approx(1000 * DELIVERY)
    assert "one core, 10 clients following each event" in sizing_text(rows)
    last = cost_table(rows).splitlines()[-1]
    per_delivery = rows[2]["handler_cpu_s"] / 300_000 / (rows[0]["handler_cpu_s"] / 30_000)
    assert last.startswith("| 1,000 | 100 | 10 | 30,000 | 300,000 | 7,000 |")
    assert f"| {per_delivery:.2f}× |" in last


def test_points_that_do_not_vary_apart_give_no_fit():
    same = point(10, 10, 30_000, 27_000)
    assert sizing([same, dict(same)]) is None
    assert sizing([same]) is None
    assert sizing_text([same]).startswith("sizing: the rows do not differ")
