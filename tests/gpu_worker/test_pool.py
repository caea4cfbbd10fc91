"""The worker pool against real components: the session `worker` (a real `voicering worker` on the
real vLLM engine, voices tara and leo, max_streams 8 so 4 per connection), the real Redis server,
and real sockets that misbehave.

No second worker process is started (each holds ~5 GiB). For ring routing the test registers the
real worker's URL in the ring itself, with `Heartbeat` + `WorkerInfo` (sometimes under two ids,
so two "workers" are one process), beside peers that are real sockets behaving badly: a port
with nothing listening (connection refused), a TCP server that accepts and never answers (the
handshake times out), and a websocket server that drops the connection at the first message.
Peer ids are chosen so that the misbehaving peer is the voice's first owner in the ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from websockets.asyncio.server import ServerConnection, serve

from gpu_worker.client import (NoWorkerAvailable, PoolSettings, RingRouter, Speech, WorkerClient, WorkerLost,
                               WorkerPool, WorkerRequestError)
from gpu_worker.orpheus import SAMPLES_PER_FRAME
from hashring.ports import free_port
from gpu_worker.protocol import ContextOptions
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import place
from hashring.records import WorkerInfo
from hashring.ring import Ring
from hashring.settings import RetryPolicy, RingSettings
from hashring.store import RingStore
from tests.fixtures.models import REPO

# a real worker on a loaded 2-core box can take seconds to its first audio (over 3 s beside another
# test process): the first-audio clock the tests set must be one a healthy worker always beats
# there, or it ejects the live worker too
FIRST_AUDIO_S = 8.0

VNODES = 64


def fast(seed: int = 1, max_tokens: int = 15) -> ContextOptions:
    return ContextOptions(max_tokens=max_tokens, seed=seed, trim_silence=False)


def ring_settings(redis_url: str) -> RingSettings:
    return RingSettings(redis_url=redis_url, prefix=f"test:pool:{uuid.uuid4().hex[:10]}", vnodes=VNODES,
                        heartbeat_interval_s=0.2, heartbeat_ttl_s=3.0, refresh_interval_s=0.25, redis_timeout_s=0.5,
                        retry=RetryPolicy(attempts=3, base_delay_s=0.02, max_delay_s=0.1))


def ids_with_owners(fixed: list[str], prefixes: list[str], wanted: dict[str, str]) -> list[str]:
    """Ids `prefix-i` (one per prefix) such that in a ring of `fixed` + them, each voice in
    `wanted` has as first owner the id made from the prefix it names."""
    for i in range(500):
        ids = [f"{p}-{i}" for p in prefixes]
        ring = Ring([*fixed, *ids], vnodes=VNODES)
        by_prefix = dict(zip(prefixes, ids, strict=True)) | {f: f for f in fixed}
        if all(ring.owner(voice) == by_prefix[owner] for voice, owner in wanted.items()):
            return ids
    raise AssertionError("no ids found")  # pragma: no cover - 500 tries of a 1-in-9 event


@contextlib.asynccontextmanager
async def ring_of(redis_url: str, peers: dict[str, str], load: Callable[[str], int] | None = None,
                  ) -> AsyncIterator[tuple[RingWatcher, RingSettings, RingStore]]:
    """A ring in the real Redis whose members are `peers` (id -> ws URL), heartbeating `load(id)`
    (what a real worker reports: its open streams) or 0."""
    settings = ring_settings(redis_url)
    async with RingStore(settings) as store:
        beats = [Heartbeat(store, WorkerInfo(wid, url, url, capacity=8),
                           **({"load": lambda wid=wid: load(wid)} if load else {})) for wid, url in peers.items()]
        for beat in beats:
            await beat.start()
        try:
            async with RingWatcher(store) as watcher:
                await watcher.wait_for(lambda v: {n.id for n in v.ring.nodes} == set(peers), timeout=10)
                yield watcher, settings, store
        finally:
            for beat in beats:
                await beat.aclose()


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[str, list[int]]]:
    """Accepts TCP connections and never says a word; yields its URL and a one-item accept count."""
    accepted = [0]

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client gives up
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def dropping_server() -> AsyncIterator[tuple[str, list[str]]]:
    """A websocket server that completes the handshake, then cuts the TCP connection when the
    first message arrives; yields its URL and the messages it got."""
    received: list[str] = []

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(message)
            ws.transport.abort()
            return

    async with serve(handler, "127.0.0.1", 0) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", received


@contextlib.asynccontextmanager
async def hung_server() -> AsyncIterator[tuple[str, list[dict]]]:
    """A websocket server that completes the handshake and reads every message, but never answers
    one (a worker whose engine hangs); yields its URL and the messages it got, parsed."""
    received: list[dict] = []

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(json.loads(message))

    async with serve(handler, "127.0.0.1", 0) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", received


def pcm_bytes(frames: int) -> int:
    return frames * SAMPLES_PER_FRAME * 2


async def test_concurrent_contexts_share_few_connections(worker):
    """8 at once with 4 per connection: the pool knows the share from the handshake (a worker
    says it), opens a second connection for the other four, and a second burst needs no handshake."""
    await worker.wait_idle()
    async with WorkerPool.static([worker.url]) as pool:
        voices = ["tara", "leo"] * 4
        held = await asyncio.gather(*(pool.start(v, f"Line number {i}.", options=fast(i)) for i, v in enumerate(voices)))
        # eight starts share the first dial; a `busy` answered while the burst is still being sent
        # may teach the pool the share early, so the last starts can already take a second connection
        assert pool.handshakes <= 2
        await asyncio.gather(*(stream.end() for stream in held))  # all eight live at once, four per connection

        async def collect(stream):
            pcm = b"".join([chunk async for chunk in stream.audio()])
            return Speech(pcm, stream.done, None, 0)

        first = await asyncio.gather(*(collect(stream) for stream in held))
        attempts = [stream.attempts for stream in held]
        assert set(attempts) <= {1, 2} and attempts.count(1) >= 4  # a refused start moved once, to the second link
        assert pool.handshakes == 2  # the refused four went to a second connection, not to a new one each
        await worker.wait_idle()
        second = await asyncio.gather(*(pool.say(v, f"Again {i}.", options=fast(i)) for i, v in enumerate(voices)))
        assert pool.handshakes == 2  # warm: no handshake per context
        for speech in first + second:
            assert speech.done.reason == "completed" and speech.done.stats.frames == 2
            assert len(speech.pcm) == pcm_bytes(2)
        stats = pool.peer_stats(worker.url)
        assert stats.links == 2 and stats.errors == 0 and stats.ejections == 0
    await worker.wait_idle()


async def test_routing_follows_placement_owners(worker, redis_url):
    """The one real worker under two ids: each voice goes to its placement owner, over that
    owner's own connection; with two replicas a second concurrent context takes the other one."""
    a, b = ids_with_owners([], ["wa", "wb"], {"tara": "wa", "leo": "wb"})
    pools: list[WorkerPool] = []

    def streams(worker_id: str) -> int:  # each id reports the streams open to it, as a worker would
        try:
            return sum(p.peer_stats(worker_id).streams for p in pools)
        except KeyError:  # the pool has not met this worker yet
            return 0

    async with ring_of(redis_url, {a: worker.url, b: worker.url}, streams) as (watcher, settings, store):
        async with WorkerPool(RingRouter(watcher, settings)) as pool:
            pools.append(pool)
            assert await pool.prewarm("tara") == 1
            assert pool.handshakes == 1 and len(pool.connections(a)) == 1 and not pool.connections(b)
            for voice in ("tara", "leo", "tara", "leo"):
                stream = await pool.start(voice, "Where do I go?", options=fast())
                await stream.end()
                pcm = b"".join([chunk async for chunk in stream.audio()])
                assert stream.worker_id == place(watcher.view, voice, settings).owners[0]
                assert stream.attempts == 1 and len(pcm) == pcm_bytes(stream.done.stats.frames)
            assert pool.handshakes == 2  # one per worker id, reused by every later context

            await store.set_replicas("tara", 2)
            # and both ids' reports caught up with the streams above: a report of wa's sent while its
            # tara stream was open, still the latest the watcher had, tied wa with wb's one open context
            # (a whole run beside two CPU burners sent both contexts to wb)
            await watcher.wait_for(lambda v: v.replicas.get("tara") == 2 and v.loads.get(a) == 0 == v.loads.get(b),
                                   timeout=30)
            held = await pool.start("tara", "", options=fast())  # open, nothing to say yet
            assert held.worker_id in (a, b)  # two random choices among the owners, equal loads
            other = await pool.start("tara", "Spill over.", options=fast(2))
            assert {other.worker_id, held.worker_id} == {a, b}  # the pool's own open since the report counts
            await other.end()
            assert [chunk async for chunk in other.audio()] and other.done.reason == "completed"
            await held.cancel()
            assert [chunk async for chunk in held.audio()] == []
    await worker.wait_idle()


async def test_refused_and_silent_peers_are_ejected_and_requests_still_succeed(worker, redis_url):
    live = "live"
    refused_id, silent_id = ids_with_owners([live], ["refused", "silent"], {"tara": "refused", "leo": "silent"})
    refused_url = f"ws://127.0.0.1:{free_port()}"  # nothing listens there
    settings = PoolSettings(open_timeout_s=1.0, max_ejected_share=0.7)
    async with silent_server() as (silent_url, accepted):
        peers = {live: worker.url, refused_id: refused_url, silent_id: silent_url}
        async with ring_of(redis_url, peers) as (watcher, ring, _), WorkerPool(RingRouter(watcher, ring), settings) as pool:
            began = time.monotonic()
            tara = await pool.say("tara", "Refused first.", options=fast(1))
            assert time.monotonic() - began < 10
            assert pool.ejected() == {refused_id}  # one refused connect ejects at once
            began = time.monotonic()
            leo = await pool.say("leo", "Silent first.", options=fast(2))
            assert 1.0 <= time.monotonic() - began  # the handshake timed out, then the live worker answered
            assert pool.ejected() == {refused_id, silent_id}
            for speech in (tara, leo):
                assert speech.done.reason == "completed" and len(speech.pcm) == pcm_bytes(2)
            # while ejected they are skipped without a dial: nothing waits for the silent one again
            began = time.monotonic()
            streams = [await pool.start(v, "Skip them.", options=fast(3)) for v in ("tara", "leo", "tara", "leo")]
            assert time.monotonic() - began < 1.0
            for stream in streams:
                assert stream.worker_id == live and stream.attempts == 1
                await stream.end()
                assert [chunk async for chunk in stream.audio()]
            assert pool.peer_stats(refused_id).dials == 1 and pool.peer_stats(silent_id).dials == 1
            assert accepted[0] == 1
            for pid in (refused_id, silent_id):
                stats = pool.peer_stats(pid)
                assert stats.ejections == 1 and stats.ejection_s == 30.0 and 0 < stats.ejected_for_s <= 30  # still ejected (a loaded box may take 10 s+ to get here)
            assert pool.handshakes == 1  # only the live worker ever answered
    await worker.wait_idle()


async def test_an_ejected_peer_is_probed_after_its_backoff_and_ejected_longer(worker, redis_url):
    live = "live"
    (refused_id,) = ids_with_owners([live], ["refused"], {"tara": "refused"})
    settings = PoolSettings(ejection_base_s=0.3, ejection_max_s=60.0, max_ejected_share=0.5)
    peers = {live: worker.url, refused_id: f"ws://127.0.0.1:{free_port()}"}
    async with ring_of(redis_url, peers) as (watcher, ring, _), WorkerPool(RingRouter(watcher, ring), settings) as pool:
        first = await pool.start("tara", "One.", options=fast())
        assert first.worker_id == live and first.attempts == 2  # refused, then the next owner
        second = await pool.start("tara", "Two.", options=fast())
        assert second.attempts == 1 and pool.peer_stats(refused_id).dials == 1  # skipped while ejected
        for stream in (first, second):
            await stream.end()
            assert [chunk async for chunk in stream.audio()]
        while pool.ejected():
            await asyncio.sleep(0.05)
        third = await pool.say("tara", "Three.", options=fast())  # the probe: dialed again, refused again
        assert third.done.reason == "completed"
        stats = pool.peer_stats(refused_id)
        assert stats.dials == 2 and stats.ejections == 2 and stats.ejection_s == pytest.approx(0.6)
    await worker.wait_idle()


async def test_a_peer_that_takes_the_start_and_never_answers_is_timed_out_ejected_and_skipped(worker, redis_url):
    """A peer that completes the handshake, takes the start and then says nothing: once the
    context is asked to speak (its end), it waits `first_audio_timeout_s`, then the context is
    cancelled there, the peer ejected, and the context speaks on the next owner, whole."""
    live = "live"
    (hung_id,) = ids_with_owners([live], ["hung"], {"tara": "hung"})
    settings = PoolSettings(first_audio_timeout_s=FIRST_AUDIO_S, max_ejected_share=0.5)
    async with hung_server() as (hung_url, received):
        peers = {live: worker.url, hung_id: hung_url}
        async with ring_of(redis_url, peers) as (watcher, ring, _), WorkerPool(RingRouter(watcher, ring), settings) as pool:
            stream = await pool.start("tara", "Anyone there?", options=fast(4))
            assert stream.worker_id == hung_id
            await asyncio.sleep(FIRST_AUDIO_S + 0.5)  # not asked to speak yet: no clock runs (text may still be coming)
            assert pool.ejected() == set()
            began = time.monotonic()
            await stream.end()
            pcm = b"".join([chunk async for chunk in stream.audio()])
            assert FIRST_AUDIO_S <= time.monotonic() - began < FIRST_AUDIO_S + 30
            assert stream.worker_id == live and stream.attempts == 2 and stream.done.reason == "completed"
            assert len(pcm) == pcm_bytes(2)
            assert [m["type"] for m in received] == ["start", "end", "cancel"]  # the hung try was cancelled there
            assert pool.ejected() == {hung_id}
            again = await pool.start("tara", "Skip it.", options=fast(5))
            assert again.worker_id == live and again.attempts == 1
            await again.end()
            assert [chunk async for chunk in again.audio()]
    await worker.wait_idle()


async def test_a_flush_with_nothing_to_say_starts_no_first_audio_clock(worker):
    """A caller that opens a context and flushes nothing (empty start, empty flushes) has asked
    for no audio: the worker is not hung and must not be ejected for it (issue 19: a tenant could
    otherwise get a worker of the shared fleet ejected at will). Text, then a flush, starts the clock."""
    async with WorkerPool.static([worker.url], PoolSettings(first_audio_timeout_s=FIRST_AUDIO_S)) as pool:
        stream = await pool.start("tara", "", options=fast(6))
        for _ in range(3):
            await stream.flush()
        await stream.push("   ")
        await stream.flush()
        audio = stream.audio()
        with pytest.raises(TimeoutError):  # nothing comes, and nothing times the worker out
            await asyncio.wait_for(anext(audio), FIRST_AUDIO_S + 1.5)
        assert pool.ejected() == set() and stream.attempts == 1
        await stream.push("Now something.")
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
        assert stream.done.reason == "completed" and len(pcm) == pcm_bytes(stream.done.stats.frames) > 0
        assert stream.attempts == 1 and pool.ejected() == set()
    await worker.wait_idle()


async def test_with_no_other_worker_a_hung_peer_ends_the_context_with_worker_timeout(redis_url):
    async with hung_server() as (hung_url, _):
        async with WorkerPool.static([hung_url], PoolSettings(first_audio_timeout_s=0.5, max_attempts=2)) as pool:
            stream = await pool.start("tara", "Hello?", options=fast())
            await stream.end()
            with pytest.raises(WorkerRequestError) as err:
                async for _ in stream.audio():
                    pass
    assert err.value.error.code == "worker_timeout" and err.value.retryable


async def test_workers_that_left_the_ring_are_forgotten(worker, redis_url):
    settings = ring_settings(redis_url)
    async with RingStore(settings) as store:
        stay = Heartbeat(store, WorkerInfo("stays", worker.url, worker.url, capacity=8))
        leave = Heartbeat(store, WorkerInfo("leaves", worker.url, worker.url, capacity=8))
        await stay.start()
        await leave.start()
        try:
            async with RingWatcher(store) as watcher, WorkerPool(RingRouter(watcher, settings)) as pool:
                await watcher.wait_for(lambda v: {n.id for n in v.ring.nodes} == {"stays", "leaves"}, timeout=10)
                owner = {wid: next(f"v{i}" for i in range(200) if place(watcher.view, f"v{i}", settings).owners[0] == wid)
                         for wid in ("stays", "leaves")}
                for voice in owner.values():
                    assert await pool.prewarm(voice) == 1
                assert set(pool._peers) == {"stays", "leaves"}
                await leave.aclose()
                await watcher.wait_for(lambda v: {n.id for n in v.ring.nodes} == {"stays"}, timeout=10)
                for ws in pool.connections("leaves"):
                    await ws.close()
                while pool.connections("leaves"):
                    await asyncio.sleep(0.05)
                speech = await pool.say("tara", "Still one.", options=fast())
                assert speech.done.reason == "completed" and set(pool._peers) == {"stays"}
        finally:
            await stay.aclose()
    await worker.wait_idle()


async def test_retry_before_audio_is_transparent(worker, redis_url):
    """The voice's owner drops the connection at `start`: the context, with the text pushed so
    far, is replayed on the next owner, and the caller gets exactly the audio a direct request gets."""
    live = "live"
    (dropper_id,) = ids_with_owners([live], ["dropper"], {"tara": "dropper"})
    async with dropping_server() as (dropper_url, received):
        peers = {live: worker.url, dropper_id: dropper_url}
        async with ring_of(redis_url, peers) as (watcher, ring, _), WorkerPool(RingRouter(watcher, ring)) as pool:
            stream = await pool.start("tara", "Hello there, ", options=fast(5, max_tokens=7 * 6))
            assert stream.worker_id == dropper_id
            await stream.push("how are you?")
            await stream.end()
            chunks = [chunk async for chunk in stream.audio()]
            assert stream.worker_id == live and stream.attempts == 2
            assert len(received) >= 1 and '"type":"start"' in received[0]
            assert pool.peer_stats(dropper_id).errors == 1 and not pool.ejected()  # one drop is not an outlier
    async with await WorkerClient.connect(worker.url) as client:
        direct = await client.say("tara", "Hello there, how are you?", options=fast(5, max_tokens=7 * 6))
    assert stream.done is not None and stream.done.stats.frames == direct.done.stats.frames
    assert b"".join(chunks) == direct.pcm  # nothing duplicated, nothing lost
    await worker.wait_idle()


async def test_a_link_cut_after_audio_ends_the_stream_then_the_pool_reconnects(worker):
    await worker.wait_idle()
    async with WorkerPool.static([worker.url]) as pool:
        stream = await pool.start("leo", "A long sentence that will not be finished.", options=fast(7, max_tokens=7 * 200))
        await stream.end()
        got = 0
        with pytest.raises(WorkerLost) as lost:
            async for _ in stream.audio():
                got += 1
                if got == 1:
                    (ws,) = pool.connections(worker.url)
                    ws.transport.abort()  # cut the pool's own link mid-stream
        assert got >= 1 and stream.done is None
        assert lost.value.error.code == "worker_lost" and not lost.value.retryable
        assert stream.attempts == 1  # audio had been relayed: never retried
        assert pool.connections(worker.url) == ()
        again = await pool.say("leo", "Back again.", options=fast(8))
        assert again.done.reason == "completed" and len(again.pcm) == pcm_bytes(2)
        assert pool.handshakes == 2 and len(pool.connections(worker.url)) == 1
    await worker.wait_idle()


async def test_an_old_connection_serves_its_contexts_while_new_ones_use_a_fresh_one(worker):
    await worker.wait_idle()
    async with WorkerPool.static([worker.url], PoolSettings(max_connection_age_s=0.5)) as pool:
        old = await pool.start("tara", "Started on the old one.", options=fast(1))
        (old_ws,) = pool.connections(worker.url)
        await asyncio.sleep(0.6)
        young = await pool.say("leo", "On a fresh one.", options=fast(2))
        assert young.done.reason == "completed" and pool.handshakes == 2
        await old.end()
        assert len(b"".join([chunk async for chunk in old.audio()])) == pcm_bytes(2)  # finished where it began
        await old_ws.wait_closed()  # closed once its last context ended
        assert len(pool.connections(worker.url)) == 1 and old_ws not in pool.connections(worker.url)
    await worker.wait_idle()


async def test_rejected_messages_do_not_end_the_stream_and_aclose_leaves_no_task(worker):
    await worker.wait_idle()
    before = asyncio.all_tasks()
    pool = WorkerPool.static([worker.url])
    async with pool:
        assert await pool.prewarm([worker.url]) == 1 and pool.handshakes == 1
        stream = await pool.start("tara", "Refuse my next push.", options=fast(3))
        await stream.end()
        await stream.push("text after end")  # refused by the worker, with no effect on the stream
        pcm = b"".join([chunk async for chunk in stream.audio()])
        assert stream.done.reason == "completed" and len(pcm) == pcm_bytes(2)
        assert [(r.code, r.message_type) for r in stream.rejected] == [("bad_request", "text")]
        assert pool.handshakes == 1  # prewarmed: the context found its connection open
        pending = await pool.start("leo", "Never ended.", options=fast(4))
    with pytest.raises(NoWorkerAvailable) as closed:  # aclose ended it before any audio: not retried anywhere
        async for _ in pending.audio():
            pass
    assert closed.value.error.code == "no_worker"
    leftover = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()]
    assert leftover == []
    await worker.wait_idle()


def test_the_pool_never_imports_torch_or_vllm():
    code = ("import sys, gpu_worker.client.pool; heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm'}); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
