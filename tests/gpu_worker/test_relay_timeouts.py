"""The relay's clocks, against real `voicering worker` processes in their own ring: an entry worker
with a short ``idle_timeout_s`` and an owner (the real vLLM engine on stand-in weights).

- M4 (issue 20): a relayed context is idle only while neither text comes in nor audio comes
  back; the entry used to end it with ``idle_timeout`` while the owner was still speaking.
- L5 (issue 20): an owner that never speaks is this hop's to give up on. The entry's relay
  deadline (`RELAY_TIMEOUT_S`, 20 s) fires before the caller's pool waits out its own
  ``first_audio_timeout_s`` (30 s, the gateway's default), and its retryable ``worker_timeout``
  is taken by that pool as an answer: the entry worker is not ejected. The owner that never
  speaks is a small real websocket server written here (it takes the link and every message and
  answers none), registered in the same Redis ring with a real heartbeat, because a real worker
  cannot be made to hang on demand.
- Issue 22 (item 5): one request followed across the three hops, a gateway pinned to the entry
  (`--worker URL`: its starts are not placed, so the entry relays them to the owner): the same
  trace id in every process's log, each hop's span the child of the one before, and
  `voicering trace ID --logs DIR` showing gateway, entry and owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.server import ServerConnection, serve

from gpu_worker.adapters import publish_adapter
from gpu_worker.client import PoolSettings, WorkerClient, WorkerPool, WorkerRequestError
from gpu_worker.protocol import ContextOptions
from gpu_worker.settings import RELAY_TIMEOUT_S
from gpu_worker.trace_context import TraceContext
from hashring import RingSettings
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import place
from hashring.records import WorkerInfo
from hashring.store import RingStore
from tests.fixtures.gateway import start_gateway
from tests.fixtures.fleet import WorkerSpec
from tests.fixtures.models import stop_workers
from voicering.trace import find_hops

PREFIX = "test:relay"
ENTRY, OWNER, SILENT = "relay-entry", "relay-owner", "relay-silent"
VOICES = [f"relay/v{i}" for i in range(24)]
IDLE_S = 10.0  # the entry's idle_timeout_s (a 2-core box under other load stalled the owner past 6 s)
CALLER_FIRST_AUDIO_S = 30.0  # the gateway's pool default (PoolSettings.first_audio_timeout_s)


SIZE = ("--max-loras", "2", "--max-streams", "8")
ENTRY_WORKER = WorkerSpec(ENTRY, SIZE, {"VOICERING_WORKER_RING_PREFIX": PREFIX,
                                         "VOICERING_WORKER_IDLE_TIMEOUT_S": str(IDLE_S)}, ring_id=ENTRY)
OWNER_WORKER = WorkerSpec(OWNER, SIZE, {"VOICERING_WORKER_RING_PREFIX": PREFIX}, ring_id=OWNER)
WORKERS = (ENTRY_WORKER, OWNER_WORKER)  # started ahead of this module (tests/fixtures/fleet.py)


@pytest.fixture(scope="module")
def pair(fleet, request, adapter_store):
    for name in VOICES:
        if not (adapter_store / name).exists():
            publish_adapter(adapter_store / "tara", adapter_store, name)
    entry, owner = fleet.take(request, ENTRY_WORKER, OWNER_WORKER)
    handles = {ENTRY: entry, OWNER: owner}
    yield handles
    stop_workers(*handles.values())


def settings(redis_server) -> RingSettings:
    return RingSettings(redis_url=redis_server.url, prefix=PREFIX)


async def owned_alone_by(pair, redis_server, wid: str, members: int) -> str:
    """A voice placed on `wid` alone, once the entry's own view holds `members` workers."""
    ring = settings(redis_server)
    async with RingStore(ring) as store, RingWatcher(store) as watcher:
        view = await watcher.wait_for(lambda v: len(v.ring) == members and wid in v.ring, timeout=60)
        await pair[ENTRY].wait_ring_view(members, timeout=60)
        return next(v for v in VOICES if tuple(place(view, v, ring).owners) == (wid,))


async def test_a_relayed_context_is_not_idle_while_its_owner_speaks(pair, redis_server):
    """Text flushed, no `end` (a caller streaming text as an LLM writes it), and the owner speaking
    a long segment: the entry keeps relaying past its idle timeout (it used to end the context
    with `idle_timeout` IDLE_S after the flush: no chunk came later than that); a cancel then ends it.
    Until the owner's first audio the caller sends empty flushes (text, to the idle clock): a first
    audio slower than IDLE_S on a loaded box is idleness too, and not the one under test. An owner
    starved mid-speech past IDLE_S (two CPU burners beside three workers did that) is idle too: then
    the context may end with `idle_timeout`, but only counted from the last audio, not from the text
    (the old behaviour ended it while chunks were still coming, well under IDLE_S after the last)."""
    voice = await owned_alone_by(pair, redis_server, OWNER, 2)
    async with await WorkerClient.connect(pair[OWNER].url) as direct:  # the owner loads the voice first
        await direct.say(voice, "Warm up.", options=ContextOptions(max_tokens=15, seed=1))
    async with await WorkerClient.connect(pair[ENTRY].url) as client:
        stream = await client.start(voice, "A long one, spoken while no more text comes.",
                                    options=ContextOptions(max_tokens=3000, seed=2))
        await stream.flush()
        said = time.monotonic()  # when the entry last got text from the caller
        speaking = asyncio.Event()

        async def until_it_speaks() -> None:
            nonlocal said
            while not speaking.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(speaking.wait(), IDLE_S / 4)
                if not speaking.is_set():
                    await stream.flush()
                    said = time.monotonic()

        keeping = asyncio.create_task(until_it_speaks())
        late = heard = quiet = None
        try:
            async for _ in stream.audio():
                speaking.set()
                heard = time.monotonic()
                if heard - said > IDLE_S + 1.0:
                    late = heard - said
                    break
        except WorkerRequestError as ended:  # the owner went quiet for IDLE_S: idle, from its last audio
            assert ended.error.code == "idle_timeout" and heard is not None, ended
            quiet = time.monotonic() - heard
        finally:
            speaking.set()
            await keeping
        if quiet is not None:
            assert quiet > IDLE_S / 2, f"ended {quiet:.1f} s after the last audio: idle was counted from the text"
        else:
            assert late is not None  # a chunk came after the idle timeout had passed, the context still open
            await stream.cancel()
            async for _ in stream.audio():
                pass
            assert stream.done is not None and stream.done.reason == "cancelled"
    await pair[OWNER].wait_idle()
    await pair[ENTRY].wait_idle()


async def test_a_relayed_context_still_ends_when_nothing_comes_either_way(pair, redis_server):
    """The idle timeout still holds: once the owner stops speaking and no text comes, the relayed
    context ends with `idle_timeout`, and the owner's context is cancelled."""
    voice = await owned_alone_by(pair, redis_server, OWNER, 2)
    async with await WorkerClient.connect(pair[ENTRY].url) as client:
        stream = await client.start(voice, "Short.", options=ContextOptions(max_tokens=15, seed=3))
        await stream.flush()
        with pytest.raises(WorkerRequestError) as err:
            async with asyncio.timeout(IDLE_S + 60):
                async for _ in stream.audio():
                    pass
    assert err.value.error.code == "idle_timeout" and not err.value.retryable
    await pair[OWNER].wait_idle()
    await pair[ENTRY].wait_idle()


async def test_one_request_is_followed_through_the_gateway_the_entry_and_the_owner(pair, redis_server, adapter_store,
                                                                                  new_tenant):
    voice = await owned_alone_by(pair, redis_server, OWNER, 2)
    logs = pair[ENTRY].log_path.parent  # both workers' logs; the gateway's goes in beside them
    gateway = start_gateway(redis_server.url, adapter_store, logs / "gateway", "--worker", pair[ENTRY].url,
                            env={"VOICERING_GATEWAY_BASE_VOICES": json.dumps([voice])})
    caller = TraceContext.new()
    try:
        _, key = await new_tenant()
        async with httpx.AsyncClient(timeout=120) as http:
            response = await http.post(f"{gateway.url}/v1/audio/speech", json={
                "model": "tts-1", "voice": voice, "input": "Across three hops.", "response_format": "pcm",
                "stream_format": "sse", "seed": 6, "max_tokens": 15},
                headers={"Authorization": f"Bearer {key}", "traceparent": caller.traceparent})
        deadline = time.monotonic() + 30
        while [f.hop.hop for f in find_hops(caller.trace_id, [logs])] != ["gateway", "entry", "owner"]:
            assert time.monotonic() < deadline, find_hops(caller.trace_id, [logs])  # each hop logs at its end
            await asyncio.sleep(0.2)
    finally:
        gateway.stop()
    assert response.status_code == 200 and response.headers["x-voicering-trace-id"] == caller.trace_id
    done = json.loads(response.text.strip().splitlines()[-1].removeprefix("data: "))
    assert (done["type"], done["served_by"], done["proxied"], done["trace_id"]) == (
        "speech.audio.done", OWNER, True, caller.trace_id)
    shown = subprocess.run([sys.executable, "-m", "voicering", "trace", caller.trace_id, "--logs", str(logs), "--json"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    gw, entry, owner = json.loads(shown.stdout)["hops"]
    assert (gw["hop"], gw["parent"], gw["to"]) == ("gateway", caller.span_id, pair[ENTRY].url)  # static routing: URLs
    assert (entry["hop"], entry["worker"], entry["to"], entry["parent"]) == ("entry", ENTRY, OWNER, gw["span"])
    assert (owner["hop"], owner["worker"], owner["parent"], owner["voice"]) == ("owner", OWNER, entry["span"], voice)
    assert all(h["outcome"] == "completed" and h["ttfb_ms"] is not None for h in (gw, entry, owner))
    assert {Path(h["log"]).name for h in (gw, entry, owner)} == {"gateway.log", f"{ENTRY}.log", f"{OWNER}.log"}
    table = subprocess.run([sys.executable, "-m", "voicering", "trace", caller.trace_id, "--logs", str(logs)],
                           capture_output=True, text=True, timeout=60)
    assert table.stdout.splitlines()[0] == f"trace {caller.trace_id}: gateway -> entry {ENTRY} -> owner {OWNER}"
    await pair[OWNER].wait_idle()
    await pair[ENTRY].wait_idle()


@contextlib.asynccontextmanager
async def silent_owner(redis_server) -> AsyncIterator[list[dict]]:
    """A ring member that takes links and messages and never answers one; yields what it got."""
    received: list[dict] = []

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(json.loads(message))

    async with serve(handler, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with RingStore(settings(redis_server)) as store, \
                Heartbeat(store, WorkerInfo(SILENT, url, url, capacity=8)):
            yield received


async def test_a_silent_owner_is_the_relay_s_to_give_up_on_and_the_entry_is_not_blamed(pair, redis_server):
    """The caller's pool (as a gateway's, with its 30 s first-audio clock) gets the entry's
    retryable `worker_timeout` before its own clock fires, and does not eject the entry (it used
    to: both hops waited 30 s, and the outer clock, started first, fired first)."""
    assert RELAY_TIMEOUT_S < CALLER_FIRST_AUDIO_S
    async with silent_owner(redis_server) as received:
        voice = await owned_alone_by(pair, redis_server, SILENT, 3)
        caller = PoolSettings(first_audio_timeout_s=CALLER_FIRST_AUDIO_S)
        async with WorkerPool.static([pair[ENTRY].url], caller) as pool:
            began = time.monotonic()
            stream = await pool.start(voice, "Is anyone there?", options=ContextOptions(max_tokens=15, seed=4))
            await stream.end()
            with pytest.raises(WorkerRequestError) as err:
                async for _ in stream.audio():
                    pass
            took = time.monotonic() - began
            entry_id = stream.worker_id
            assert pool.ejected() == set()
            assert pool.peer_stats(entry_id).errors == 0 and pool.peer_stats(entry_id).ejections == 0
        assert err.value.error.code == "worker_timeout" and err.value.retryable
        assert "owner" in err.value.error.message
        assert took < CALLER_FIRST_AUDIO_S
        deadline = time.monotonic() + 10
        while "cancel" not in [m["type"] for m in received]:  # the relay cancelled the silent owner's context
            assert time.monotonic() < deadline, received
            await asyncio.sleep(0.1)
        assert [m["type"] for m in received][:1] == ["start"] and received[0]["proxied_by"] == ENTRY
    await pair[ENTRY].wait_idle()
