"""What the fleet records for its operators beside membership, against a real Redis: the voices
whose adapters each worker holds (sent with heartbeats only when they change, gone when the
worker leaves or re-registers), the bounded index of recently requested voices, and each voice's
decayed spill and refusal counters, which the cool loop's read-and-clear leaves alone."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import hashring.store
from hashring.membership import Heartbeat
from hashring.placement import HeatRecorder, ReplicaControl
from hashring.records import WorkerInfo
from hashring.store import MAX_RESIDENT_LISTED, RingStore

pytestmark = pytest.mark.timeout(60)


def info(wid: str) -> WorkerInfo:
    return WorkerInfo(wid, f"ws://127.0.0.1:1/{wid}", "ws://127.0.0.1:1")


async def until(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


async def test_a_worker_lists_its_resident_adapters_only_when_they_change(ring_settings, monkeypatch):
    resident: list[str] = []
    async with RingStore(ring_settings) as store:
        sent: list[tuple[str, ...] | None] = []
        real = store.heartbeat

        async def counted(worker_id, load, listed=None):
            sent.append(None if listed is None else tuple(listed))
            return await real(worker_id, load, listed)

        monkeypatch.setattr(store, "heartbeat", counted)
        beat = Heartbeat(store, info("w1"), resident=lambda: resident)
        await beat.start()
        await until(lambda: _listed(store, "w1", ()))  # an empty list is still a list: "holds none"
        resident += ["tara", "acme/mia"]
        await until(lambda: _listed(store, "w1", ("tara", "acme/mia")))
        beats = len(sent)
        await asyncio.sleep(0.5)  # ~5 beats with nothing changed: none of them sends the list
        assert len(sent) > beats and all(s is None for s in sent[beats:]), sent

        await store._client.hdel(store.keys.workers, "w1")  # Redis forgot the worker (restarted empty)
        await store._client.hset(store.keys.resident, "w1", '["stale"]')
        await until(lambda: _listed(store, "w1", ("tara", "acme/mia")))  # registered again, listed again

        await beat.aclose()  # a clean leave takes the list with it
        assert "w1" not in await store.resident()

        # a restart with the same id (a StatefulSet pod) holds nothing until its heartbeat says so
        await store.heartbeat("w2", 0)  # unknown: -1, and nothing is written for it
        await store.register(info("w2"))
        await store.heartbeat("w2", 0, ["tara"])
        await store.register(info("w2"))
        assert "w2" not in await store.resident()

        await store.heartbeat("w2", 0, [f"v{i}" for i in range(MAX_RESIDENT_LISTED + 5)])
        listed = (await store.resident())["w2"]
        assert len(listed) == MAX_RESIDENT_LISTED and listed[-1] == f"v{MAX_RESIDENT_LISTED + 4}"  # the newest


async def _listed(store: RingStore, wid: str, voices: tuple[str, ...]) -> bool:
    return (await store.resident()).get(wid) == voices


async def test_a_forgotten_worker_loses_its_list(ring_settings):
    settings = dataclasses.replace(ring_settings, forget_after_s=1.0)
    async with RingStore(settings) as store:
        await store.register(info("gone"))
        await store.heartbeat("gone", 0, ["tara"])
        assert (await store.resident())["gone"] == ("tara",)

        async def forgotten() -> bool:
            return "gone" not in (await store.snapshot()).workers

        await until(forgotten)
        assert "gone" not in await store.resident()


async def test_the_request_index_keeps_the_newest_voices_within_its_bound(ring_settings, monkeypatch):
    monkeypatch.setattr(hashring.store, "MAX_INDEXED_VOICES", 5)
    async with RingStore(ring_settings) as store:
        control = ReplicaControl(store)
        for i in range(8):
            await control.record(f"v{i}")
        await control.record("v2")  # requested again: newest
        assert await store.recent_voices() == ["v2", "v7", "v6", "v5", "v4"]
        assert await store.recent_voices(2) == ["v2", "v7"] and await store.recent_voices(0) == []


async def test_requests_past_the_heat_ttl_leave_the_index(ring_settings):
    settings = dataclasses.replace(ring_settings, heat_half_life_s=0.1, heat_fast_half_life_s=0.05)  # TTL 2 s
    async with RingStore(settings) as store:
        control = ReplicaControl(store)
        await control.record("old")
        await asyncio.sleep(2.2)
        await control.record("new")
        assert await store.recent_voices() == ["new"]


async def test_spills_and_refusals_per_voice_outlive_the_cool_loops_read(ring_settings):
    settings = dataclasses.replace(ring_settings, heat_half_life_s=10.0, heat_fast_half_life_s=2.0)
    async with RingStore(settings) as store:
        control = ReplicaControl(store)
        async with HeatRecorder(control, flush_interval_s=0.05) as heat:
            heat.spilled("tara", 3)
            heat.refused("tara", 4)  # a worker at capacity: counted, no replica signal
            heat.refused("leo", 2, raise_replicas=True)  # an owner over its share: raise leo
        assert (heat.spills, heat.refusals) == (3, 6)
        _warm, signals = await store.take_signals()
        assert signals == {"tara": 3, "leo": 2}
        assert (await store.take_signals())[1] == {}  # read and cleared ...
        outcomes = await store.peek_outcomes(["tara", "leo", "mia"])  # ... while these stay
        assert outcomes["tara"] == pytest.approx((3.0, 4.0), rel=0.2)
        assert outcomes["leo"][0] == 0.0 and outcomes["leo"][1] == pytest.approx(2.0, rel=0.2)
        assert outcomes["mia"] == (0.0, 0.0)
        await asyncio.sleep(settings.heat_fast_half_life_s)  # one short-window half-life later: halved
        spill, refusal = (await store.peek_outcomes(["tara"]))["tara"]
        assert spill / outcomes["tara"][0] == pytest.approx(0.5, rel=0.15)
        assert refusal / outcomes["tara"][1] == pytest.approx(0.5, rel=0.15)
