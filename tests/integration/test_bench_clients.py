"""The many-clients benchmark (benchmarks/bench_clients.py), tiny, against real services:
clients in two processes register, list and follow their views by stream while paced
events arrive; every client sees every event of its view, without an error. (It checks
that the load generator works, not how fast: no timings are asserted.)"""
from __future__ import annotations

import pytest

from benchmarks.bench_clients import cost_table, run_point
from delvefs.shared.s3 import presigned_list_url
from eventhandler.devtools import HandlerProcess, Publisher

pytestmark = pytest.mark.services


def test_clients_follow_their_views_and_see_every_event(services, service_env, s3, bucket, tmp_path):
    h = HandlerProcess(service_env, tmp_path / "state", token="bench")
    h.start()
    try:
        # 6 clients over 3 views: each event reaches the 2 clients of its view
        row = run_point(services.rabbit.url, h, bucket, presigned_list_url(s3, bucket), 6,
                        views=3, rate=40, seconds=2, processes=2, tag="smoke")
    finally:
        h.close()
        pub = Publisher(services.rabbit.url)
        pub.delete_queue(h.queue)
        pub.close()
    assert (row["errors"], row["error_samples"], row["missing"]) == (0, [], 0)
    assert row["events"] == 80 and row["pairs"] == 2 * 80
    assert row["handler_cpu_s"] >= 0 and row["handler_rss_mib"] > 0
    # the sizing columns: deliveries are events × the clients of their view
    assert row["deliveries"] == 2 * 80 and row["loop_cpu_s"] >= 0 and row["handler_idle_cpu"] >= 0
    assert "| 6 | 3 | 2 | 80 | 160 |" in cost_table([row])
