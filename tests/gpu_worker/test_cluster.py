"""Any worker takes any request: three real `voicering worker` processes (the session worker A plus
B and C for this module) on the real vLLM engine, one shared voice store, one real Redis ring. A
start sent to a worker that does not own the voice is relayed to an owner over the pool's
persistent links and comes back byte-identical; cancels and disconnects reach the owner; a hop
marker is never forwarded again; an owner that dies mid-stream ends the context cleanly and the
next request finds another worker; SIGTERM drains. The fleet bench's short run uses the same three
workers (so the suite starts B and C once), before the tests that kill them."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from gpu_worker.adapters import publish_adapter
from gpu_worker.client import MAX_CONNECTION_ERRORS, WorkerClient, WorkerRequestError, collect
from gpu_worker.protocol import ContextOptions, PronunciationRef
from gpu_worker.text import Dictionary
from hashring import RingSettings
from hashring.membership import RingWatcher
from hashring.placement import ReplicaControl, place
from hashring.store import RingStore
from tests.fixtures.models import CLUSTER_PREFIX, SESSION_RING_ENV, cluster_args, start_worker, stop_workers

OWN_WORKERS = 2  # workers B and C of the session ring (tests/fixtures/fleet.py)

VOICERING = Path(sys.executable).parent / "voicering"

IDS = ("worker-a", "worker-b", "worker-c")
VOICES = [f"clu/v{i}" for i in range(40)]
FAST = ContextOptions(max_tokens=15, seed=5)
# B and C: the session ring's clocks, and a drain that lets a stream finish however loaded the box
# (test_zzz times nothing; production's 30 s grace ran out beside two CPU burners)
CLUSTER_ENV = {**SESSION_RING_ENV, "VOICERING_WORKER_DRAIN_GRACE_S": "300"}


@pytest.fixture(scope="module")
def cluster(worker, stand_in, adapter_store, redis_server, tmp_path_factory):
    for name in VOICES:
        if not (adapter_store / name).exists():
            publish_adapter(adapter_store / "tara", adapter_store, name)
    logs = tmp_path_factory.mktemp("cluster")

    def start(wid: str):
        return start_worker(stand_in, adapter_store, logs / f"{wid}.log", "--max-loras", "2", "--max-streams", "8",
                            *cluster_args(redis_server.url, wid), env=CLUSTER_ENV)

    with ThreadPoolExecutor(2) as pool:
        b, c = pool.map(start, IDS[1:])
    workers = dict(zip(IDS, (worker, b, c), strict=True))
    yield workers
    stop_workers(b, c)


def alive(cluster) -> list[str]:
    return [wid for wid, handle in cluster.items() if handle.proc.poll() is None]


async def in_step(cluster, watcher: RingWatcher, timeout: float = 30, *, streaming: str | None = None) -> None:
    """Wait until every live worker is idle and its own ring view is the test's view (same epoch,
    same size) with every heartbeat load back at 0: then the test's idea of where a voice goes
    (its placement owner; bounded-load routing spills from a worker still counted busy) is every
    worker's idea too. ``streaming``: a worker out of the ring (drained) whose own streams may go
    on; its load counts in no ring, so it cannot sway routing."""
    deadline = time.monotonic() + timeout
    while True:
        view = watcher.view
        healths = {wid: await asyncio.to_thread(cluster[wid].health) for wid in alive(cluster)}
        assert streaming is None or streaming not in view.ring, f"{streaming} still in the ring"
        if (not any(view.loads.values())
                and all(h.get("ring_epoch") == view.epoch and h.get("ring_workers") == len(view.ring)
                        and h.get("ring_load") == 0 and (wid == streaming or h["active_streams"] == 0)
                        and h["relayed_streams"] == 0
                        for wid, h in healths.items())):
            return
        assert time.monotonic() < deadline, f"workers never caught up with ring epoch {view.epoch}: {healths}"
        await asyncio.sleep(0.2)


def ring_settings(redis_server) -> RingSettings:
    return RingSettings(redis_url=redis_server.url, prefix=CLUSTER_PREFIX)


@pytest.fixture
async def ring(cluster, redis_server):
    settings = ring_settings(redis_server)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        live = alive(cluster)
        # exactly the live workers: a worker an earlier test killed leaves once its heartbeat is
        # stale (5 s), and a placement that still counts it sends voices to a dead owner
        await watcher.wait_for(lambda v: all(w in v.ring for w in live) and len(v.ring) == len(live), timeout=30)
        await in_step(cluster, watcher)
        yield lambda voice: place(watcher.view, voice, settings).owners[0]


_USED: set[str] = set()


def owned_by(owner_of, wid: str) -> str:
    """A voice `wid` owns that no earlier test used (so no adapter, heat or replica count carries over)."""
    voice = next(v for v in VOICES if v not in _USED and owner_of(v) == wid)
    _USED.add(voice)
    return voice


async def test_a_start_on_a_non_owner_is_served_by_the_owner_byte_identical(cluster, ring):
    voice = owned_by(ring, "worker-b")
    async with await WorkerClient.connect(cluster["worker-a"].url) as entry:
        relayed = await entry.say(voice, "Hello through a proxy.", options=FAST)
    async with await WorkerClient.connect(cluster["worker-b"].url) as owner:
        direct = await owner.say(voice, "Hello through a proxy.", options=FAST)
    assert relayed.done.stats.served_by == "worker-b" and relayed.done.stats.proxied is True
    assert direct.done.stats.served_by == "worker-b" and direct.done.stats.proxied is False
    assert relayed.pcm == direct.pcm and relayed.pcm


async def test_a_relayed_context_carries_the_owner_s_word_timings(cluster, ring):
    voice = owned_by(ring, "worker-b")
    options = replace(FAST, max_tokens=7 * 8 + 1, alignment="word")
    timed = {}
    for entry in ("worker-a", "worker-b"):
        async with await WorkerClient.connect(cluster[entry].url, version=2) as client:
            stream = await client.start(voice, "I paid $5, okay?", options=options)
            timed[entry] = (await collect(stream), stream)
    (relayed, via_a), (direct, via_b) = timed["worker-a"], timed["worker-b"]
    assert relayed.done.stats.proxied is True and relayed.done.stats.served_by == "worker-b"
    assert relayed.pcm == direct.pcm
    assert {a.context_id for a in via_a.alignments} == {via_a.context_id}  # the caller's id, not the hop's
    words = [(w.text, w.start_s, w.end_s) for a in via_a.alignments for w in a.words]
    direct_words = [(w.text, w.start_s, w.end_s) for a in via_b.alignments for w in a.words]
    assert [w[0] for w in words] == [w[0] for w in direct_words] == ["I", "paid", "$5", "okay"]
    # the same times to espeak-ng's reproducibility (tests/gateway/test_livekit_tts.py says why)
    assert [w[1:] for w in words] == [pytest.approx(w[1:], abs=0.02) for w in direct_words]


async def test_a_relayed_context_keeps_its_prompt_window_at_the_owner(cluster, ring):
    """Continuity survives a relay: the owner speaks every segment, so it holds the window, and the
    audio equals the owner's own with the same window."""
    voice = owned_by(ring, "worker-b")
    spoken = {}
    for entry in ("worker-a", "worker-b"):
        async with await WorkerClient.connect(cluster[entry].url) as client:
            stream = await client.start(voice, "The first part of it.", options=replace(FAST, max_tokens=7 * 20 + 1))
            await stream.flush()
            await stream.push("And the second part.")
            spoken[entry] = await collect(stream)
    relayed, direct = spoken["worker-a"], spoken["worker-b"]
    assert relayed.done.stats.proxied is True and relayed.done.stats.served_by == "worker-b"
    assert relayed.done.stats.window_tokens == direct.done.stats.window_tokens > 7 * 20
    assert relayed.pcm == direct.pcm


async def test_a_relayed_start_reads_its_pronunciations_once_at_the_owner(cluster, ring, redis_server):
    """The references travel with the relayed start; the owner reads the dictionary and applies it
    (before normalization, once): equal to the owner speaking the rewritten text directly."""
    voice = owned_by(ring, "worker-b")
    dictionary = Dictionary.from_json({"name": "names", "rules": [{"written": "Who", "spoken": "Hoo"}]})
    key = f"{CLUSTER_PREFIX}:t:t_relay{uuid.uuid4().hex[:6]}:pronunciations"
    redis = aioredis.from_url(redis_server.url, decode_responses=True)
    try:
        await redis.hset(key, "names", json.dumps({"name": "names", "version": dictionary.version,
                                                   **dictionary.to_json()}))
        refs = (PronunciationRef(key, "names", dictionary.version),)
        async with await WorkerClient.connect(cluster["worker-a"].url) as entry:
            relayed = await entry.say(voice, "Dr. Who.", options=replace(FAST, pronunciations=refs))
        async with await WorkerClient.connect(cluster["worker-b"].url) as owner:
            direct = await owner.say(voice, "Doctor Hoo.", options=FAST)
            unread = await owner.say(voice, "Doctor Who.", options=FAST)
    finally:
        await redis.delete(key)
        await redis.aclose()
    assert relayed.done.stats.served_by == "worker-b" and relayed.done.stats.proxied is True
    assert relayed.pcm == direct.pcm != unread.pcm


async def test_sixteen_contexts_through_one_worker_for_voices_of_all_three(cluster, ring):
    voices = [owned_by(ring, wid) for wid in IDS]
    clients = [await WorkerClient.connect(cluster["worker-a"].url) for _ in range(4)]  # 4 per connection: A's share
    try:
        results = await asyncio.gather(*(
            clients[i % 4].say(voices[i % 3], f"Line {i}.", options=ContextOptions(max_tokens=15, seed=i))
            for i in range(16)))
    finally:
        for client in clients:
            await client.aclose()
    assert all(r.done.reason == "completed" and r.done.stats.frames == 2 for r in results)
    assert {r.done.stats.served_by for r in results} == set(IDS)
    assert all(r.done.stats.proxied == (r.done.stats.served_by != "worker-a") for r in results)
    for handle in cluster.values():
        await handle.wait_idle()


@pytest.mark.parametrize("how", ["cancel", "disconnect"])
async def test_cancel_or_disconnect_of_a_proxied_context_frees_the_owner(cluster, ring, how):
    voice = owned_by(ring, "worker-c")
    ws = await connect(cluster["worker-a"].url)
    await ws.send(json.dumps({"type": "start", "context_id": "long", "voice": voice, "text": "A long one.",
                              "options": {"max_tokens": 3000, "seed": 2}}))
    await ws.send(json.dumps({"type": "end", "context_id": "long"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
        pass  # first relayed audio: the owner is generating
    assert (await asyncio.to_thread(cluster["worker-c"].health))["active_streams"] == 1
    if how == "cancel":
        await ws.send(json.dumps({"type": "cancel", "context_id": "long"}))
        while True:
            msg = await asyncio.wait_for(ws.recv(), 30)
            if not isinstance(msg, bytes):
                assert json.loads(msg)["reason"] == "cancelled"
                break
        await ws.close()
    else:
        ws.transport.abort()
    await cluster["worker-c"].wait_idle()  # the owner's engine request was aborted
    await cluster["worker-a"].wait_idle()


async def test_a_proxied_start_is_never_forwarded_again(cluster, ring):
    voice = owned_by(ring, "worker-c")
    async with connect(cluster["worker-b"].url) as ws:  # B does not own it, but the hop marker says: serve here
        await ws.send(json.dumps({"type": "start", "context_id": "hop", "voice": voice, "text": "Hi.",
                                  "proxied_by": "worker-x", "options": {"max_tokens": 15, "seed": 1}}))
        await ws.send(json.dumps({"type": "end", "context_id": "hop"}))
        while isinstance(msg := await asyncio.wait_for(ws.recv(), 60), bytes):
            pass
    done = json.loads(msg)
    assert done["type"] == "done" and done["stats"]["served_by"] == "worker-b" and done["stats"]["proxied"] is True


async def test_the_owner_s_errors_are_relayed_as_they_came(cluster, ring):
    async with await WorkerClient.connect(cluster["worker-a"].url) as client:
        with pytest.raises(WorkerRequestError) as err:
            await client.say("clu/nobody-published-this", "Hi.", options=FAST)
    assert err.value.error.code == "unknown_voice" and not err.value.retryable


async def test_a_client_keeps_only_the_latest_connection_errors(cluster, ring):
    """Refusals for a context that has ended are not tied to a live stream: the client keeps the
    latest MAX_CONNECTION_ERRORS of them and counts the rest, however many the worker sends."""
    sent = 3 * MAX_CONNECTION_ERRORS
    async with await WorkerClient.connect(cluster["worker-a"].url) as client:
        stream = await client.start(owned_by(ring, "worker-a"), "Done soon.", options=FAST)
        await collect(stream)
        for i in range(sent):
            await stream.push(f"too late {i}")  # the context has ended: each push is refused
        deadline = time.monotonic() + 30
        while client.connection_errors_total < sent:
            assert time.monotonic() < deadline, f"only {client.connection_errors_total} of {sent} refusals came back"
            await asyncio.sleep(0.05)
        assert len(client.connection_errors) == MAX_CONNECTION_ERRORS
        assert all(e.code == "bad_request" and e.context_id == stream.context_id for e in client.connection_errors)
        await client.say(owned_by(ring, "worker-a"), "Still fine.", options=FAST)  # the link lives on


async def test_scaling_a_voice_prewarms_it_on_its_new_owner(cluster, ring, redis_server, adapter_store):
    """`voicering ring scale VOICE 2`: the voice's new second owner loads its adapter on its own,
    before any request for it arrives there. The voice is published now, after every worker's
    start-up prewarm, so no worker holds it yet."""
    settings = ring_settings(redis_server)
    voice = f"clu/scaled-{uuid.uuid4().hex[:8]}"
    publish_adapter(adapter_store / "tara", adapter_store, voice)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        second = watcher.view.ring.owners(voice, 2)[1]
        log = cluster[second].log_path
        loaded = f"adapter for voice {voice} loaded"
        assert loaded not in log.read_text()
        await ReplicaControl(store).scale(voice, 2)
        try:
            deadline = time.monotonic() + 30
            while loaded not in log.read_text():
                assert time.monotonic() < deadline, f"{second} never prewarmed {voice}"
                await asyncio.sleep(0.2)
        finally:
            await ReplicaControl(store).scale(voice, None)


async def test_requests_through_the_entry_feed_the_voice_s_heat(cluster, ring, redis_server):
    """The entry worker counts each request it takes for the autoscaler (batched, off the request path)."""
    voice = VOICES[-2]
    settings = ring_settings(redis_server)
    async with RingStore(settings) as store:
        before = (await store.peek_heat([voice])).get(voice, 0.0)
        async with await WorkerClient.connect(cluster["worker-a"].url) as client:
            for i in range(3):
                await client.say(voice, "Count me.", options=ContextOptions(max_tokens=15, seed=i))
        deadline = time.monotonic() + 10
        while (await store.peek_heat([voice])).get(voice, 0.0) <= before:
            assert time.monotonic() < deadline, "the requests were never counted"
            await asyncio.sleep(0.2)


async def test_redis_killed_and_restarted_during_traffic(cluster, ring, redis_server):
    """Redis dies: routing goes on from every worker's cached ring (B's voice through A still reaches
    B). Redis comes back empty: every worker registers again on its own and routing is as before."""
    voice = owned_by(ring, "worker-b")
    async with await WorkerClient.connect(cluster["worker-a"].url) as client:
        redis_server.kill()
        try:
            await asyncio.sleep(1.5)  # every worker has had a heartbeat and a refresh fail by now
            during = [await client.say(voice, f"Redis is gone {i}.", options=FAST) for i in range(2)]
        finally:
            redis_server.restart()
        assert all(r.done.stats.served_by == "worker-b" and r.done.stats.proxied for r in during)
        async with RingStore(ring_settings(redis_server)) as store, RingWatcher(store) as watcher:
            await watcher.wait_for(lambda v: all(w in v.ring for w in IDS), timeout=30)
            await in_step(cluster, watcher)
            after = await client.say(voice, "Redis is back.", options=FAST)
    assert after.done.stats.served_by == "worker-b" and after.done.stats.proxied


async def ring_cli(redis_server, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(VOICERING), "ring", "--prefix", CLUSTER_PREFIX, *args, "--redis", redis_server.url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def test_ring_drain_under_traffic_moves_new_starts_and_lets_streams_finish(cluster, ring, redis_server):
    """`voicering ring drain worker-c` while C streams: that stream finishes whole, new starts for
    C's voice go to another owner (also those sent to C itself: C relays them), and `ring undrain`
    gives the voice back to C."""
    voice = owned_by(ring, "worker-c")
    frames = 60
    async with await WorkerClient.connect(cluster["worker-c"].url) as on_c, \
            await WorkerClient.connect(cluster["worker-a"].url) as on_a, \
            RingStore(ring_settings(redis_server)) as store, RingWatcher(store) as watcher:
        stream = await on_c.start(voice, "Keep going.", options=ContextOptions(max_tokens=7 * frames + 1, seed=6))
        await stream.end()
        rest = asyncio.create_task(collect_pcm(stream))
        try:
            assert "draining" in await ring_cli(redis_server, "drain", "worker-c")
            await watcher.wait_for(lambda v: "worker-c" not in v.ring, timeout=10)
            # C's own 60-frame stream goes on meanwhile: waiting here for it to end too made the
            # wait hang on how fast a loaded 2-core box generates 60 frames (it flaked at 30 s).
            await in_step(cluster, watcher, streaming="worker-c")
            via_a = await on_a.say(voice, "Not on C.", options=FAST)
            via_c = await on_c.say(voice, "Sent to C.", options=FAST)
            pcm = await asyncio.wait_for(rest, 180)  # it finishes whole, however slow the box
        finally:
            await ring_cli(redis_server, "undrain", "worker-c")
        assert stream.done.reason == "completed" and stream.done.stats.frames == frames and pcm
        assert via_a.done.stats.served_by not in ("worker-c", None)
        assert via_c.done.stats.served_by != "worker-c" and via_c.done.stats.proxied
        await watcher.wait_for(lambda v: "worker-c" in v.ring, timeout=10)
        await in_step(cluster, watcher)
        back = await on_a.say(voice, "C again.", options=FAST)
    assert back.done.stats.served_by == "worker-c"


async def test_the_fleet_bench_s_short_run_relays_no_placed_request_and_loses_none(cluster, redis_server,
                                                                                  adapter_store):
    """`voicering bench fleet`'s measurement (bench.fleet.measure: two gateways' pools, zipf traffic,
    a burst of the fleet's capacity) on this module's three workers, short: no placed request is
    relayed, none is lost, and every figure is there. Its smoke run (tests/test_bench_smoke.py's
    map): here, before the tests that kill B and C, so the suite starts these workers once."""
    from bench.fleet import TARGETS, VOICES as FLEET_VOICES, measure, publish_voices

    publish_voices(adapter_store / "tara", adapter_store)
    assert not set(FLEET_VOICES) & set(VOICES)  # its voices are not this module's
    # a burst of 6, not the fleet's 24: the smoke runs the stage (the 24 took ~35 s here, two of them
    # timed out at the pools' 30 s on 2 cores: the full bench's burst_served_fraction says so)
    figures = await measure(cluster, redis_server.url, CLUSTER_PREFIX, run_s=5.0, warmup_s=1.0, streams=6,
                            burst_size=6)
    for key in ("requests", "needless_hops", "spill_fraction", "pool_spill_fraction", "busiest_over_mean",
                "refusals_per_request", "insisted_per_request", "worker_refusals_per_request", "lost_contexts",
                "hot_voice_replicas_start", "hot_voice_replicas_end", "adapter_loads_per_1000", "targets_met"):
        assert key in figures, key
    assert set(figures["targets_met"]) == set(TARGETS)
    assert figures["requests"] > 0 and figures["served"] > 0
    assert figures["needless_hops"] == 0 and figures["warmup_needless_hops"] == 0, figures
    assert figures["lost_contexts"] == 0 and figures["warmup_lost_contexts"] == 0, figures
    assert set(figures["served_by"]) <= set(cluster)
    assert figures["burst_requests"] == 6 and "burst_served_fraction" in figures and "burst_targets_met" in figures


async def collect_pcm(stream) -> bytes:
    return b"".join([chunk async for chunk in stream.audio()])


async def test_zz_an_owner_killed_mid_stream_ends_cleanly_and_the_next_request_is_served(cluster, ring):
    """SIGKILL of B while it streams a relayed context: that context ends with worker_lost (audio
    had reached the listener), and a new request for B's voice through A succeeds at once."""
    voice = owned_by(ring, "worker-b")
    async with await WorkerClient.connect(cluster["worker-a"].url) as client:
        stream = await client.start(voice, "I will be cut off.", options=ContextOptions(max_tokens=3000, seed=3))
        await stream.end()
        chunks = 0
        with pytest.raises(WorkerRequestError) as err:
            async for _ in stream.audio():
                chunks += 1
                if chunks == 1:
                    import os
                    os.killpg(cluster["worker-b"].proc.pid, signal.SIGKILL)
        assert err.value.error.code == "worker_lost" and not err.value.retryable
        began = time.monotonic()
        after = await client.say(voice, "Still here?", options=FAST)
        assert after.done.reason == "completed" and after.done.stats.served_by in ("worker-a", "worker-c")
        assert time.monotonic() - began < 30


async def test_zzz_sigterm_drains_streams_finish_and_the_worker_leaves_the_ring(cluster, ring, redis_server):
    voice = owned_by(ring, "worker-c")
    c = cluster["worker-c"]
    async with await WorkerClient.connect(c.url) as client:
        # no `end` until the late start: the context stays open however fast the box speaks it (ended
        # at once, it finished within the 1.5 s this test used to sleep on an idle box, the drain
        # then closed the connection, and the late start found it gone)
        stream = await client.start(voice, "Let me finish.", options=ContextOptions(max_tokens=7 * 30 + 1, seed=4))
        await stream.flush()
        async for _ in stream.audio():
            break
        c.proc.send_signal(signal.SIGTERM)
        others = len(alive(cluster)) - 1  # B is dead if test_zz ran, and out of the ring (`ring`)
        await c.wait_ring_view(others, timeout=60)  # out of its own view: draining
        late = await client.say(voice, "New start while draining.", options=FAST)  # relayed to another owner
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
        assert stream.done.reason == "completed" and stream.done.stats.frames == 30 and pcm
    assert late.done.stats.served_by != "worker-c"
    await asyncio.to_thread(c.proc.wait, 60)
    assert c.proc.returncode == 0
    async with RingStore(ring_settings(redis_server)) as store:
        assert "worker-c" not in (await store.snapshot()).live
