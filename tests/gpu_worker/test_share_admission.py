"""Workers are authoritative for admission (issue #20 item 3), on a real ring worker (real Redis,
a real `voicering worker` process on the stand-in models):

- the share rule: a start is refused (``busy``, before any model work, with the worker's count)
  when ``in_flight + 1 > min(capacity, ceil(admit_factor × fleet mean))``; an ``insist`` start
  skips it (capacity still holds); a share refusal of a placed start tells the cool loop the voice
  spilled;
- M2: a relayed context that falls back to this worker's engine takes an engine slot (refused
  ``busy`` when there is none) and shows in the load (health, heartbeat, `load` answers);
- L12: a relayed context still waiting on its owner does not hold up the connection's others.

The other members of the ring are registered by the test (real heartbeats in the same Redis):
"dead" ones whose address refuses connections, and one owner that completes the websocket
handshake and then never answers (a worker that hangs).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import urllib.request
import uuid
from contextlib import AsyncExitStack

import pytest
from websockets.asyncio.client import connect

from gpu_worker.adapters import publish_adapter
from gpu_worker.protocol import PROTOCOL_HEADER, AudioChunk
from gpu_worker.admission import fleet_share
from hashring.share import share_floor_streams
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import place
from hashring.ports import free_port
from hashring.records import RingView, WorkerInfo
from hashring.ring import Node, Ring
from hashring.settings import RingSettings
from hashring.store import RingStore
from tests.fixtures.fleet import WorkerSpec

PREFIX = f"test:share-admission:{uuid.uuid4().hex[:6]}"
WORKER = "adm-w"
RING_ENV = {"VOICERING_WORKER_RING_PREFIX": PREFIX, "VOICERING_RING_HEARTBEAT_INTERVAL_S": "0.1",
            "VOICERING_RING_REFRESH_INTERVAL_S": "0.2", "VOICERING_WORKER_RING_HEAT_FLUSH_S": "0.1",
            "VOICERING_WORKER_RING_COOL_INTERVAL_S": "3600",  # this test reads the spill signals itself
            "VOICERING_WORKER_MAX_STREAMS_PER_CONNECTION": "4"}
LONG = {"max_tokens": 3000, "seed": 7}
SHORT = {"max_tokens": 15, "seed": 8}
V2 = {PROTOCOL_HEADER: "2"}


# -- the rule itself ------------------------------------------------------------------------------

def view_of(loads: dict[str, int]) -> RingView:
    from hashring.records import WorkerState

    workers = {w: WorkerState(WorkerInfo(w, f"ws://{w}", f"ws://{w}"), "live", load, 0.0) for w, load in loads.items()}
    return RingView(1, Ring([Node(w) for w in loads]), workers)


@pytest.mark.parametrize(("loads", "in_flight", "share"), [
    ({"me": 0}, 0, 2), ({"me": 5}, 7, 11),  # a lone worker always admits up to capacity: 1.35 × (n + 1) > n + 1
    ({"me": 0, "a": 0, "b": 0, "c": 0}, 0, 1), ({"me": 0, "a": 0, "b": 0, "c": 0}, 1, 1),
    ({"me": 9, "a": 4, "b": 4, "c": 4}, 4, 6),  # its own exact count, not its stale report: (12 + 4 + 1) / 4
    ({"a": 2, "b": 2}, 2, 4),  # not in the ring (draining): still counted once, ceil(1.35 × (4 + 2 + 1) / 3)
])
def test_the_share_is_ceil_of_the_factor_times_the_fleet_mean(loads, in_flight, share):
    assert fleet_share(view_of(loads), "me", in_flight, 1.35)[0] == share


def test_the_admit_factor_is_a_ring_setting_above_one():
    assert RingSettings().admit_factor == 1.35
    assert RingSettings.from_env({"VOICERING_RING_ADMIT_FACTOR": "2"}).admit_factor == 2.0
    for bad in ("1", "0.5"):
        with pytest.raises(ValueError, match="admit_factor"):
            RingSettings.from_env({"VOICERING_RING_ADMIT_FACTOR": bad})
    with pytest.raises(ValueError, match="VOICERING_RING_ADMIT_FACTOR"):
        RingSettings.from_env({"VOICERING_RING_ADMIT_FACTOR": "lots"})


@pytest.mark.parametrize(("capacity", "floor", "streams"), [(32, 0.5, 16), (2, 0.5, 1), (5, 0.5, 3), (32, 0.0, 0),
                                                             (8, 1.0, 8)])
def test_below_its_share_floor_a_worker_never_refuses_for_share(capacity, floor, streams):
    """Issue 33: in a burst every worker sees the others at their last (idle) heartbeat; below the
    floor the share is not consulted at all (the server's `_share` returns None there)."""
    assert share_floor_streams(capacity, floor) == streams


def test_the_share_floor_is_a_ring_setting_from_0_to_1():
    assert RingSettings().share_floor == 0.5
    assert RingSettings.from_env({"VOICERING_RING_SHARE_FLOOR": "0.25"}).share_floor == 0.25
    for bad in ("-0.1", "1.5"):
        with pytest.raises(ValueError, match="share_floor"):
            RingSettings.from_env({"VOICERING_RING_SHARE_FLOOR": bad})


# -- on a real ring worker ------------------------------------------------------------------------

RING_WORKER = WorkerSpec("share-worker", ("--max-loras", "2", "--max-streams", "2"), RING_ENV, ring_id=WORKER)
WORKERS = (RING_WORKER,)  # started ahead of this module (tests/fixtures/fleet.py), in this module's own ring


@pytest.fixture(scope="module")
def ring_worker(fleet, request):
    (handle,) = fleet.take(request, RING_WORKER)
    yield handle
    handle.stop()


def refused_port() -> int:
    return free_port()  # nothing listens there: a dial is refused at once


async def silent_owner(stack: AsyncExitStack) -> tuple[str, asyncio.Event]:
    """A websocket endpoint that completes the handshake, then reads and never answers."""
    shook = asyncio.Event()
    links: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        links.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key"))
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()).decode()
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept.encode() + b"\r\n\r\n")
        await writer.drain()
        shook.set()
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    stack.push_async_callback(server.wait_closed)
    stack.callback(server.close)
    # its links end with it (a closed server keeps them on 3.11): the worker is not left waiting
    # out its close timeout on them when it stops
    stack.callback(lambda: [link.close() for link in links])
    return f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", shook


async def fleet(stack: AsyncExitStack, redis_url: str, ring_worker, peers: dict[str, str]):
    """Register `peers` (id -> address) beside the worker, load 0 each; wait until its view has them."""
    settings = RingSettings(redis_url=redis_url, prefix=PREFIX, heartbeat_interval_s=0.1, refresh_interval_s=0.2)
    store = await stack.enter_async_context(RingStore(settings))
    for wid, url in peers.items():
        await stack.enter_async_context(Heartbeat(store, WorkerInfo(wid, url, url, capacity=2)))
    watcher = await stack.enter_async_context(RingWatcher(store))
    await watcher.wait_for(lambda v: {n.id for n in v.ring.nodes} == {WORKER, *peers}, 30)
    # the worker's own view (it refreshes every 0.2 s), at this epoch or later: a count alone can
    # match a stale view that still holds the previous test's peers
    epoch, health = watcher.view.epoch, {}
    for _ in range(150):
        health = await asyncio.to_thread(ring_worker.health)
        if health.get("ring_epoch", -1) >= epoch and health.get("ring_workers") == 1 + len(peers):
            break
        await asyncio.sleep(0.2)
    assert health.get("ring_epoch", -1) >= epoch and health["ring_workers"] == 1 + len(peers), health
    return settings, store, watcher


def voice_owned_by(owner: str, view: RingView, settings: RingSettings, adapter_store) -> str:
    """A voice of the adapter store (published from tara if need be) whose one owner is `owner`."""
    for i in range(200):
        name = f"adm/v{i:03d}"
        if place(view, name, settings).owners == (owner,):
            if not (adapter_store / name).exists():
                publish_adapter(adapter_store / "tara", adapter_store, name)
            return name
    raise AssertionError(f"no voice placed on {owner}")


async def start(ws, context_id: str, voice: str, options: dict, **flags) -> None:
    await ws.send(json.dumps({"type": "start", "context_id": context_id, "voice": voice, "text": "Hello there, friend.",
                              "options": options, **flags}))
    await ws.send(json.dumps({"type": "end", "context_id": context_id}))


async def answer(ws, context_id: str, *, timeout: float = 60.0, audio: list | None = None) -> dict:
    """The next JSON message for `context_id` (audio frames and other contexts' messages are kept aside)."""
    async with asyncio.timeout(timeout):
        while True:
            raw = await ws.recv()
            if isinstance(raw, bytes):
                if audio is not None:
                    audio.append(raw)
                continue
            message = json.loads(raw)
            if message.get("context_id") == context_id:
                return message


def metrics(worker) -> str:
    with urllib.request.urlopen(f"{worker.http}/metrics", timeout=10) as resp:
        return resp.read().decode()


async def test_a_worker_over_its_share_of_the_fleet_refuses_unless_the_start_insists(ring_worker, redis_server, adapter_store):
    """W and three idle workers: the mean with one stream here is (1 + 1) / 4, so W's share is
    ceil(1.35 × 0.5) = 1 and a second start is refused at once; an insisting one is admitted up to
    capacity (2), past which even it gets the capacity refusal."""
    async with AsyncExitStack() as stack:
        peers = {f"share-idle-{i}": f"ws://127.0.0.1:{refused_port()}" for i in range(3)}
        settings, store, watcher = await fleet(stack, redis_server.url, ring_worker, peers)
        voice = voice_owned_by(WORKER, watcher.view, settings, adapter_store)
        await store.take_signals()  # start from no spill
        before = metrics(ring_worker)
        async with connect(ring_worker.url, additional_headers=V2) as ws:
            await start(ws, "first", voice, LONG, placed=True)
            assert await answer(ws, "first") == {"context_id": "first", "load": 1, "type": "opened"}
            await start(ws, "second", voice, SHORT, placed=True)
            refused = await answer(ws, "second")
            assert (refused["type"], refused["code"], refused["retryable"], refused["load"]) == ("error", "busy", True, 1)
            assert refused["limit"] == "share"  # a preference, not the link's limit: the pool tries another owner
            assert "worker holds 1 streams, over its share of the fleet (ceil(1.35 × mean 0.5) = 1)" in refused["message"]
            await start(ws, "third", voice, LONG, placed=True, insist=True)
            assert await answer(ws, "third") == {"context_id": "third", "load": 2, "type": "opened"}
            await start(ws, "fourth", voice, SHORT, placed=True, insist=True)
            full = await answer(ws, "fourth")
            assert (full["code"], full["load"]) == ("busy", 2) and "limit of 2 concurrent streams" in full["message"]
            assert full["limit"] == "capacity"
            # one cancel at a time: `answer` skips other contexts' messages, and two ends may come in either order
            await ws.send(json.dumps({"type": "cancel", "context_id": "first"}))
            first_done = await answer(ws, "first")
            assert (first_done["reason"], first_done["load"]) == ("cancelled", 1)
            await ws.send(json.dumps({"type": "cancel", "context_id": "third"}))
            assert (await answer(ws, "third"))["load"] == 0
        spills: dict[str, int] = {}
        for _ in range(100):  # flushed by the worker's heat recorder every 0.1 s
            spills.update((await store.take_signals())[1])
            if voice in spills:
                break
            await asyncio.sleep(0.1)
        assert voice in spills  # the pool goes past the owners: the cool loop raises the voice's replicas
        after = metrics(ring_worker)
        assert _count(after, "share") == _count(before, "share") + 1
        assert _count(after, "busy") == _count(before, "busy") + 1  # the capacity refusal
    await ring_worker.wait_idle()


async def test_a_placed_start_refused_busy_is_not_counted_as_a_spill(ring_worker, redis_server, adapter_store):
    """Regression (issue 34 item 11): the worker counted a spill when it decided to serve a placed
    start for a voice it does not own, before admission refused it; such refusals inflated the
    voice's spill share and raised its replicas. Full worker: the placed start of another owner's
    voice is refused and no spill is signalled; with room, the same start is a spill, once."""
    async with AsyncExitStack() as stack:
        peers = {"spill-idle-0": f"ws://127.0.0.1:{refused_port()}"}
        settings, store, watcher = await fleet(stack, redis_server.url, ring_worker, peers)
        own = voice_owned_by(WORKER, watcher.view, settings, adapter_store)
        foreign = voice_owned_by("spill-idle-0", watcher.view, settings, adapter_store)
        await store.take_signals()  # start from no spill
        async with connect(ring_worker.url, additional_headers=V2) as ws:
            for cid in ("hold-1", "hold-2"):  # fill it (capacity 2); insisting: no share refusal
                await start(ws, cid, own, LONG, placed=True, insist=True)
                assert (await answer(ws, cid))["type"] == "opened"
            await start(ws, "refused", foreign, SHORT, placed=True)
            refused = await answer(ws, "refused")
            assert (refused["code"], refused["limit"]) == ("busy", "capacity")
            await ws.send(json.dumps({"type": "cancel", "context_id": "hold-1"}))
            assert (await answer(ws, "hold-1"))["type"] == "done"
            await start(ws, "served", foreign, SHORT, placed=True, insist=True)
            assert (await answer(ws, "served"))["type"] == "opened"  # served here: the one spill
            spills: dict[str, int] = {}
            after_seen = 0
            for _ in range(200):  # flushed by the worker's heat recorder every 0.1 s: ten more flushes
                for voice, n in (await store.take_signals())[1].items():  # after the first sighting,
                    spills[voice] = spills.get(voice, 0) + n  # so a second count could not hide
                after_seen += foreign in spills
                if after_seen > 10:
                    break
                await asyncio.sleep(0.1)
            await ws.send(json.dumps({"type": "cancel", "context_id": "hold-2"}))
            await answer(ws, "hold-2")
        assert spills.get(foreign) == 1, spills
    await ring_worker.wait_idle()


def _count(text: str, reason: str) -> float:
    key = f'voicering_worker_rejected_total{{reason="{reason}"}}'
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(key)), 0.0)


async def first_audio(ws, context_id: str, timeout: float = 60.0) -> None:
    """Wait for `context_id`'s first audio frame (a JSON message for it first is a failure)."""
    async with asyncio.timeout(timeout):
        while True:
            raw = await ws.recv()
            if isinstance(raw, bytes):
                if AudioChunk.decode(raw).context_id == context_id:
                    return
            elif (message := json.loads(raw)).get("context_id") == context_id and message["type"] != "opened":
                pytest.fail(f"{context_id} was not spoken: {message}")


async def test_a_relay_that_falls_back_here_takes_an_engine_slot_and_shows_in_the_load(ring_worker, redis_server,
                                                                                       adapter_store):
    """Regression M2: no owner can take a relayed context, so this worker speaks it; that stream
    was counted nowhere (health, heartbeat, max_streams). A version-1 client, as before the fix."""
    async with AsyncExitStack() as stack:
        settings, store, watcher = await fleet(stack, redis_server.url, ring_worker,
                                               {"m2-dead": f"ws://127.0.0.1:{refused_port()}"})
        voice = voice_owned_by("m2-dead", watcher.view, settings, adapter_store)
        async with connect(ring_worker.url) as ws:
            await start(ws, "relayed", voice, LONG)  # not placed: relayed to its owner, which refuses connections
            await first_audio(ws, "relayed")  # spoken here once the owner failed
            health = await asyncio.to_thread(ring_worker.health)
            assert (health["active_streams"], health["relayed_streams"]) == (1, 0)
            for _ in range(50):  # and the ring sees it in the heartbeat (every 0.1 s)
                if (await store.snapshot()).loads.get(WORKER) == 1:
                    break
                await asyncio.sleep(0.1)
            assert (await store.snapshot()).loads[WORKER] == 1
            await ws.send(json.dumps({"type": "cancel", "context_id": "relayed"}))
            assert (await answer(ws, "relayed"))["reason"] == "cancelled"
        async with connect(ring_worker.url, additional_headers=V2) as ws:  # and in the load a version-2 client reads
            await start(ws, "relayed", voice, LONG)
            assert await answer(ws, "relayed") == {"context_id": "relayed", "load": 0, "type": "opened"}  # a relay
            await first_audio(ws, "relayed")
            await start(ws, "here", voice, SHORT, placed=True, insist=True)
            assert await answer(ws, "here") == {"context_id": "here", "load": 2, "type": "opened"}
            assert (await answer(ws, "here"))["load"] == 1  # its done: the fallback still speaks
            await ws.send(json.dumps({"type": "cancel", "context_id": "relayed"}))
            done = await answer(ws, "relayed")
            assert (done["type"], done["reason"], done["load"]) == ("done", "cancelled", 0)
    await ring_worker.wait_idle()


async def test_a_relay_that_would_fall_back_on_a_full_worker_is_refused_busy(ring_worker, redis_server, adapter_store):
    """Regression M2: with max_streams already speaking here, a fallback used to make one more."""
    async with AsyncExitStack() as stack:
        settings, store, watcher = await fleet(stack, redis_server.url, ring_worker,
                                               {"m2-full-dead": f"ws://127.0.0.1:{refused_port()}"})
        mine = voice_owned_by(WORKER, watcher.view, settings, adapter_store)
        theirs = voice_owned_by("m2-full-dead", watcher.view, settings, adapter_store)
        async with connect(ring_worker.url) as ws:
            for cid in ("a", "b"):  # two of two (a voice it owns: never relayed)
                await start(ws, cid, mine, LONG)
                await first_audio(ws, cid)
            await start(ws, "relayed", theirs, SHORT)  # the relay is admitted (its own bound), its owner fails
            refused = await answer(ws, "relayed")
            assert (refused["type"], refused["code"], refused["retryable"]) == ("error", "busy", True)
            assert "limit of 2 concurrent streams" in refused["message"]
            assert (await asyncio.to_thread(ring_worker.health))["active_streams"] == 2
            for cid in ("a", "b"):
                await ws.send(json.dumps({"type": "cancel", "context_id": cid}))
                assert (await answer(ws, cid))["reason"] == "cancelled"
    await ring_worker.wait_idle()


async def test_a_context_waiting_on_its_owner_does_not_hold_up_the_connections_others(ring_worker, redis_server,
                                                                                      adapter_store):
    """L12 on a real worker: a relayed context whose owner took the link and never answers is
    still waiting on it while the same connection's next context opens, speaks and ends; then
    cancelling the waiting one answers it."""
    async with AsyncExitStack() as stack:
        url, shook = await silent_owner(stack)
        settings, store, watcher = await fleet(stack, redis_server.url, ring_worker, {"l12-silent": url})
        theirs = voice_owned_by("l12-silent", watcher.view, settings, adapter_store)
        mine = voice_owned_by(WORKER, watcher.view, settings, adapter_store)
        async with connect(ring_worker.url, additional_headers=V2) as ws:
            await start(ws, "waiting", theirs, SHORT)
            assert (await answer(ws, "waiting"))["type"] == "opened"
            await asyncio.wait_for(shook.wait(), 30)  # relayed: the owner has it and says nothing
            await start(ws, "other", mine, SHORT, placed=True)
            seen: list[dict] = []
            audio: list[bytes] = []
            async with asyncio.timeout(15):  # the relay waits up to 20 s for the owner's first audio
                while not any(m.get("context_id") == "other" and m["type"] in ("done", "error") for m in seen):
                    raw = await ws.recv()
                    if isinstance(raw, bytes):
                        audio.append(raw)
                    else:
                        seen.append(json.loads(raw))
            other = [m for m in seen if m["context_id"] == "other"]
            assert [m["type"] for m in other] == ["opened", "done"] and audio
            assert not [m for m in seen if m["context_id"] == "waiting"]  # still waiting on its owner meanwhile
            await ws.send(json.dumps({"type": "cancel", "context_id": "waiting"}))
            done = await answer(ws, "waiting", timeout=15)
            assert (done["type"], done["reason"]) == ("done", "cancelled")
    await ring_worker.wait_idle()
