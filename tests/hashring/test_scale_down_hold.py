"""The scale-down hold outlives a cool-lease handover (issue #34 item 13), against a real
redis-server: the time a voice was raised is kept in Redis beside its automatic count, on Redis's
clock, so the process that takes the lease over holds the voice as the one that raised it would."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import AsyncExitStack

import pytest

from hashring.membership import Heartbeat
from hashring.placement import COOL_LOCK, CoolLoop, ReplicaControl
from hashring.records import WorkerInfo
from hashring.settings import RingSettings
from hashring.store import RingStore

pytestmark = pytest.mark.timeout(60)
HOLD_S = 2.0  # long enough that a slow box still runs the new holder's first ticks inside it


async def fleet(stack: AsyncExitStack, store: RingStore, workers: int = 4) -> None:
    """Workers that report 4 streams each, so the cool loop measures a fleet load."""
    for i in range(workers):
        info = WorkerInfo(f"w{i}", f"ws://127.0.0.1:70{i}", f"http://127.0.0.1:90{i}")
        await stack.enter_async_context(Heartbeat(store, info, load=lambda: 4))
    await asyncio.sleep(3 * store.settings.heartbeat_interval_s)


async def test_a_new_cool_lease_holder_keeps_the_hold_of_a_voice_the_old_one_raised(ring_settings: RingSettings):
    """Regression: the raise time lived in the raising process's memory, so the next holder of the
    cool lease lowered a voice raised a moment ago (its flap guard was gone with the old holder)."""
    s = dataclasses.replace(ring_settings, scale_down_hold_s=HOLD_S)
    async with AsyncExitStack() as stack:
        old_store = await stack.enter_async_context(RingStore(s))
        await fleet(stack, old_store)
        raiser = ReplicaControl(old_store)
        old = CoolLoop(raiser, interval_s=0.1)
        await raiser.record("busy", 50)
        assert await old.tick()  # the fleet's load is measured
        await raiser.spilled({"leo": 2})
        raised = time.monotonic()
        assert await old.tick() and old.changed == {"leo": 2}  # raised at once by the spill
        await old.aclose()  # hands the lease over, and its memory goes with it

        new_store = await stack.enter_async_context(RingStore(s))  # another process: its own connection
        new = CoolLoop(ReplicaControl(new_store), interval_s=0.1)
        stack.push_async_callback(new.aclose)
        ticks = 0
        while time.monotonic() - raised < 0.6 * HOLD_S:  # leo has no requests: only the hold keeps it at 2
            assert await new.tick() and await new_store.lock_holder(COOL_LOCK) == new.token
            assert "leo" not in new.changed, f"lowered {time.monotonic() - raised:.2f} s after the raise"
            ticks += 1
            await asyncio.sleep(0.1)
        assert ticks >= 1 and (await new_store.auto_replicas())["leo"] == 2

        lowered = None
        while lowered is None and time.monotonic() - raised < HOLD_S + 5:
            await asyncio.sleep(0.1)
            assert await new.tick()
            if "leo" in new.changed:
                lowered = time.monotonic() - raised
        assert lowered is not None and lowered >= HOLD_S, lowered  # lowered once the hold is over, not before
        assert new.changed["leo"] == 1 and "leo" not in await new_store.auto_replicas()


async def test_the_raise_time_is_stamped_by_a_raise_and_forgotten_when_the_count_falls_or_is_cleared(
        ring_settings: RingSettings):
    async with RingStore(ring_settings) as store:
        assert await store.raised_ages(["tara"]) == {} and await store.raised_ages([]) == {}
        assert await store.swap_auto_replicas("tara", None, 3)
        assert not await store.swap_auto_replicas("tara", 2, 4)  # another process changed it first
        await asyncio.sleep(0.2)
        ages = await store.raised_ages(["tara", "leo"])
        assert list(ages) == ["tara"] and 0.15 <= ages["tara"] < 5
        assert await store.swap_auto_replicas("tara", 3, 2)  # lowered: the hold no longer applies
        assert await store.raised_ages(["tara"]) == {}
        assert await store.swap_auto_replicas("tara", 2, 5) and "tara" in await store.raised_ages(["tara"])
        assert await store.swap_auto_replicas("tara", 5, None)  # cleared (the voice was deleted): forgotten too
        assert await store.raised_ages(["tara"]) == {} and await store.auto_replicas() == {}
        # the replica record itself keeps its format: readers of P:auto (status, fleet view) see counts
        assert await store.swap_auto_replicas("tara", None, 2)
        assert (await store.snapshot()).auto_replicas == {"tara": 2} == await store.auto_replicas()
