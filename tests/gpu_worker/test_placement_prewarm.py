"""OwnershipWarmer against a real redis-server: ring members are real `Heartbeat`s of
`WorkerInfo` records (no vLLM worker processes), the ring is a real `RingWatcher`, and every
expected voice set is computed independently with `place()` before and after each change.

The prewarm callable is a recording async function (`Loads`), not the AdapterCache: what is tested
here is which voices are prewarmed, in what order and how many at once; loading real adapters is
tested in test_adapter_cache.py and test_worker_ring.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from contextlib import AsyncExitStack

import pytest

from hashring.errors import RingUnavailable
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import ReplicaControl, place
from hashring.records import RingView, WorkerInfo
from hashring.settings import RetryPolicy, RingSettings
from hashring.store import RingStore
from gpu_worker.placement_prewarm import OwnershipWarmer, heat_rates, newly_owned

pytestmark = pytest.mark.timeout(60)

VOICES = [f"voice-{i:02d}" for i in range(48)]


@pytest.fixture
def settings(redis_url: str) -> RingSettings:
    return RingSettings(
        redis_url=redis_url, prefix=f"test:own:{uuid.uuid4().hex[:10]}", vnodes=128,
        heartbeat_interval_s=0.1, heartbeat_ttl_s=0.6, refresh_interval_s=0.2, redis_timeout_s=0.5,
        retry=RetryPolicy(attempts=3, base_delay_s=0.02, max_delay_s=0.1),
        heat_half_life_s=60.0,  # heat set by a test stays put while it runs
    )


class Loads:
    """A recording prewarm: remembers each voice in call order and how many ran at once."""

    def __init__(self, *, delay_s: float = 0.0, raises: set[str] = frozenset(), refuses: set[str] = frozenset()):
        self.delay_s, self.raises, self.refuses = delay_s, raises, refuses
        self.calls: list[str] = []
        self.in_flight = self.max_in_flight = 0

    async def __call__(self, voices: list[str]) -> dict[str, str]:
        self.calls.extend(voices)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.raises & set(voices):
                raise RuntimeError("engine fell over")
            return {v: f"voice {v!r} is not in the store" if v in self.refuses else "ready" for v in voices}
        finally:
            self.in_flight -= 1


def info(i: int) -> WorkerInfo:
    return WorkerInfo(f"w{i}", f"ws://127.0.0.1:{7100 + i}", f"http://127.0.0.1:{8100 + i}")


def owned(worker: str, view: RingView, settings: RingSettings) -> set[str]:
    return {v for v in VOICES if len(view.ring) and worker in place(view, v, settings).owners}


def gained(worker: str, before: RingView, after: RingView, settings: RingSettings) -> set[str]:
    return owned(worker, after, settings) - owned(worker, before, settings)


async def ring(stack: AsyncExitStack, settings: RingSettings, workers: int) -> tuple[RingStore, RingWatcher, list[Heartbeat]]:
    store = await stack.enter_async_context(RingStore(settings))
    watcher = await stack.enter_async_context(RingWatcher(store))
    beats = [await stack.enter_async_context(Heartbeat(store, info(i))) for i in range(workers)]
    await watcher.wait_for(lambda v: len(v.ring) == workers, 5)
    return store, watcher, beats


async def warmer(stack: AsyncExitStack, worker: str, watcher: RingWatcher, settings: RingSettings, loads: Loads,
                 **kw) -> OwnershipWarmer:
    kw.setdefault("max_per_change", 1000)
    return await stack.enter_async_context(
        OwnershipWarmer(worker, watcher, settings, loads, lambda: list(VOICES), wait_s=0.2, **kw))


async def test_leave_and_join_prewarm_exactly_the_newly_owned_voices(settings):
    async with AsyncExitStack() as stack:
        store, watcher, beats = await ring(stack, settings, 3)
        first = watcher.view
        loads = Loads()
        w0 = await warmer(stack, "w0", watcher, settings, loads)
        report = await w0.wait_report(lambda r: r.epoch == first.epoch, 5)
        assert report.previous_epoch is None  # the first view: everything owned is new
        assert set(loads.calls) == set(report.ready) == owned("w0", first, settings)
        assert report.owned == report.new == len(loads.calls)

        calls = len(loads.calls)
        await beats[2].aclose()  # w2 leaves: its voices move to their next owners
        after = await watcher.wait_for(lambda v: "w2" not in v.ring, 5)
        report = await w0.wait_report(lambda r: r.epoch == after.epoch, 5)
        expected = gained("w0", first, after, settings)
        assert expected and set(loads.calls[calls:]) == set(report.ready) == expected
        assert report.previous_epoch == first.epoch and report.new == len(expected) and not report.failed

        calls, before = len(loads.calls), after
        w3 = await warmer(stack, "w3", watcher, settings, loads3 := Loads())
        await stack.enter_async_context(Heartbeat(store, info(3)))  # w3 joins
        after = await watcher.wait_for(lambda v: "w3" in v.ring, 5)
        report = await w0.wait_report(lambda r: r.epoch == after.epoch, 5)
        assert report.new == len(gained("w0", before, after, settings)) == 0  # a join only takes voices away
        assert len(loads.calls) == calls
        joined = await w3.wait_report(lambda r: r.epoch == after.epoch, 5)
        assert set(loads3.calls) == set(joined.ready) == owned("w3", after, settings) != set()
        assert w0.last_error is None and w0.changes >= 3


async def test_hottest_first_capped_and_at_most_concurrency_at_once(settings):
    async with AsyncExitStack() as stack:
        store, watcher, beats = await ring(stack, settings, 2)
        before = watcher.view
        moving = sorted(owned("w1", before, settings))  # all of w1's voices move to w0 when it leaves
        heat = {v: 10 * (i % 7) + i for i, v in enumerate(moving)}  # distinct, not in listing order
        for voice, count in heat.items():
            await store.add_heat(voice, count)
        loads = Loads(delay_s=0.05)
        w0 = await warmer(stack, "w0", watcher, settings, loads, max_per_change=5, concurrency=2,
                          rates=heat_rates(store))
        first = await w0.wait_report(lambda r: r.epoch == before.epoch, 5)
        assert w0.over_cap == first.new - 5
        loads.calls.clear()

        await beats[1].aclose()
        after = await watcher.wait_for(lambda v: "w1" not in v.ring, 5)
        report = await w0.wait_report(lambda r: r.epoch == after.epoch, 5)
        hottest = sorted(moving, key=lambda v: -heat[v])
        assert set(moving) == gained("w0", before, after, settings)
        assert loads.calls == hottest[:5] == list(report.results)  # started hottest first
        assert set(report.over_cap) == set(hottest[5:]) and w0.over_cap == first.new - 5 + len(moving) - 5
        assert loads.max_in_flight == 2


async def test_scale_to_two_makes_the_new_second_owner_prewarm_the_voice(settings):
    async with AsyncExitStack() as stack:
        store, watcher, _ = await ring(stack, settings, 2)
        view = watcher.view
        voice = next(v for v in VOICES if place(view, v, settings).owners == ("w0",))
        loads = {w: Loads() for w in ("w0", "w1")}
        warmers = {w: await warmer(stack, w, watcher, settings, loads[w]) for w in loads}
        for w in warmers.values():
            await w.wait_report(lambda r: r.epoch == view.epoch, 5)
        assert voice in loads["w0"].calls and voice not in loads["w1"].calls
        for w in loads.values():
            w.calls.clear()

        await ReplicaControl(store).scale(voice, 2)  # `voicering ring scale VOICE --replicas 2`
        after = await watcher.wait_for(lambda v: v.replicas.get(voice) == 2, 5)
        assert place(after, voice, settings).owners == ("w0", "w1")
        second = await warmers["w1"].wait_report(lambda r: r.epoch == after.epoch, 5)
        first = await warmers["w0"].wait_report(lambda r: r.epoch == after.epoch, 5)
        assert dict(second.results) == {voice: "ready"} and loads["w1"].calls == [voice]
        assert first.new == 0 and loads["w0"].calls == []


async def test_a_failing_voice_does_not_stop_the_others(settings):
    async with AsyncExitStack() as stack:
        store, watcher, _ = await ring(stack, settings, 2)
        view = watcher.view
        mine = sorted(owned("w1", view, settings))
        loads = Loads(raises={mine[0]}, refuses={mine[1]})
        w1 = await warmer(stack, "w1", watcher, settings, loads, concurrency=1)
        report = await w1.wait_report(lambda r: r.epoch == view.epoch, 5)
        assert set(loads.calls) == set(mine)  # every voice was tried, in one change
        assert report.failed == {mine[0]: "prewarm failed: engine fell over", mine[1]: f"voice {mine[1]!r} is not in the store"}
        assert set(report.ready) == set(mine[2:]) and w1.failed == 2 and w1.ready == len(mine) - 2
        assert w1.last_error is None

        voice = next(v for v in VOICES if place(view, v, settings).owners == ("w0",))
        await ReplicaControl(store).scale(voice, 2)  # and the next change is handled as usual
        after = await watcher.wait_for(lambda v: v.replicas.get(voice) == 2, 5)
        assert dict((await w1.wait_report(lambda r: r.epoch == after.epoch, 5)).results) == {voice: "ready"}


async def test_a_failing_candidate_listing_is_retried_without_losing_the_change(settings):
    async with AsyncExitStack() as stack:
        store, watcher, _ = await ring(stack, settings, 2)
        view = watcher.view
        broken = [True]

        def listing() -> list[str]:
            if broken[0]:
                raise OSError("voices directory is not mounted")
            return list(VOICES)

        loads = Loads()
        w1 = await stack.enter_async_context(
            OwnershipWarmer("w1", watcher, settings, loads, listing, max_per_change=100, wait_s=0.1))
        await asyncio.sleep(0.4)
        assert isinstance(w1.last_error, OSError) and w1.last_report is None and not loads.calls
        broken[0] = False
        report = await w1.wait_report(lambda r: r.epoch == view.epoch, 5)
        assert set(report.ready) == owned("w1", view, settings) and w1.last_error is None


async def test_unreadable_heat_keeps_listing_order(settings):
    # a real store on a port nothing listens on: every rates call fails as with Redis down
    dead = dataclasses.replace(settings, redis_url="redis://127.0.0.1:9/0", redis_timeout_s=0.2)
    async with AsyncExitStack() as stack:
        _, watcher, _ = await ring(stack, settings, 2)
        view = watcher.view
        nowhere = await stack.enter_async_context(RingStore(dead))
        with pytest.raises(RingUnavailable):
            await heat_rates(nowhere)(["a", "b"])
        loads = Loads()
        w0 = await warmer(stack, "w0", watcher, settings, loads, rates=heat_rates(nowhere), concurrency=1)
        report = await w0.wait_report(lambda r: r.epoch == view.epoch, 5)
        assert loads.calls == [v for v in VOICES if v in owned("w0", view, settings)] == report.ready


async def test_redis_killed_and_restarted_does_not_kill_the_warmer(settings, redis_server):
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)  # leave the shared server running whatever happens
        store, watcher, _ = await ring(stack, settings, 2)
        view = watcher.view
        loads = Loads()
        w1 = await warmer(stack, "w1", watcher, settings, loads, rates=heat_rates(store))
        await w1.wait_report(lambda r: r.epoch == view.epoch, 5)
        task = w1._task

        redis_server.kill()
        await asyncio.sleep(1.0)
        assert watcher.stale and not task.done()
        redis_server.start()  # empty: the heartbeats register again, the operator floors are gone
        await watcher.wait_for(lambda v: len(v.ring) == 2 and not watcher.stale, 10)
        voice = next(v for v in VOICES if place(view, v, settings).owners == ("w0",))
        loads.calls.clear()
        await ReplicaControl(store).scale(voice, 2)
        after = await watcher.wait_for(lambda v: v.replicas.get(voice) == 2, 5)
        report = await w1.wait_report(lambda r: r.epoch == after.epoch and voice in r.results, 5)
        assert dict(report.results) == {voice: "ready"} and voice in loads.calls and not task.done()


def test_newly_owned_is_the_difference_of_two_placements(settings):
    from hashring.ring import Node, Ring

    two = RingView(1, Ring([Node("a"), Node("b")], vnodes=64))
    one = RingView(2, Ring([Node("a")], vnodes=64))
    moved = [v for v in VOICES if place(two, v, settings).owners == ("b",)]
    assert moved and newly_owned("a", two, one, VOICES, settings) == moved
    assert newly_owned("a", one, two, VOICES, settings) == []
    assert newly_owned("a", None, one, [*VOICES, "../bad"], settings) == VOICES
    assert newly_owned("b", two, one, VOICES, settings) == []  # not in the ring: owns nothing
