"""The fleet bench's pure accounting: a request served outside its voice's owners is a spill, a
placed request a worker relayed is a needless hop, targets that can fail. Its short run on three
real workers is in tests/gpu_worker/test_cluster.py, on that module's workers (started once)."""

from __future__ import annotations

import pytest

from bench.fleet import TARGETS, Outcome, busiest_over_mean, judge, rejected_counts, tally, zipf_weights
from bench.proxy import Ending

DONE = Ending("done")


def served(served_by: str, owners: set[str], *, sent_to: str | None = None, proxied: bool = False) -> Outcome:
    return Outcome("v", DONE, sent_to or served_by, served_by, proxied, frozenset(owners))


def test_a_request_served_outside_its_owners_is_a_spill():
    assert served("worker-c", {"worker-a", "worker-b"}).spilled
    assert not served("worker-b", {"worker-a", "worker-b"}).spilled
    assert not Outcome("v", Ending("error", "no_worker", True), owners=frozenset({"worker-a"})).spilled  # never served


def test_a_placed_request_that_was_relayed_is_a_needless_hop():
    assert served("worker-b", {"worker-b"}, sent_to="worker-a", proxied=True).needless_hop
    assert served("worker-b", {"worker-b"}, sent_to="worker-a").needless_hop  # served elsewhere than it was sent
    assert not served("worker-a", {"worker-b"}).needless_hop  # a spill, served where the pool sent it: no hop


def test_tally_counts_spills_hops_and_lost_contexts():
    outcomes = [
        served("worker-a", {"worker-a"}),
        served("worker-c", {"worker-a"}),  # spill
        served("worker-b", {"worker-b"}, sent_to="worker-a", proxied=True),  # needless hop
        Outcome("v", Ending("error", "no_worker", True)),  # retryable: not lost
        Outcome("v", Ending("timeout")),  # lost
        Outcome("v", Ending("error", "internal", False)),  # lost
    ]
    figures = tally(outcomes)
    assert figures["requests"] == 6 and figures["served"] == 3
    assert figures["spills"] == 1 and figures["spill_fraction"] == pytest.approx(1 / 3, abs=1e-4)
    assert figures["needless_hops"] == 1
    assert figures["lost_contexts"] == 2 and figures["retryable_failures"] == 1
    assert figures["served_by"] == {"worker-a": 1, "worker-b": 1, "worker-c": 1}


def test_targets_fail_when_the_figures_miss_them():
    good = {"needless_hops": 0, "spill_fraction": 0.01, "lost_contexts": 0, "hot_voice_replicas_end": 3}
    assert all(judge(good, TARGETS).values())
    for name, bad in (("needless_hops", 1), ("spill_fraction", 0.06), ("lost_contexts", 1),
                      ("hot_voice_replicas_end", 1), ("spill_fraction", None)):
        met = judge({**good, name: bad}, TARGETS)
        assert not met[name] and sum(met.values()) == len(TARGETS) - 1


def test_busiest_over_mean_skips_idle_samples():
    assert busiest_over_mean([[0, 0, 0], [2, 2, 2], [4, 1, 1]]) == (1.5, 2.0)
    assert busiest_over_mean([[0, 0, 0]]) == (None, None)


def test_zipf_weights_make_a_few_voices_hot():
    weights = zipf_weights(32)
    assert sum(weights) == pytest.approx(1.0)
    assert weights == sorted(weights, reverse=True) and 0.2 < weights[0] < 0.3 and sum(weights[:3]) > 0.4


def test_rejected_counts_read_the_worker_metric_by_reason():
    from gpu_worker.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.rejected.labels("busy").inc(3)
    metrics.rejected.labels("connection_limit").inc()
    assert rejected_counts(metrics.render().decode()) == {"busy": 3.0, "connection_limit": 1.0}
