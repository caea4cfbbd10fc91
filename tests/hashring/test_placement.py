"""Placement over a RingView (pure): replica counts, clamping, routing, capacity, id rules."""

from __future__ import annotations

import pytest

from hashring.errors import EmptyRing, InvalidReplicas, InvalidVoiceId, InvalidWorkerId
from hashring.placement import MAX_REPLICAS, check_replicas, place, requested_replicas, route
from hashring.records import RingView, Snapshot, WorkerInfo, check_voice_id, check_worker_id
from hashring.ring import Ring
from hashring.settings import RingSettings

SETTINGS = RingSettings(vnodes=64)


def view_of(*ids: str, loads: dict[str, int] | None = None, draining: set[str] = frozenset(),
            down: set[str] = frozenset(), replicas: dict[str, int] | None = None,
            auto: dict[str, int] | None = None, capacity: int = 4) -> RingView:
    snap = Snapshot(
        epoch=7,
        server_time=100.0,
        workers={i: WorkerInfo(i, f"ws://{i}:1", f"http://{i}:2", capacity=capacity) for i in ids},
        heartbeats={i: 99.5 for i in ids},
        live=frozenset(set(ids) - set(down)),
        draining=frozenset(draining),
        loads=loads or {},
        replicas=replicas or {},
        auto_replicas=auto or {},
    )
    return RingView.from_snapshot(snap, vnodes=SETTINGS.vnodes)


def test_view_ring_holds_only_live_undrained_workers():
    view = view_of("a", "b", "c", "d", draining={"b"}, down={"c"})
    assert sorted(n.id for n in view.ring.nodes) == ["a", "d"]
    assert {w: s.status for w, s in view.workers.items()} == {"a": "live", "b": "draining", "c": "down", "d": "live"}
    assert view.workers["a"].heartbeat_age_s == pytest.approx(0.5)


def test_view_reuses_ring_when_membership_is_unchanged():
    first = view_of("a", "b")
    again = RingView.from_snapshot(
        Snapshot(8, 1.0, {i: first.worker(i) for i in "ab"}, {}, frozenset("ab"), frozenset(), {"a": 3}, {}, {}),
        vnodes=SETTINGS.vnodes, previous=first)
    assert again.ring is first.ring and again.loads == {"a": 3, "b": 0}


def test_placement_default_operator_and_automatic_replicas():
    view = view_of("a", "b", "c", "d", replicas={"tara": 2, "pinned": 1}, auto={"tara": 3, "leo": 2})
    assert place(view, "zac", SETTINGS).replicas == 1
    assert place(view, "tara", SETTINGS).owners == view.ring.owners("tara", 3)  # max(operator 2, auto 3)
    assert place(view, "leo", SETTINGS).replicas == 2
    assert requested_replicas(view, "pinned", SETTINGS) == 1
    assert place(view, "zac", SETTINGS).epoch == 7


def test_replicas_above_live_workers_are_clamped_not_rejected():
    view = view_of("a", "b", replicas={"tara": 5})
    placement = place(view, "tara", SETTINGS)
    assert placement.replicas == 2 and placement.requested == 5 and placement.clamped


def test_route_balances_across_replicas_and_skips_full_and_excluded():
    view = view_of("a", "b", "c", "d", replicas={"tara": 2}, capacity=4)
    first, second = view.ring.owners("tara", 2)
    assert route(view, "tara", SETTINGS, loads={first: 1, second: 0}).id == second
    assert route(view, "tara", SETTINGS, loads={first: 0, second: 0}).id == first
    assert route(view, "tara", SETTINGS, loads={first: 0}, exclude={first}).id == second
    full = route(view, "tara", SETTINGS, loads={first: 4, second: 4})
    assert full.id not in (first, second) and full.ws_url.startswith("ws://")
    with pytest.raises(EmptyRing, match="capacity"):
        route(view, "tara", SETTINGS, loads={w: 4 for w in "abcd"})


def test_route_uses_heartbeat_loads_by_default():
    probe = view_of("a", "b", "c")
    home = probe.ring.owner("tara")
    view = view_of("a", "b", "c", loads={home: 4}, capacity=4)
    assert route(view, "tara", SETTINGS).id != home


def test_empty_ring_is_a_retryable_error_with_a_hint():
    view = view_of("a", draining={"a"})
    for call in (place, route):
        with pytest.raises(EmptyRing, match="ring status") as info:
            call(view, "tara", SETTINGS)
        assert info.value.retryable


@pytest.mark.parametrize("bad", [0, -1, MAX_REPLICAS + 1, True, 1.5])
def test_bad_replica_counts_are_rejected(bad):
    with pytest.raises(InvalidReplicas, match="replicas must be"):
        check_replicas(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("voice", ["tara", "voix française", "名前", "a:b:{c}*", "x" * 256, "🎤\n\t"])
def test_odd_voice_ids_are_accepted(voice):
    assert check_voice_id(voice) == voice
    assert place(view_of("a", "b"), voice, SETTINGS).owners


@pytest.mark.parametrize("voice", ["", "x" * 257, "é" * 129, "bad\ud800"])
def test_unusable_voice_ids_are_rejected(voice):
    with pytest.raises(InvalidVoiceId):
        check_voice_id(voice)


@pytest.mark.parametrize("wid", ["", "-lead", "has space", "x" * 129, "naïve", "a\nb"])
def test_unusable_worker_ids_are_rejected(wid):
    with pytest.raises(InvalidWorkerId):
        check_worker_id(wid)
    with pytest.raises(InvalidWorkerId):
        WorkerInfo(wid, "ws://x", "http://x")


def test_worker_info_json_round_trip():
    info = WorkerInfo("gpu-1.pod:8000", "ws://10.0.0.1:8000", "http://10.0.0.1:9000", weight=2.0, capacity=16)
    assert WorkerInfo.from_json(info.to_json()) == info


def test_ring_view_is_immutable():
    view = view_of("a")
    with pytest.raises(TypeError):
        view.workers["b"] = view.workers["a"]  # type: ignore[index]
    assert isinstance(view.ring, Ring)
