"""The proxy bench's pure pieces: histogram quantiles and deltas, the kernel's connection table,
how a context's ending is classified, and targets that can fail. No worker processes."""

from __future__ import annotations

import math

import pytest

from bench.proxy import TARGETS, Ending, Histogram, client_ports, judge, parse_histogram, quantile, share_within, spread
from gpu_worker.metrics import WorkerMetrics

INF = math.inf


def test_quantile_interpolates_inside_the_bucket_like_histogram_quantile():
    buckets = [(0.001, 50.0), (0.005, 90.0), (0.01, 100.0), (INF, 100.0)]
    assert quantile(buckets, 0.5) == pytest.approx(0.001)
    assert quantile(buckets, 0.25) == pytest.approx(0.0005)  # half way through the first bucket, from 0
    assert quantile(buckets, 0.7) == pytest.approx(0.003)  # half way from 1 ms to 5 ms
    assert quantile(buckets, 0.99) == pytest.approx(0.0095)


def test_quantile_in_the_inf_bucket_is_the_highest_edge_and_empty_is_none():
    assert quantile([(0.001, 1.0), (INF, 10.0)], 0.99) == 0.001
    assert quantile([(0.001, 0.0), (INF, 0.0)], 0.5) is None
    assert quantile([], 0.5) is None


def test_share_within_is_exact_at_an_edge():
    buckets = [(0.001, 49.0), (0.005, 99.0), (INF, 100.0)]
    assert share_within(buckets, 0.001) == pytest.approx(0.49)
    assert share_within(buckets, 0.005) == pytest.approx(0.99)
    assert share_within(buckets, 0.0001) == 0.0
    assert share_within([], 0.001) is None


def test_the_relay_histogram_round_trips_through_the_worker_s_metrics_text():
    metrics = WorkerMetrics()
    before = parse_histogram(metrics.render().decode())
    assert before.count == 0 and before.buckets[0][0] == pytest.approx(0.00005)  # buckets reach down to 50 µs
    for seconds in (0.00004, 0.0004, 0.0004, 0.004):
        metrics.relay_seconds.observe(seconds)
    after = parse_histogram(metrics.render().decode())
    metrics.relay_seconds.observe(0.02)
    later = parse_histogram(metrics.render().decode()).since(after)
    assert after.since(before).count == 4 and after.mean == pytest.approx(0.00121)
    assert share_within(after.buckets, 0.001) == pytest.approx(0.75)
    assert later.count == 1 and later.mean == pytest.approx(0.02) and share_within(later.buckets, 0.005) == 0.0
    assert parse_histogram("", "nothing_here").count == 0


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
   3: 0100007F:C351 0100007F:1F90 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0
   4: 0100007F:D000 0100007F:1A0B 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0 20 4 30 10 -1
"""


def test_client_ports_sees_both_ends_and_time_wait_but_not_the_listener_or_other_ports():
    assert client_ports(TCP, 0x1F90) == {0xC350, 0xC351}
    assert client_ports(TCP, 0x1A0B) == {0xD000}
    assert client_ports(TCP, 1234) == set()


@pytest.mark.parametrize(("ending", "outcome"), [
    (Ending("done"), "done"),
    (Ending("error", "worker_lost", False), "worker_lost"),
    (Ending("error", "no_worker", True), "retryable"),
    (Ending("error", "internal", False), "lost"),
    (Ending("connection_lost"), "lost"),
    (Ending("timeout"), "lost"),
])
def test_endings_are_classified(ending, outcome):
    assert ending.outcome == outcome


def test_targets_can_fail_and_an_unmeasured_figure_fails():
    good = {"relay_added_ms_p50": 0.4, "relay_added_ms_p99": 4.9, "relay_chunks": 140,
            "handshakes_per_context_warm": 0.0, "failover_s": 1.2, "failed_after_failover": 0,
            "lost_audio_contexts": 0}
    assert judge(good) == dict.fromkeys(TARGETS, True)
    bad = {**good, "relay_added_ms_p50": 1.01, "relay_chunks": 40, "handshakes_per_context_warm": 0.1,
           "failover_s": None, "lost_audio_contexts": 1}
    met = judge(bad)
    assert [name for name, ok in met.items() if not ok] == ["relay_added_ms_p50", "relay_chunks",
                                                            "handshakes_per_context_warm", "failover_s",
                                                            "lost_audio_contexts"]
    assert not judge({**good, "relay_added_ms_p99": 5.01})["relay_added_ms_p99"]  # the tail target can fail


def test_spread():
    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert spread([]) is None
