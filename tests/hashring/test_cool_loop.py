"""The autoscaler's background helpers against a real redis-server: the lease primitives
(SET NX PX, compare-and-expire, compare-and-delete), `CoolLoop` (one process of the fleet cools
at a time, hands over on close, survives Redis restarts, lowers cooled voices) and `HeatRecorder`
(requests counted in memory, flushed in batches, flushed on close)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest

from hashring.errors import RingUnavailable
from hashring.membership import Heartbeat
from hashring.placement import COOL_LOCK, CoolLoop, HeatRecorder, ReplicaControl
from hashring.records import WorkerInfo
from hashring.store import RingStore

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


async def heartbeating(stack: AsyncExitStack, store: RingStore, loads: dict[str, int]) -> None:
    """Workers that report `loads[id]` streams in every heartbeat (the dict may change)."""
    for wid in loads:
        info = WorkerInfo(wid, f"ws://127.0.0.1:7{len(wid)}", f"http://127.0.0.1:9{len(wid)}")
        await stack.enter_async_context(Heartbeat(store, info, load=lambda wid=wid: loads[wid]))
    await asyncio.sleep(3 * store.settings.heartbeat_interval_s)


async def test_the_cool_loop_sizes_voices_by_their_measured_load_share(ring_settings):
    """Regression (issue #20): replicas came from a fixed 5 req/s per replica, capped at 8; they
    follow the voice's share of the measured fleet load now, and fall once the load goes."""
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        loads = {f"w{i}": 4 for i in range(4)}  # 16 streams: 4 per worker, 1.5 per replica at α = 0.375
        await heartbeating(stack, store, loads)
        control = ReplicaControl(store)
        await control.record("tara", 20)  # a quarter of the fleet's requests: 4 streams -> 3 replicas
        await control.record("other", 60)  # three quarters: 12 streams -> 8, clamped to the 4 workers
        assert await control.cool() == {"tara": 3, "other": 4}
        fleet = control.last_fleet
        assert fleet.workers == 4 and fleet.mean_streams_per_worker == 4
        assert fleet.mean_stream_s == pytest.approx(16 / fleet.rate)  # Little's law on what was measured
        assert (await store.auto_replicas()) == {"tara": 3, "other": 4}
        assert await control.cool() == {}  # the shares hold while the load does
        for wid in loads:
            loads[wid] = 0  # the fleet went quiet
        await asyncio.sleep(max(ring_settings.scale_down_hold_s, 3 * ring_settings.heartbeat_interval_s))
        assert await control.cool() == {"tara": 1, "other": 1}
        assert await store.auto_replicas() == {}


async def test_a_spill_raises_a_voice_at_once_and_the_loop_lowers_it_after_the_hold(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        await heartbeating(stack, store, {f"w{i}": 4 for i in range(4)})
        control = ReplicaControl(store)
        await control.record("busy", 50)  # the fleet's load is measured
        await control.cool()
        await control.spilled({"leo": 2})  # a worker served a placed leo start it does not own
        assert (await control.cool())["leo"] == 2  # one more at once, before any rate shows it
        assert "leo" not in await control.cool()  # held: not lowered within scale_down_hold_s
        loop = await stack.enter_async_context(CoolLoop(control, interval_s=0.1))
        await until(lambda: loop.cools > 0 and "leo" in loop.changed, timeout=5)
        assert loop.changed["leo"] == 1 and "leo" not in await store.auto_replicas()


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

        recorder.record("mia", 25)
        recorder.spilled("mia")
        await recorder.aclose()
        assert recorder.flushed == 29 and recorder.pending == 0 and control.records[-1] == ("mia", 25)
        assert "mia" not in await store.auto_replicas()  # a flush decides nothing: the cool loop does
        warm, spills = await store.take_signals()
        assert spills == {"mia": 1} and recorder.spills == 1 and "mia" in warm
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
