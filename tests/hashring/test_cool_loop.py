"""The autoscaler's background helpers against a real redis-server: the lease primitives
(SET NX PX, compare-and-expire, compare-and-delete), `CoolLoop` (one process of the fleet cools
at a time, hands over on close, survives Redis restarts, lowers cooled voices) and `HeatRecorder`
(requests counted in memory, flushed in batches, flushed on close)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest

from hashring.errors import RingUnavailable
from hashring.placement import COOL_LOCK, CoolLoop, HeatRecorder, ReplicaControl
from hashring.store import RingStore, rate_of

pytestmark = pytest.mark.timeout(60)


class CountingControl(ReplicaControl):
    """The real ReplicaControl, counting the `record` calls that reach Redis."""

    def __init__(self, store: RingStore) -> None:
        super().__init__(store)
        self.records: list[tuple[str, int]] = []

    async def record(self, voice: str, count: int = 1) -> int:
        self.records.append((voice, count))
        return await super().record(voice, count)


async def until(predicate, timeout: float = 5.0, step: float = 0.02) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(step)


async def test_lease_is_held_by_one_token_renewed_and_released_only_by_it(ring_settings):
    async with RingStore(ring_settings) as store:
        assert await store.acquire_lock("job", "a", 5.0)
        assert not await store.acquire_lock("job", "b", 5.0)
        assert not await store.renew_lock("job", "b", 5.0)
        assert not await store.release_lock("job", "b")  # someone else's lease is left alone
        assert await store.lock_holder("job") == "a"
        assert await store.renew_lock("job", "a", 5.0)
        assert await store.release_lock("job", "a") and await store.lock_holder("job") is None
        assert not await store.renew_lock("job", "a", 5.0)  # gone: renewing does not bring it back

        assert await store.acquire_lock("job", "b", 0.2)
        await asyncio.sleep(0.35)  # expired (Redis clock)
        assert await store.lock_holder("job") is None and await store.acquire_lock("job", "a", 5.0)
        assert not await store.release_lock("job", "b")  # b's lease expired; a's is not b's to delete
        assert await store.lock_holder("job") == "a"
        with pytest.raises(ValueError):
            await store.acquire_lock("job", "a", 0)


async def test_one_of_two_loops_cools_at_a_time_and_hands_over_on_close(ring_settings):
    async with AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(RingStore(ring_settings)) for _ in range(2)]
        loops = [CoolLoop(ReplicaControl(s), interval_s=0.1) for s in stores]
        for loop in loops:
            stack.push_async_callback(loop.aclose)
        await asyncio.gather(*(loop.start() for loop in loops))
        await asyncio.sleep(1.0)
        leader, other = sorted(loops, key=lambda loop: -loop.cools)
        assert leader.holding and not other.holding and other.cools == 0
        assert 4 <= leader.cools <= 12  # once per interval for the fleet, not once per process
        assert await stores[0].lock_holder(COOL_LOCK) == leader.token

        await leader.aclose()  # releases: the other takes over on its next tick, not after the lease
        await until(lambda: other.holding, timeout=0.5)
        cools = other.cools
        await until(lambda: other.cools >= cools + 3, timeout=2)
        assert await stores[0].lock_holder(COOL_LOCK) == other.token


async def test_a_leader_that_dies_without_releasing_is_replaced_when_its_lease_ends(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        assert await store.acquire_lock(COOL_LOCK, "a-crashed-worker", 0.6)
        loop = await stack.enter_async_context(CoolLoop(ReplicaControl(store), interval_s=0.1))
        await asyncio.sleep(0.3)
        assert not loop.holding and loop.cools == 0
        await until(lambda: loop.holding and loop.cools > 0, timeout=2)


async def test_the_cool_loop_lowers_a_voice_that_went_quiet(ring_settings):
    s = ring_settings  # half-life 0.5 s, 5 req/s per replica
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        control = ReplicaControl(store)
        assert await control.record("tara", 20) == 6  # 20 × ln2 / 0.5 = 27.7 req/s
        assert (await store.auto_replicas())["tara"] == 6
        loop = await stack.enter_async_context(CoolLoop(control, interval_s=0.1))
        seen: set[int] = set()

        async def quiet() -> bool:
            auto = await store.auto_replicas()
            seen.add(auto.get("tara", 1))
            return "tara" not in auto

        async with asyncio.timeout(8):
            while not await quiet():
                await asyncio.sleep(0.05)
        assert loop.lowered >= 2 and len(seen) >= 3  # stepped down as the rate decayed
        rate = rate_of((await store.peek_heat(["tara"]))["tara"], s.heat_half_life_s)
        assert rate < s.cool_factor * s.hot_rate_per_replica


async def test_the_cool_loop_survives_redis_killed_and_restarted(ring_settings, redis_server):
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)  # leave the shared server running whatever happens
        store = await stack.enter_async_context(RingStore(ring_settings))
        loop = await stack.enter_async_context(CoolLoop(ReplicaControl(store), interval_s=0.1))
        await until(lambda: loop.holding and loop.cools > 0)
        task = loop._task
        redis_server.kill()
        await until(lambda: isinstance(loop.last_error, RingUnavailable), timeout=3)
        cools = loop.cools
        await asyncio.sleep(0.5)
        assert loop.cools == cools and not task.done()
        redis_server.start()  # empty: the lease is gone, renewing fails, the loop takes it again
        await until(lambda: loop.cools > cools + 2 and loop.last_error is None, timeout=5)
        assert await store.lock_holder(COOL_LOCK) == loop.token and not task.done()


async def test_heat_recorder_batches_per_voice_and_flushes_on_close(ring_settings):
    s = ring_settings
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        control = CountingControl(store)
        recorder = await stack.enter_async_context(HeatRecorder(control, flush_interval_s=0.3))
        for voice in ["tara", "tara", "leo", "tara"]:
            recorder.record(voice)
        assert recorder.pending == 4 and control.records == []  # nothing on the request path
        assert (await store.peek_heat(["tara"]))["tara"] == 0
        await until(lambda: recorder.flushed == 4)
        assert sorted(control.records) == [("leo", 1), ("tara", 3)] and recorder.flushes == 1
        assert 2.5 < (await store.peek_heat(["tara"]))["tara"] <= 3.0  # decayed a little since

        recorder.record("mia", 25)  # hot: the flush raises its automatic count
        await recorder.aclose()
        assert recorder.flushed == 29 and recorder.pending == 0 and control.records[-1] == ("mia", 25)
        assert (await store.auto_replicas())["mia"] >= 2
        assert recorder._task is None


async def test_heat_recorder_is_bounded_and_outlives_a_redis_outage(ring_settings, redis_server):
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)
        store = await stack.enter_async_context(RingStore(ring_settings))
        recorder = await stack.enter_async_context(HeatRecorder(ReplicaControl(store), flush_interval_s=0.1,
                                                                max_voices=2))
        recorder.record("a")
        recorder.record("b")
        recorder.record("c")  # a third distinct voice before a flush: not kept
        recorder.record("a")
        assert recorder.pending == 3 and recorder.dropped == 1
        await until(lambda: recorder.flushed == 3)

        redis_server.kill()
        recorder.record("a", 5)
        await until(lambda: isinstance(recorder.last_error, RingUnavailable), timeout=3)
        assert recorder.dropped == 6 and recorder.pending == 0 and not recorder._task.done()
        redis_server.start()
        recorder.record("b", 2)
        await until(lambda: recorder.flushed == 5 and recorder.last_error is None, timeout=5)
