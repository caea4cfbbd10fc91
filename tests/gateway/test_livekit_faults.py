"""The plugin when a worker dies: two real `voicering worker` processes in the session's Redis ring
(the session's `worker-a` and `worker-lk`, started for this module and SIGKILLed by it), real
framework streams. A turn that was speaking when its worker died ends with a clear, non-retryable
error; a turn whose context was open there but had no audio yet is replayed on the other worker
and heard whole; the next turn works."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions

from gateway.livekit import TTS
from gpu_worker.adapters import publish_adapter
from gpu_worker.protocol import ContextOptions
from hashring.membership import RingWatcher
from hashring.placement import place
from hashring.settings import RingSettings
from hashring.store import RingStore
from tests.fixtures.models import CLUSTER_PREFIX, cluster_args, start_worker
from tests.gateway.test_livekit_tts import direct_like_the_plugin

OWN_WORKERS = 1  # a worker in the session ring, killed mid-turn (tests/fixtures/fleet.py)

EXTRA = "worker-lk"
VOICES = [f"lk/v{i}" for i in range(12)]
NO_RETRY = APIConnectOptions(max_retry=0, timeout=10)
MIN_SENTENCE_CHARS = 20
SHORT = ContextOptions(max_tokens=43, seed=93)


def ring_settings(redis_url: str) -> RingSettings:
    return RingSettings(redis_url=redis_url, prefix=CLUSTER_PREFIX)


@pytest.fixture(scope="module")
def extra_worker(worker, stand_in, adapter_store, redis_server, tmp_path_factory):
    for name in VOICES:
        if not (adapter_store / name).exists():
            publish_adapter(adapter_store / "tara", adapter_store, name)
    handle = start_worker(stand_in, adapter_store, tmp_path_factory.mktemp("livekit-faults") / f"{EXTRA}.log",
                          "--max-loras", "2", "--max-streams", "8", *cluster_args(redis_server.url, EXTRA),
                          env={"VOICERING_WORKER_RING_PREFIX": CLUSTER_PREFIX})
    yield handle
    handle.stop()


@pytest.fixture
async def owned(worker, extra_worker, redis_url):
    """A voice whose only owner is the extra worker, once both workers see both in the ring."""
    settings = ring_settings(redis_url)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        await watcher.wait_for(lambda v: {"worker-a", EXTRA} <= set(v.loads), timeout=30)
        for handle in (worker, extra_worker):  # both workers' own watchers see both too
            await handle.wait_ring_view(len(watcher.view.ring))
        yield next(v for v in VOICES if place(watcher.view, v, settings).owners == (EXTRA,))
        # leave the ring as this module found it: the killed worker is out of every view
        await watcher.wait_for(lambda v: EXTRA not in v.ring or extra_worker.proc.poll() is None, timeout=30)


def plugin_for(redis_url: str, voice: str, seed: int, max_tokens: int = 15) -> TTS:
    # A generous load bound: both of the test's turns stay on the owner instead of the second
    # spilling to worker-a (bounded loads would move it at 2 streams against 0).
    # The plugin's own cut: a turn without a sentence end waits for its end (the worker's cut would
    # speak it after max_buffer_delay_ms), so the waiting turn has no audio when its worker dies.
    return TTS(voice=voice, ring=redis_url, ring_settings=replace(ring_settings(redis_url), balance=4.0),
               options=ContextOptions(max_tokens=max_tokens, seed=seed), min_sentence_chars=MIN_SENTENCE_CHARS)


async def test_the_ring_routes_a_voice_to_its_owner_only(owned, redis_url):
    plugin = plugin_for(redis_url, owned, seed=91)
    try:
        assert await plugin.warm() == 1
        frames = [ev async for ev in plugin.synthesize("Where am I spoken?")]
        pool = plugin.transport.pool
        assert frames and len(pool.connections(EXTRA)) == 1 and pool.connections("worker-a") == ()
        assert pool.handshakes == 1
    finally:
        await plugin.aclose()


async def test_a_worker_killed_mid_turn_fails_the_speaking_turn_and_replays_the_waiting_one(
        owned, extra_worker, worker, redis_url):
    plugin = plugin_for(redis_url, owned, seed=92, max_tokens=7 * 80 + 1)
    pool = plugin.transport.pool
    try:
        await plugin.warm()
        speaking = plugin.stream()
        speaking.push_text("This line is being spoken when its worker crashes. ")
        heard = [await asyncio.wait_for(anext(aiter(speaking)), timeout=120)]
        plugin.update_options(options=SHORT)  # the turns from here on are short
        waiting = plugin.stream(conn_options=NO_RETRY)  # the framework may not retry: the pool must
        waiting.push_text("This line waits for the rest")  # no sentence end yet: no flush, no audio
        deadline = time.monotonic() + 30
        while pool.peer_stats(EXTRA).streams < 2:  # both contexts are open on the worker
            assert time.monotonic() < deadline, pool.peer_stats(EXTRA)
            await asyncio.sleep(0.05)

        os.killpg(extra_worker.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(extra_worker.proc.wait, 30)

        with pytest.raises(APIConnectionError) as lost:
            heard += [ev async for ev in speaking]
        await speaking.aclose()
        rest = " of its words, and is heard whole."
        waiting.push_text(rest)
        waiting.end_input()
        replayed = [ev async for ev in waiting]
        await waiting.aclose()

        nxt = await turn(plugin, "Is anyone still there?")  # the next turn works (the dead worker is skipped)
        assert nxt
        assert pool.connections(EXTRA) == () and len(pool.connections("worker-a")) == 1
    finally:
        await plugin.aclose()
    assert lost.value.retryable is False and lost.value.body["code"] == "worker_lost"
    assert EXTRA in str(lost.value) and "lost" in str(lost.value)
    # the replayed turn is exactly what worker-a says for the whole line, sent as the plugin sent it
    want = await direct_like_the_plugin(worker.url, ["This line waits for the rest", rest], SHORT, voice=owned,
                                       min_sentence_chars=MIN_SENTENCE_CHARS)
    got = b"".join(ev.frame.data.tobytes() for ev in replayed)
    assert want and got[:len(want)] == want and not any(got[len(want):])  # at most the framework's 10 ms marker


async def turn(plugin: TTS, text: str) -> list:
    stream = plugin.stream(conn_options=NO_RETRY)
    stream.push_text(text)
    stream.end_input()
    try:
        return [ev async for ev in stream]
    finally:
        await stream.aclose()
