"""The fleet bench: its pure accounting (a request served outside its voice's owners is a spill, a
placed request a worker relayed is a needless hop, targets that can fail), and a short run on
the suite's three real workers (the session worker A plus B and C here) through two gateways'
pools, where no placed request is relayed and none is lost."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.fleet import (TARGETS, Outcome, busiest_over_mean, judge, measure, publish_voices, rejected_counts, tally,
                         worker_env, zipf_weights)
from bench.proxy import Ending
from tests.fixtures.models import CLUSTER_PREFIX, cluster_args, start_worker, stop_workers

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


# -- a short run on real processes ------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet(request, stand_in, adapter_store, redis_server, tmp_path_factory):
    """The session worker A and B, C of this module: three, the suite's limit (B and C start while A does)."""
    publish_voices(adapter_store / "tara", adapter_store)
    logs = tmp_path_factory.mktemp("fleet")

    def start(wid: str):
        return start_worker(stand_in, adapter_store, logs / f"{wid}.log", "--max-loras", "2", "--max-streams", "8",
                            *cluster_args(redis_server.url, wid), env=worker_env(CLUSTER_PREFIX))

    with ThreadPoolExecutor(2) as threads:
        futures = [threads.submit(start, wid) for wid in ("worker-b", "worker-c")]
        try:
            a = request.getfixturevalue("worker")
            b, c = (f.result() for f in futures)
        except BaseException:
            for f in futures:
                with contextlib.suppress(Exception):
                    f.result().stop()
            raise
    yield {"worker-a": a, "worker-b": b, "worker-c": c}
    stop_workers(b, c)


async def test_a_short_fleet_run_relays_no_placed_request_and_loses_none(fleet, redis_server):
    figures = await measure(fleet, redis_server.url, CLUSTER_PREFIX, run_s=15.0, warmup_s=2.0, streams=6)
    for key in ("requests", "needless_hops", "spill_fraction", "pool_spill_fraction", "busiest_over_mean",
                "refusals_per_request", "insisted_per_request", "worker_refusals_per_request", "lost_contexts",
                "hot_voice_replicas_start", "hot_voice_replicas_end", "adapter_loads_per_1000", "targets_met"):
        assert key in figures, key
    assert set(figures["targets_met"]) == set(TARGETS)
    assert figures["requests"] > 0 and figures["served"] > 0
    assert figures["needless_hops"] == 0 and figures["warmup_needless_hops"] == 0, figures
    assert figures["lost_contexts"] == 0 and figures["warmup_lost_contexts"] == 0, figures
    assert set(figures["served_by"]) <= set(fleet)
