"""Back-pressure and the engine's adapter cache on a deliberately small real worker: 2 streams,
1 LoRA slot, 2 adapters in the engine's CPU cache, a 2-message outbox, an 8 KiB socket send buffer
and a 3 s slow-consumer limit. Stream limit -> immediate retryable busy; a client that stops reading is cut without
stalling anyone else; a voice evicted from the cache is reloaded and served exactly as before."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bench.worker import derive_voice
from gpu_worker.adapters import publish_adapter
from gpu_worker.client import WorkerClient, WorkerRequestError
from gpu_worker.protocol import PROTOCOL_HEADER, ContextOptions
from tests.fixtures.fleet import WorkerSpec
from tests.fixtures.probes import metric_samples

# a reader of this module that stalls this long is cut: long enough that the pytest process, starved
# beside two CPU burners, never is (1 s was not), short enough to wait out in the slow-consumer test
SLOW_CONSUMER_S = 3.0
SMALL = {"VOICERING_WORKER_MAX_CPU_LORAS": "2", "VOICERING_WORKER_SEND_QUEUE": "2",
         "VOICERING_WORKER_SLOW_CONSUMER_S": str(SLOW_CONSUMER_S), "VOICERING_WORKER_CLOSE_TIMEOUT_S": "1",
         "VOICERING_WORKER_MAX_STREAMS_PER_CONNECTION": "2", "VOICERING_WORKER_IDLE_TIMEOUT_S": "3",
         "VOICERING_WORKER_MAX_CONNECTION_BACKLOG_CHARS": "3000",
         "VOICERING_WORKER_SOCKET_SEND_BUFFER": "8192",
         # the keepalive (20 s) must not close the stalled connection first: on a loaded box its first
         # audio came after 20 s and the ping's 20 s ran out before its socket had filled
         "VOICERING_WORKER_KEEPALIVE_S": "120"}


SMALL_WORKER = WorkerSpec("small-worker", ("--max-loras", "1", "--max-streams", "2"), SMALL)
WORKERS = (SMALL_WORKER,)  # started ahead of this module (tests/fixtures/fleet.py)


@pytest.fixture(scope="module")
def small_worker(fleet, request):
    (handle,) = fleet.take(request, SMALL_WORKER)
    yield handle
    handle.stop()


async def test_stream_limit_answers_busy_at_once_then_admits_again(small_worker):
    async with await WorkerClient.connect(small_worker.url) as client:
        long = ContextOptions(max_tokens=3000, seed=1)
        first = await client.start("tara", "One.", options=long)
        second = await client.start("tara", "Two.", options=long)  # one LoRA slot: same voice runs together
        for stream in (first, second):  # both ended before either is awaited: no idle clock runs on one
            await stream.end()
        for stream in (first, second):
            async for _ in stream.audio():  # both are really running
                break
        # their audio is read on while the third waits: this worker cuts a connection that stops reading
        # for SLOW_CONSUMER_S, and beside two CPU burners the busy answer took over a second
        reading = [asyncio.create_task(drain(stream)) for stream in (first, second)]
        third = await client.start("tara", "Three.", options=ContextOptions(max_tokens=15))
        await third.end()
        began = time.perf_counter()
        with pytest.raises(WorkerRequestError) as err:
            async for _ in third.audio():
                pass
        assert time.perf_counter() - began < 5.0  # answered, not queued behind 3000-token streams
        assert err.value.error.code == "busy" and err.value.retryable
        assert "2 concurrent streams" in err.value.error.message
        await first.cancel()
        await second.cancel()
        await asyncio.gather(*reading)
        assert first.done.reason == second.done.reason == "cancelled"
        ok = await client.say("tara", "Four.", options=ContextOptions(max_tokens=15, seed=2))
        assert ok.done.stats.frames == 2
    await small_worker.wait_idle()


async def test_a_consumer_that_stops_reading_is_cut_and_others_keep_going(small_worker):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(small_worker.url.rsplit(":", 1)[1])))
    before = metric_samples(await asyncio.to_thread(_metrics, small_worker))
    stalled = await connect(small_worker.url, sock=sock, max_queue=1, open_timeout=10)
    await stalled.send(json.dumps({"type": "start", "context_id": "stall", "voice": "tara", "text": "I will not listen.",
                                   "options": {"max_tokens": 4000, "seed": 3}}))
    await stalled.send(json.dumps({"type": "end", "context_id": "stall"}))
    stopped_reading = time.monotonic()
    # meanwhile another client is served normally (the stalled one never blocks it)
    async with await WorkerClient.connect(small_worker.url) as client:
        speech = await client.say("leo", "I am listening.", options=ContextOptions(max_tokens=7 * 8 + 1, seed=4))
    assert speech.done.stats.frames == 8
    # cut by the documented path (a write blocked for slow_consumer_s), not the keepalive (120 s here): the
    # log line and the slow_consumer counts below say which path cut it, not a clock (a loaded box
    # once took past 30 s)
    while (await asyncio.to_thread(small_worker.health))["active_streams"] > 0:
        assert time.monotonic() - stopped_reading < 120, "stalled stream was never cut"
        await asyncio.sleep(0.5)
    assert "cutting a connection that stopped reading" in small_worker.log_path.read_text()
    with pytest.raises(ConnectionClosed) as closed:  # reading now drains what was buffered, then the cut
        while True:
            await asyncio.wait_for(stalled.recv(), 30)
    assert closed.value.rcvd is None or (closed.value.rcvd.code, closed.value.rcvd.reason) == (
        1008, "slow consumer: client stopped reading")  # None: even the close frame could not be written
    await small_worker.wait_idle()
    after = metric_samples(await asyncio.to_thread(_metrics, small_worker))
    for series in (("voicering_worker_rejected_total", (("reason", "slow_consumer"),)),
                   ("voicering_worker_contexts_total", (("outcome", "slow_consumer"),))):
        assert after.get(series, 0.0) == before.get(series, 0.0) + 1, series  # this one cut, whatever came before


async def drain(stream) -> None:
    async for _ in stream.audio():
        pass


def _metrics(worker) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{worker.http}/metrics", timeout=10) as resp:
        return resp.read().decode()


async def test_voice_evicted_from_the_engine_cache_is_reloaded_and_served_identically(small_worker, adapter_store, tmp_path):
    """1 slot, 2 cached adapters: speak X, then three other voices (X leaves the engine), then X again."""
    names = ["lru/x", "lru/a", "lru/b", "lru/c"]
    for i, name in enumerate(names):
        if not (adapter_store / name).exists():
            publish_adapter(derive_voice(adapter_store / "tara", tmp_path / f"v{i}", seed=10 + i, prompt_name="lru"),
                            adapter_store, name)
    probe = ContextOptions(max_tokens=7 * 6 + 1, seed=42)
    async with await WorkerClient.connect(small_worker.url) as client:
        first = await client.say("lru/x", "Remember me.", options=probe)
        others = [await client.say(name, "Remember me.", options=probe) for name in names[1:]]
        assert (await asyncio.to_thread(small_worker.health))["adapters_resident"] <= 2  # x was evicted
        again = await client.say("lru/x", "Remember me.", options=probe)
    assert again.pcm == first.pcm and again.done.stats.invalid_tokens == 0
    assert all(o.pcm != first.pcm for o in others)  # the adapter, not the prompt, made the difference
    metrics = await asyncio.to_thread(_metrics, small_worker)
    loads = float(next(line for line in metrics.splitlines() if line.startswith("voicering_worker_adapter_loads_total")).split()[-1])
    assert loads >= 5  # x, a, b, c, then x again


async def test_a_context_that_sends_no_text_ends_and_frees_its_slot(small_worker):
    """Two silent `start`s would otherwise hold both slots of this worker forever."""
    async with await WorkerClient.connect(small_worker.url) as client:
        silent = [await client.start("tara", options=ContextOptions(max_tokens=15)) for _ in range(2)]
        began = time.monotonic()
        for stream in silent:
            with pytest.raises(WorkerRequestError) as err:
                async for _ in stream.audio():
                    pass
            assert err.value.error.code == "idle_timeout" and not err.value.retryable
        assert 2.5 < time.monotonic() - began < 30
        ok = await client.say("tara", "My turn.", options=ContextOptions(max_tokens=15, seed=5))
        assert ok.done.stats.frames == 2
    await small_worker.wait_idle()


async def test_text_waiting_to_be_spoken_is_bounded_per_connection(small_worker):
    async with await WorkerClient.connect(small_worker.url) as client:
        first = await client.start("tara", "a " * 1000, options=ContextOptions(max_tokens=15))  # 2000 characters held
        second = await client.start("tara", options=ContextOptions(max_tokens=15))
        await second.push("b " * 600)  # 3200 > 3000 for the connection: refused whole, this context ends
        with pytest.raises(WorkerRequestError) as err:
            async for _ in second.audio():
                pass
        assert err.value.error.code == "backlog_full" and "this connection" in err.value.error.message
        await first.end()  # the first context is untouched and speaks its text
        pcm = b"".join([c async for c in first.audio()])
        assert first.done.reason == "completed" and pcm
        third = await client.say("tara", "b " * 600, options=ContextOptions(max_tokens=15, seed=6))  # room again
        assert third.done.reason == "completed"
    await small_worker.wait_idle()


async def _next_text(ws, context_id: str, timeout: float = 60.0) -> str:
    """The next JSON message (raw, as sent) for `context_id`; audio frames are skipped."""
    async with asyncio.timeout(timeout):
        while True:
            raw = await ws.recv()
            if isinstance(raw, str) and json.loads(raw).get("context_id") == context_id:
                return raw


async def _start(ws, context_id: str, options: dict) -> None:
    await ws.send(json.dumps({"type": "start", "context_id": context_id, "voice": "tara", "text": "Hello.", "options": options}))
    await ws.send(json.dumps({"type": "end", "context_id": context_id}))


async def test_version_2_connections_get_opened_and_loads_and_version_1_the_same_bytes_as_before(small_worker):
    """Issue #20: the worker answers every handshake with its protocol version; a connection that
    asked for version 2 gets `opened` at admission and the worker's load on every `done`/`error`,
    and a version-1 connection gets exactly the messages it always got."""
    long, short = {"max_tokens": 3000, "seed": 11}, {"max_tokens": 15, "seed": 12}
    async with connect(small_worker.url, additional_headers={PROTOCOL_HEADER: "2"}) as v2, connect(small_worker.url) as v1:
        assert v2.response.headers[PROTOCOL_HEADER] == v1.response.headers[PROTOCOL_HEADER] == "2"
        await _start(v2, "a", long)
        assert json.loads(await _next_text(v2, "a")) == {"context_id": "a", "load": 1, "type": "opened"}
        await _start(v1, "b", long)
        assert isinstance(await asyncio.wait_for(v1.recv(), 60), bytes)  # no `opened` on version 1: audio first
        await _start(v1, "c", short)  # the worker is full (2 of 2)
        assert await _next_text(v1, "c") == ('{"code":"busy","message":"worker is at its limit of 2 concurrent streams; '
                                             'try another replica","retryable":true,"context_id":"c","type":"error"}')
        await _start(v2, "d", short)
        assert json.loads(await _next_text(v2, "d"))["load"] == 2
        await v2.send(json.dumps({"type": "cancel", "context_id": "a"}))
        done = json.loads(await _next_text(v2, "a"))
        assert (done["type"], done["reason"], done["load"]) == ("done", "cancelled", 1)  # b still speaks
        await v1.send(json.dumps({"type": "cancel", "context_id": "b"}))
        assert await _next_text(v1, "b") == encode_v1_cancelled("b")
        await _start(v2, "e", short)  # a whole context on version 2
        assert json.loads(await _next_text(v2, "e")) == {"context_id": "e", "load": 1, "type": "opened"}
        done = json.loads(await _next_text(v2, "e"))
        assert (done["type"], done["reason"], done["load"], done["stats"]["frames"]) == ("done", "completed", 0, 2)
        await _start(v1, "f", short)
        done = json.loads(await _next_text(v1, "f"))
        assert list(done) == ["context_id", "stats", "reason", "type"] and done["stats"]["frames"] == 2
    await small_worker.wait_idle()


def encode_v1_cancelled(context_id: str) -> str:
    """A cancelled `done` as version 1 wrote it (the encoding of issue #19's protocol, field for field)."""
    stats = {"ttfb_ms": None, "audio_s": 0.0, "tokens": 0, "frames": 0, "invalid_tokens": 0, "segments": 0, "wall_s": 0.0,
             "rtf": None, "head_silence_dropped_ms": 0.0, "engine_requests": 0, "finish_reason": "", "served_by": "",
             "proxied": False}
    return json.dumps({"context_id": context_id, "stats": stats, "reason": "cancelled", "type": "done"}, separators=(",", ":"))


def test_zz_worker_shuts_down_cleanly(small_worker):
    """SIGTERM: the engine core finishes its own teardown (no force-kill) and nothing is left to
    blow up at interpreter exit. Runs last in this module (it stops the module's worker)."""
    small_worker.stop()
    assert small_worker.proc.returncode == 0
    log = small_worker.log_path.read_text()
    assert "force killing" not in log
    assert "Traceback" not in log and "Exception ignored" not in log
