"""The ring router's candidates for one start (issue 20, item 3): at most `owner_tries` owners by
two random choices, then ring successors with those that took the voice lately first; a load on a
worker's answer replaces its older heartbeat in the estimate. Real Redis; no worker process."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack

import pytest

from gpu_worker.client import RingRouter
from hashring.placement import place
from tests.gpu_worker.test_placed_start import fleet

pytestmark = pytest.mark.timeout(60)


async def test_candidates_are_three_owners_then_successors_those_holding_the_voice_first(redis_url):
    async with AsyncExitStack() as stack:
        urls = {f"cand-{i}": f"ws://127.0.0.1:{7400 + i}" for i in range(6)}
        settings, store, watcher = await fleet(stack, redis_url, "test:candidates", urls)
        await store.set_replicas("tara", 4)
        view = await watcher.wait_for(lambda v: v.replicas.get("tara") == 4, 5)
        owners = place(view, "tara", settings).owners
        ring_order = [w for w in view.ring.owners("tara", len(view.ring)) if w not in owners]
        router = RingRouter(watcher, settings, rng=random.Random(3))
        got = [info.id for info in router.candidates("tara", {}, ())]
        assert len(got) == 3 + len(ring_order) and set(got[:3]) < set(owners)  # three of the four owners
        assert got[3:] == ring_order
        router.took(ring_order[-1], "tara")  # the pool saw the last successor take tara: it likely holds the adapter
        got = [info.id for info in router.candidates("tara", {}, ())]
        assert got[3:] == [ring_order[-1], *ring_order[:-1]]
        assert [info.id for info in router.candidates("tara", {}, set(owners))] == [ring_order[-1], *ring_order[:-1]]


async def test_a_load_on_an_answer_steers_the_two_choices_until_a_newer_heartbeat(redis_url):
    async with AsyncExitStack() as stack:
        urls = {f"ans-{i}": f"ws://127.0.0.1:{7500 + i}" for i in range(3)}
        settings, store, watcher = await fleet(stack, redis_url, "test:answers", urls)
        await store.set_replicas("leo", 2)
        view = await watcher.wait_for(lambda v: v.replicas.get("leo") == 2, 5)
        busy, idle = place(view, "leo", settings).owners
        router = RingRouter(watcher, settings, rng=random.Random(1))
        router.answered(busy, 9, 0)  # its heartbeat said 0; its last answer (newer) says 9
        for _ in range(20):  # no await in between: the view (and its heartbeats) cannot move
            assert next(router.candidates("leo", {}, ())).id == idle
        assert router.estimates({})[busy] == 9
