"""The routing rule the pool runs (`hashring.choice`, pure) and replica sizing by load share
(`hashring.sizing`, pure)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from hashring.choice import OwnLoad, order
from hashring.ring import Ring
from hashring.settings import RingSettings
from hashring.sizing import FleetLoad, next_replicas, replicas_for, warm_rate

NODES = [f"w{i}" for i in range(8)]
RING = Ring(NODES, vnodes=64)
WEIGHT = dict.fromkeys(NODES, 1.0)
CAP = dict.fromkeys(NODES, 32.0)


def candidates(owners, estimate, *, rng, exclude=(), bound=100.0, capacity=CAP):
    return list(order(owners, lambda: RING.owners("v", len(NODES)), estimate, weight=WEIGHT, capacity=capacity,
                      bound_per_weight=bound, rng=rng, exclude=exclude))


def test_two_choices_spread_equal_stale_loads_over_the_owners():
    owners = RING.owners("v", 4)
    firsts = Counter(candidates(owners, {}, rng=random.Random(seed))[0] for seed in range(200))
    assert set(firsts) == set(owners) and min(firsts.values()) > 20  # no herd onto owners[0]


def test_the_lower_estimate_of_the_two_wins_and_owners_come_before_successors():
    owners = RING.owners("v", 3)
    busy, idle = owners[0], owners[1]
    for seed in range(50):
        got = candidates(owners, {busy: 9, owners[2]: 9}, rng=random.Random(seed))
        assert got[0] != busy or idle not in got[:2]  # the pair is ordered by estimate
        assert set(got[:3]) == set(owners) and set(got) == set(NODES)
    assert candidates(owners, {busy: 9, owners[2]: 9}, rng=random.Random(0), exclude={idle})[0] != idle


def test_c_orders_owners_but_never_sends_a_request_past_them():
    owners = RING.owners("v", 2)
    got = candidates(owners, {owners[0]: 30, owners[1]: 30}, rng=random.Random(1), bound=2.0)
    assert set(got[:2]) == set(owners)  # over c × the mean by estimate: still the owners first


def test_owners_full_by_estimate_go_last_not_out():
    owners = RING.owners("v", 2)
    got = candidates(owners, {owners[0]: 32, owners[1]: 32}, rng=random.Random(1))
    assert set(got[-2:]) == set(owners) and got[0] not in owners


def test_own_load_brings_an_old_report_up_to_now():
    own = OwnLoad(horizon_s=10)
    own.note("a", 1.0, 1)
    own.note("a", 2.0, 2)
    own.note("a", 3.0, 1)  # one closed
    assert own.since("a", 0.5) == 1  # reported before both opens: +2 -1
    assert own.since("a", 2.5) == -1  # reported after both opens: one closed since
    assert own.since("b", 0.0) == 0
    own.note("a", 20.0, 5)  # the old samples go, the latest before the horizon stays
    assert own.at("a", 0.0) == 1 and own.since("a", 15.0) == 4


def test_at_most_owner_tries_owners_then_the_successors():
    owners = RING.owners("v", 6)
    for seed in range(20):
        got = list(order(owners, lambda: RING.owners("v", len(NODES)), {}, weight=WEIGHT, capacity=CAP,
                         bound_per_weight=100.0, rng=random.Random(seed), owner_tries=3))
        assert len(got) == 3 + 2 and set(got[:3]) <= set(owners)  # three owners, then the two non-owners
        assert got[3:] == [w for w in RING.owners("v", len(NODES)) if w not in owners]
    got = candidates(owners, {}, rng=random.Random(0))  # no bound: every owner
    assert set(got[:6]) == set(owners)


def test_a_load_on_an_answer_replaces_an_older_heartbeat_and_yields_to_a_newer_one():
    own = OwnLoad(horizon_s=10)
    own.note("a", 1.0, 1)
    assert own.estimate("a", 0.5, 4) == 5  # heartbeat before our open: 4 + 1
    own.answered("a", 2.0, 9, 1)  # the worker said 9 (ours included) at 2.0
    assert own.estimate("a", 0.5, 4) == 9
    own.note("a", 3.0, 3)  # two more of ours since the answer
    assert own.estimate("a", 0.5, 4) == 11
    assert own.estimate("a", 2.5, 2) == 2 + 2  # a heartbeat newer than the answer wins
    own.note("a", 4.0, 0)
    assert own.estimate("b", 0.0, 0) == 0 and own.estimate("a", 3.5, 0) == 0  # never below zero


S = RingSettings()


def test_replicas_follow_the_measured_load_share_with_headroom():
    # 64 workers, 16 streams each, 256 req/s: Little's law gives 4 s streams; one replica carries
    # 0.375 × 16 = 6 streams = 1.5 req/s of a voice.
    fleet = FleetLoad(workers=64, streams=1024, rate=256)
    assert fleet.mean_stream_s == pytest.approx(4.0) and fleet.mean_streams_per_worker == 16
    assert replicas_for(1.4, fleet, S) == 1
    assert replicas_for(1.6, fleet, S) == 2
    assert replicas_for(0.15 * 256, fleet, S) == 26  # the top Zipf voice: no cap of 8
    assert replicas_for(1000, fleet, S) == 64  # never more than the live workers
    assert warm_rate(fleet, S) == pytest.approx(1.5)
    # measured, not assumed: the same 6 req/s where the fleet's streams last 8 s needs twice the replicas
    assert replicas_for(6.0, fleet, S) == 4
    assert replicas_for(6.0, FleetLoad(64, 1024, 128), S) == 8


def test_replicas_stay_one_when_nothing_is_measured_or_the_fleet_is_nearly_idle():
    assert replicas_for(5.0, FleetLoad(4, 0, 5.0), S) == 1  # no streams reported yet
    assert replicas_for(5.0, FleetLoad(4, 3, 0.0), S) == 1  # no request rate yet
    assert replicas_for(0.4, FleetLoad(4, 1, 0.5), S) == 1  # under one stream of this voice


def test_next_replicas_rises_fast_on_spill_and_falls_only_with_hysteresis():
    assert next_replicas(2, fast=5, slow_cooled=1, spilled=False, may_lower=True, limit=8) == 5
    assert next_replicas(2, fast=1, slow_cooled=1, spilled=True, may_lower=True, limit=8) == 3
    assert next_replicas(8, fast=1, slow_cooled=1, spilled=True, may_lower=True, limit=8) == 8
    assert next_replicas(4, fast=2, slow_cooled=3, spilled=False, may_lower=True, limit=8) == 3
    assert next_replicas(4, fast=2, slow_cooled=3, spilled=False, may_lower=False, limit=8) == 4  # raised lately
    assert next_replicas(4, fast=2, slow_cooled=5, spilled=False, may_lower=True, limit=8) == 4
