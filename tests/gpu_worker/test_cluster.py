"""Any worker takes any request: three real `voicering worker` processes (the session worker A plus
B and C for this module) on the real vLLM engine, one shared voice store, one real Redis ring. A
start sent to a worker that does not own the voice is relayed to an owner over the pool's
persistent links and comes back byte-identical; cancels and disconnects reach the owner; a hop
marker is never forwarded again; an owner that dies mid-stream ends the context cleanly and the
next request finds another worker; SIGTERM drains."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from websockets.asyncio.client import connect

from gpu_worker.adapters import publish_adapter
from gpu_worker.client import WorkerClient, WorkerRequestError
from gpu_worker.protocol import UtteranceOptions
from hashring import RingSettings
from hashring.membership import RingWatcher
from hashring.placement import place
from hashring.store import RingStore
from tests.fixtures.models import CLUSTER_PREFIX, cluster_args, start_worker

IDS = ("worker-a", "worker-b", "worker-c")
VOICES = [f"clu/v{i}" for i in range(12)]
FAST = UtteranceOptions(max_tokens=15, seed=5)


@pytest.fixture(scope="module")
def cluster(worker, stand_in, adapter_store, redis_server, tmp_path_factory):
    for name in VOICES:
        if not (adapter_store / name).exists():
            publish_adapter(adapter_store / "tara", adapter_store, name)
    logs = tmp_path_factory.mktemp("cluster")

    def start(wid: str):
        return start_worker(stand_in, adapter_store, logs / f"{wid}.log", "--max-loras", "2", "--max-streams", "8",
                            *cluster_args(redis_server.url, wid), env={"VOICERING_WORKER_RING_PREFIX": CLUSTER_PREFIX})

    with ThreadPoolExecutor(2) as pool:
        b, c = pool.map(start, IDS[1:])
    workers = dict(zip(IDS, (worker, b, c), strict=True))
    yield workers
    for handle in (b, c):
        handle.stop()


@pytest.fixture
async def ring(cluster, redis_server):
    settings = RingSettings(redis_url=redis_server.url, prefix=CLUSTER_PREFIX)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        await watcher.wait_for(lambda v: all(w in v.ring for w in IDS), timeout=30)
        await asyncio.sleep(2.5)  # every worker's own watcher has refreshed past the joins too
        yield lambda voice: place(watcher.view, voice, settings).owners[0]


def owned_by(owner_of, wid: str) -> str:
    return next(v for v in VOICES if owner_of(v) == wid)


async def test_a_start_on_a_non_owner_is_served_by_the_owner_byte_identical(cluster, ring):
    voice = owned_by(ring, "worker-b")
    async with await WorkerClient.connect(cluster["worker-a"].url) as entry:
        relayed = await entry.say(voice, "Hello through a proxy.", options=FAST)
    async with await WorkerClient.connect(cluster["worker-b"].url) as owner:
        direct = await owner.say(voice, "Hello through a proxy.", options=FAST)
    assert relayed.done.stats.served_by == "worker-b" and relayed.done.stats.proxied is True
    assert direct.done.stats.served_by == "worker-b" and direct.done.stats.proxied is False
    assert relayed.pcm == direct.pcm and relayed.pcm


async def test_sixteen_contexts_through_one_worker_for_voices_of_all_three(cluster, ring):
    voices = [owned_by(ring, wid) for wid in IDS]
    clients = [await WorkerClient.connect(cluster["worker-a"].url) for _ in range(4)]  # 4 per connection: A's share
    try:
        results = await asyncio.gather(*(
            clients[i % 4].say(voices[i % 3], f"Line {i}.", options=UtteranceOptions(max_tokens=15, seed=i))
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


async def test_zz_an_owner_killed_mid_stream_ends_cleanly_and_the_next_request_is_served(cluster, ring):
    """SIGKILL of B while it streams a relayed context: that context ends with worker_lost (audio
    had reached the listener), and a new request for B's voice through A succeeds at once."""
    voice = owned_by(ring, "worker-b")
    async with await WorkerClient.connect(cluster["worker-a"].url) as client:
        stream = await client.start(voice, "I will be cut off.", options=UtteranceOptions(max_tokens=3000, seed=3))
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
        stream = await client.start(voice, "Let me finish.", options=UtteranceOptions(max_tokens=7 * 30 + 1, seed=4))
        await stream.end()
        async for _ in stream.audio():
            break
        c.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.5)
        late = await client.say(voice, "New start while draining.", options=FAST)  # relayed to another owner
        pcm = b"".join([chunk async for chunk in stream.audio()])
        assert stream.done.reason == "completed" and stream.done.stats.frames == 30 and pcm
    assert late.done.stats.served_by != "worker-c"
    await asyncio.to_thread(c.proc.wait, 60)
    assert c.proc.returncode == 0
    async with RingStore(RingSettings(redis_url=redis_server.url, prefix=CLUSTER_PREFIX)) as store:
        assert "worker-c" not in (await store.snapshot()).live
