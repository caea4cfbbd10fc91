"""The burst bench: its pure accounting (served, refused, cut and failed answers; the worse voice
set's figure; a band target; failover net of the idle TTFB; signs of the Redis pool running out),
the process bookkeeping of its kill (a SIGKILLed parent's descendants found and seen alive), and
a small burst on the suite's session worker and gateway (capacity 8: bursts of 4, 8, 16 and 8
again over tara and leo), where every figure is computed. The kill itself needs a `voicering up`
of its own (two workers the suite cannot spare) and stays in `voicering bench burst`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest

from bench.burst import (AGAIN, BURST_TARGETS, Answer, Proc, count_redis_pool_lines, descendants, failover, headline,
                         in_flight_at, judge, measure, plan_kill, summarize, worst_in_band)


def served(voice: str = "v", at: float = 0.0, ttfb: float = 0.5, worker: str = "w0") -> Answer:
    return Answer(voice, at, at + 2.0, 200, at + ttfb, True, worker=worker, audio_bytes=100)


def refused(status: int = 503, code: str = "no_worker_available", retry_after: str | None = "1",
            message: str = "every worker that can speak this voice is busy; retry shortly") -> Answer:
    return Answer("v", 0.0, 0.1, status, 0.1, code=code, message=message, retry_after=retry_after)


def test_summarize_tells_served_refused_cut_and_failed_apart():
    answers = [served(), served(worker="w1"), refused(), refused(retry_after=None),
               Answer("v", 0.0, 1.0, 200, 0.4, False, code="RemoteProtocolError"),  # cut
               Answer("v", 0.0, 90.0, code="timeout")]  # failed
    figures = summarize(answers, capacity=4)
    assert (figures["requests"], figures["served"], figures["refused"], figures["cut"], figures["failed"]) == (6, 2, 2, 1, 1)
    assert figures["served_fraction"] == pytest.approx(2 / 6, abs=1e-4)
    assert figures["served_over_capacity"] == 0.5
    assert figures["refused_by"] == {"503 no_worker_available": 2}
    assert figures["refusals_without_retry_after"] == 1
    assert figures["failed_by"] == {"timeout": 1}
    assert figures["served_by"] == {"w0": 1, "w1": 1}
    assert figures["ttfb_ms_p50"] == 500.0 and figures["refusal_ms_p50"] == 100.0


def test_a_refusal_that_names_the_redis_pool_is_counted():
    pool = refused(code="unavailable", message="the tenant store (Redis) is unreachable (MaxConnectionsError); "
                                               "try again in a few seconds")
    busy = refused(code="gateway_busy", message="the gateway is busy: every one of its connections to the tenant "
                                                "store stayed in use; try again in a moment")
    assert summarize([pool, busy, refused()], capacity=2)["redis_pool_refusals"] == 2
    log = ("INFO gateway: hop=gateway outcome=completed\n"
           "WARNING request of tenant t1 not counted against its rate limit: the tenant store (Redis) is unreachable\n"
           "WARNING waited 0.2 s for a Redis connection from the connection pool\n")
    assert count_redis_pool_lines(log) == 2


def test_the_headline_is_the_worse_voice_set():
    def burst(fraction: float, over: float) -> dict:
        return {"served_fraction": fraction, "served_over_capacity": over}

    bursts = {"one_voice": {"0.5x": burst(1.0, 0.5), "1x": burst(0.6, 0.6), "2x": burst(0.4, 0.8), AGAIN: burst(0.9, 0.9)},
              "8_voices": {"0.5x": burst(0.9, 0.45), "1x": burst(1.0, 1.0), "2x": burst(0.55, 1.1), AGAIN: burst(1.0, 1.0)}}
    figures = headline(bursts)
    assert figures["served_fraction_at_half_capacity"] == 0.9
    assert figures["served_fraction_at_capacity"] == 0.6
    assert figures["second_burst_served_fraction_at_capacity"] == 0.9
    assert figures["served_over_capacity_at_double"] == 0.8  # 0.15 under the band beats 0.1 over it
    assert worst_in_band([0.97, 0.99], 0.95, 1.0) == 0.97 and worst_in_band([0.97, 1.2], 0.95, 1.0) == 1.2
    assert worst_in_band([0.97, None], 0.95, 1.0) is None


def test_targets_fail_when_the_figures_miss_them():
    good = {"served_fraction_at_half_capacity": 1.0, "served_fraction_at_capacity": 0.98,
            "served_over_capacity_at_double": 0.99, "refusals_without_retry_after": 0,
            "second_burst_served_fraction_at_capacity": 1.0, "redis_pool_refusals": 0}
    assert all(judge(good, BURST_TARGETS).values())
    for name, bad in (("served_fraction_at_half_capacity", 0.99), ("served_fraction_at_capacity", 0.9),
                      ("served_over_capacity_at_double", 1.05), ("served_over_capacity_at_double", 0.9),
                      ("refusals_without_retry_after", 1), ("second_burst_served_fraction_at_capacity", 0.5),
                      ("redis_pool_refusals", 2), ("served_fraction_at_capacity", None)):
        met = judge({**good, name: bad}, BURST_TARGETS)
        assert not met[name] and sum(met.values()) == len(BURST_TARGETS) - 1, (name, bad)


def test_failover_is_the_first_served_probe_net_of_the_idle_ttfb():
    kill = 100.0
    probes = [refused(), Answer("v", kill + 0.1, kill + 0.3, 503, kill + 0.3, code="no_worker_available", retry_after="1"),
              served(at=kill + 1.0, ttfb=0.6, worker="w1"), served(at=kill + 0.5, ttfb=1.5, worker="w1")]
    figures = failover(kill, probes, idle_ttfb_s=0.4)
    assert figures["served_again_after_kill_s"] == pytest.approx(1.6)  # the probe sent at +1.0, headers at +1.6
    assert figures["failover_s"] == pytest.approx(1.2)
    assert figures["first_served_probe_sent_s"] == pytest.approx(1.0) and figures["first_served_probe_worker"] == "w1"
    assert failover(kill, [refused()], idle_ttfb_s=0.4)["failover_s"] is None  # never served: the target fails
    assert failover(kill, probes, idle_ttfb_s=None)["failover_s"] is None


def test_failover_by_the_gateway_s_clock_excludes_the_probe_s_generation():
    """With Server-Timing, the time a worker took the probe (send + admit + place) counts, not its
    first audio: a probe taken at once whose generation is slow fails over at once."""
    kill = 100.0
    slow = Answer("v", kill + 0.2, kill + 9.0, 200, kill + 3.2, True, worker="w1", audio_bytes=100,
                  timing={"admit": 5.0, "place": 15.0, "worker": 2990.0})
    later = Answer("v", kill + 0.3, kill + 1.0, 200, kill + 0.8, True, worker="w1", audio_bytes=100,
                   timing={"admit": 5.0, "place": 500.0, "worker": 500.0})
    figures = failover(kill, [refused(), slow, later], idle_ttfb_s=0.4)
    assert figures["failover_s"] == pytest.approx(0.22)  # sent +0.2, admitted 5 ms, taken 15 ms later
    assert figures["first_served_probe_place_ms"] == 500.0  # the first whose headers came: `later`
    assert figures["probes_refused_after_served"] == 0
    assert failover(kill, [slow, Answer("v", kill + 0.5, kill + 0.6, 503, kill + 0.6, code="no_worker_available")],
                    idle_ttfb_s=0.4)["probes_refused_after_served"] == 1


def test_in_flight_streams_are_those_with_audio_and_no_end_at_the_kill():
    early, late = served(at=0.0, ttfb=0.5), served(at=5.0, ttfb=0.5)  # end at 2.0 and 7.0
    cut = Answer("v", 0.0, 4.0, 200, 1.0, False, code="RemoteProtocolError")
    assert in_flight_at([early, late, cut, refused()], 3.0) == [cut]


def test_the_kill_needs_two_voices_with_single_owners_on_different_workers():
    plan = plan_kill({"a": ["w0"], "b": ["w0", "w1"], "c": ["w0"], "d": ["w1"]}, ["w0", "w1"])
    assert (plan.victim, plan.victim_voice, plan.survivor, plan.survivor_voice) == ("w0", "a", "w1", "d")
    assert plan_kill({"a": ["w0"], "b": ["w0", "w1"]}, ["w0", "w1"]) is None


def test_descendants_of_a_sigkilled_parent_are_found_alive():
    """What the kill counts: the children of a process SIGKILLed outlive it (re-parented)."""
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        family = [Proc.of(pid) for pid in descendants(parent.pid)]
        assert len(family) == 2 and all(p is not None and p.alive for p in family)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(5)
        assert all(p.alive for p in family)  # orphans: what `killed_worker_descendants_alive` counts
        for p in family:
            p.kill()
        deadline = time.monotonic() + 5
        while any(p.alive for p in family) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(p.alive for p in family)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(parent.pid, signal.SIGKILL)


# -- a small burst on the suite's worker and gateway ------------------------------------------------

async def test_a_small_burst_on_the_session_worker_computes_every_figure(gateway, worker, new_tenant):
    _, key = await new_tenant(max_streams=64, requests_per_minute=100_000)
    capacity = int(worker.health()["max_streams"])  # 8
    voice_sets = {"2_voices": ("tara", "leo")}  # one worker owns every voice: a one-voice set would add nothing
    figures = await measure(gateway.url, key, [worker.http], voice_sets=voice_sets, second_after_s=1.0,
                            settle_s=0.2, max_tokens=15, gateway_log=gateway.log_path)
    assert figures["capacity"] == capacity
    assert set(figures["targets_met"]) == set(BURST_TARGETS)
    for name in BURST_TARGETS:
        assert figures[name] is not None, name
    assert 0 <= figures["served_fraction_at_capacity"] <= 1 and figures["served_over_capacity_at_double"] <= 2
    assert set(figures["bursts"]) == set(voice_sets)
    for per in figures["bursts"].values():
        assert set(per) == {"0.5x", "1x", "2x", AGAIN}
        for label, factor in (("0.5x", 0.5), ("1x", 1.0), ("2x", 2.0), (AGAIN, 1.0)):
            burst = per[label]
            assert burst["requests"] == round(factor * capacity)
            assert burst["served"] + burst["refused"] + burst["cut"] + burst["failed"] == burst["requests"], burst
            assert sum(burst["refused_by"].values()) == burst["refused"]
            assert burst["failed"] == 0, burst  # every request got an answer
    assert sum(b["served"] for per in figures["bursts"].values() for b in per.values()) > 0
