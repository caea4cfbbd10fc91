"""The adapter mirror reconciled with the engine: an engine that evicts behind the mirror's back."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpu_worker.adapters import AdapterCache, AdapterStore, publish_adapter
from gpu_worker.metrics import WorkerMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Engine:
    """vLLM's CPU cache as the cache sees it: explicit loads, a listing, and evictions of its own."""

    def __init__(self) -> None:
        self.held: dict[int, str] = {}
        self.loaded: list[str] = []
        self.listings = 0

    async def load(self, voice) -> None:
        self.held[voice.lora_id] = voice.name
        self.loaded.append(voice.name)

    async def listing(self) -> set[int]:
        self.listings += 1
        return set(self.held)

    def evict(self, name: str) -> None:
        self.held = {i: n for i, n in self.held.items() if n != name}


@pytest.fixture
def store(stand_in, tmp_path) -> AdapterStore:
    for name in ("v1", "v2", "v3"):
        publish_adapter(stand_in.voice("tara"), tmp_path / "store", name)
    return AdapterStore(tmp_path / "store")


def cache_for(store: AdapterStore, engine: Engine, clock: Clock, **kw) -> AdapterCache:
    return AdapterCache(store, engine.load, capacity=4, listing=engine.listing, reconcile_s=5.0, clock=clock, **kw)


async def test_a_voice_the_engine_dropped_is_reloaded_and_counted(store):
    engine, clock, metrics = Engine(), Clock(), WorkerMetrics()
    cache = cache_for(store, engine, clock, metrics=metrics)
    for name in ("v1", "v2"):
        await cache.acquire(name)
    engine.evict("v1")  # vLLM's LRU disagreed with the mirror's
    clock.now = 5.0
    await cache.acquire("v1")
    assert engine.loaded == ["v1", "v2", "v1"] and cache.resident == ["v2", "v1"]
    assert (cache.loads, cache.reloads, cache.evictions) == (3, 1, 1)
    text = metrics.render().decode()
    assert "voicering_worker_adapter_loads_total 3.0" in text and "voicering_worker_adapter_evictions_total 1.0" in text


async def test_reconciliation_drops_every_entry_the_engine_lost(store):
    engine, clock = Engine(), Clock()
    cache = cache_for(store, engine, clock)
    for name in ("v1", "v2", "v3"):
        await cache.acquire(name)
    engine.evict("v2")
    engine.evict("v3")
    clock.now = 5.0
    await cache.acquire("v1")  # a hit the engine still holds: nothing loaded, the mirror corrected
    assert engine.loaded == ["v1", "v2", "v3"] and cache.resident == ["v1"] and cache.evictions == 2


async def test_the_engine_is_asked_at_most_once_per_reconcile_s(store):
    engine, clock = Engine(), Clock()
    cache = cache_for(store, engine, clock)
    await cache.acquire("v1")  # a miss: loaded, nothing to ask
    clock.now = 0.1
    await cache.acquire("v1")  # the first hit checks
    assert engine.listings == 1
    for _ in range(20):  # 4 s of hits
        clock.now += 0.2
        cache.release(await cache.acquire("v1"))
    assert engine.listings == 1
    clock.now = 5.1
    await cache.acquire("v1")
    await cache.acquire("v1")
    assert engine.listings == 2
    engine.evict("v1")
    clock.now = 5.2
    await cache.acquire("v1")  # not due: served as the mirror believes (vLLM reloads it on its own)
    assert engine.loaded == ["v1"] and engine.listings == 2


async def test_a_failing_listing_leaves_the_mirror_and_serves(store, caplog):
    engine, clock = Engine(), Clock()

    async def broken() -> set[int]:
        raise RuntimeError("engine core busy")

    cache = AdapterCache(store, engine.load, capacity=4, listing=broken, reconcile_s=0.0, clock=clock)
    await cache.acquire("v1")
    with caplog.at_level(logging.WARNING):
        assert (await cache.acquire("v1")).name == "v1"
    assert cache.resident == ["v1"] and "could not list the engine's adapters" in caplog.text


async def test_without_a_listing_the_mirror_is_trusted(store):
    engine = Engine()
    cache = AdapterCache(store, engine.load, capacity=4)
    await cache.acquire("v1")
    engine.evict("v1")
    await cache.acquire("v1")
    assert engine.loaded == ["v1"] and cache.reloads == 0


async def test_a_mirror_change_during_the_listing_is_respected(store):
    """While a hit waits for the engine's listing, another voice's load evicts it from the mirror."""
    engine, clock, entered, gate = Engine(), Clock(), asyncio.Event(), asyncio.Event()

    async def slow_listing() -> set[int]:
        entered.set()
        await gate.wait()
        return await engine.listing()

    cache = AdapterCache(store, engine.load, capacity=1, listing=slow_listing, reconcile_s=0.0, clock=clock)
    await cache.acquire("v1")
    hit = asyncio.create_task(cache.acquire("v1"))
    await entered.wait()
    await cache.acquire("v2")  # a miss (no listing); capacity 1: v1 leaves the mirror
    gate.set()
    assert (await hit).name == "v1"  # loaded again, not a KeyError on the vanished mirror entry
    assert engine.loaded == ["v1", "v2", "v1"] and cache.resident == ["v1"]
