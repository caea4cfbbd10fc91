"""`/v1/tts/stream`: the worker protocol's contexts through a real `voicering gateway` process, with
tenant keys and voice names, to the session's real worker."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gpu_worker.client import WorkerClient
from gpu_worker.protocol import AudioChunk, ContextOptions


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def open_stream(gateway, key: str):
    return await connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers=auth(key), max_size=1 << 22)


async def collect(ws, context_ids: set[str], timeout: float = 120) -> dict[str, dict]:
    """Audio and the final message of each context, until every one has ended."""
    out = {c: {"pcm": b"", "seqs": [], "end": None} for c in context_ids}
    while any(v["end"] is None for v in out.values()):
        raw = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(raw, bytes):
            chunk = AudioChunk.decode(raw)
            out[chunk.context_id]["pcm"] += chunk.pcm
            out[chunk.context_id]["seqs"].append(chunk.seq)
            continue
        message = json.loads(raw)
        if message["type"] in ("done", "error"):
            out[message["context_id"]]["end"] = message
    return out


async def test_a_context_speaks_the_same_audio_as_the_worker(gateway, worker, new_tenant):
    _, key = await new_tenant()
    async with await open_stream(gateway, key) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "a", "voice": "tara", "text": "Streamed in ",
                                  "options": {"seed": 21, "max_tokens": 15}}))
        await ws.send(json.dumps({"type": "text", "context_id": "a", "text": "two parts."}))
        await ws.send(json.dumps({"type": "end", "context_id": "a"}))
        got = (await collect(ws, {"a"}))["a"]
    async with await WorkerClient.connect(worker.url) as direct:
        stream = await direct.start("tara", "Streamed in ", options=ContextOptions(seed=21, max_tokens=15))
        await stream.push("two parts.")
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
    assert got["end"]["type"] == "done" and got["end"]["reason"] == "completed"
    assert got["pcm"] == pcm and pcm and got["seqs"] == list(range(len(got["seqs"])))


async def test_a_start_s_first_audio_choice_reaches_the_worker(gateway, worker, new_tenant):
    """`options.first_audio_frames` passes through the gateway: the worker decodes the first frame
    alone, as it does for the same start sent to it directly, and unlike its default."""
    _, key = await new_tenant()
    options = {"seed": 22, "max_tokens": 7 * 6 + 1, "trim_silence": False}
    async with await open_stream(gateway, key) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "a", "voice": "tara", "text": "First audio sooner.",
                                  "options": {**options, "first_audio_frames": 1}}))
        await ws.send(json.dumps({"type": "end", "context_id": "a"}))
        got = (await collect(ws, {"a"}))["a"]
    async with await WorkerClient.connect(worker.url) as direct:
        chosen = await direct.say("tara", "First audio sooner.", options=ContextOptions(**options, first_audio_frames=1))
        default = await direct.say("tara", "First audio sooner.", options=ContextOptions(**options))
    assert got["end"]["type"] == "done" and got["pcm"] == chosen.pcm
    assert len(chosen.pcm) == len(default.pcm) and chosen.pcm != default.pcm  # only the first frame differs


async def test_word_timings_reach_the_caller_who_asked_and_no_one_else(gateway, worker, new_tenant):
    _, key = await new_tenant()
    timed, plain = [], []
    async with await open_stream(gateway, key) as ws:
        for cid, options in (("t", {"seed": 2, "max_tokens": 7 * 8 + 1, "alignment": "word"}),
                             ("p", {"seed": 2, "max_tokens": 15})):
            await ws.send(json.dumps({"type": "start", "context_id": cid, "voice": "tara", "text": "I paid $5.",
                                      "options": options}))
            await ws.send(json.dumps({"type": "end", "context_id": cid}))
        ended = set()
        while len(ended) < 2:
            raw = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(raw, bytes):
                continue
            message = json.loads(raw)
            if message["type"] == "alignment":
                (timed if message["context_id"] == "t" else plain).append(message)
            elif message["type"] in ("done", "error"):
                assert message["type"] == "done", message
                ended.add(message["context_id"])
    assert [w["text"] for m in timed for w in m["words"]] == ["I", "paid", "$5"] and not plain


async def test_a_bad_key_is_refused_before_the_upgrade(gateway):
    with pytest.raises(InvalidStatus) as err:
        await open_stream(gateway, "vr_wrong")
    assert err.value.response.status_code == 401
    assert json.loads(err.value.response.body)["error"]["code"] == "invalid_api_key"


async def test_contexts_are_independent_and_bad_messages_are_refusals(gateway, new_tenant):
    _, key = await new_tenant()
    async with await open_stream(gateway, key) as ws:
        await ws.send("not json")
        refused = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert refused["type"] == "rejected"
        for cid, voice in (("ok1", "tara"), ("bad", "someone-else"), ("ok2", "leo")):
            await ws.send(json.dumps({"type": "start", "context_id": cid, "voice": voice, "text": "Hi.",
                                      "options": {"seed": 2, "max_tokens": 15}}))
            await ws.send(json.dumps({"type": "end", "context_id": cid}))
        got = await collect(ws, {"ok1", "bad", "ok2"})
        await ws.send(json.dumps({"type": "text", "context_id": "ok1", "text": "too late"}))
        late = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert got["bad"]["end"]["type"] == "error" and got["bad"]["end"]["code"] == "voice_not_found"
    assert not got["bad"]["pcm"]
    for cid in ("ok1", "ok2"):
        assert got[cid]["end"]["type"] == "done" and len(got[cid]["pcm"]) == 2 * 2048 * 2
    assert late["type"] == "rejected" and late["context_id"] == "ok1"


async def test_the_tenant_s_stream_limit_holds_on_the_websocket(gateway, worker, new_tenant):
    _, key = await new_tenant(max_streams=1)
    async with await open_stream(gateway, key) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "long", "voice": "tara", "text": "Long.",
                                  "options": {"seed": 1, "max_tokens": 3000}}))
        await ws.send(json.dumps({"type": "end", "context_id": "long"}))
        while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
            pass
        await ws.send(json.dumps({"type": "start", "context_id": "second", "voice": "tara", "text": "Hi."}))
        while isinstance(msg := await asyncio.wait_for(ws.recv(), 30), bytes):
            pass
        error = json.loads(msg)
        assert error["type"] == "error" and error["context_id"] == "second"
        assert error["code"] == "streams_limit_exceeded" and error["retryable"] is True
        await ws.send(json.dumps({"type": "cancel", "context_id": "long"}))
        while isinstance(msg := await asyncio.wait_for(ws.recv(), 30), bytes):
            pass
        assert json.loads(msg) == {**json.loads(msg), "type": "done", "context_id": "long", "reason": "cancelled"}
    await worker.wait_idle()


async def test_a_client_that_disconnects_mid_stream_cancels_the_worker_and_is_metered(gateway, worker, new_tenant):
    _, key = await new_tenant()
    ws = await open_stream(gateway, key)
    await ws.send(json.dumps({"type": "start", "context_id": "gone", "voice": "leo", "text": "I will hang up.",
                              "options": {"seed": 4, "max_tokens": 3000}}))
    await ws.send(json.dumps({"type": "end", "context_id": "gone"}))
    received = 0
    while received < 2:
        if isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
            received += 1
    ws.transport.abort()
    await worker.wait_idle()  # the worker's engine request was aborted
    async with httpx.AsyncClient() as http:
        for _ in range(50):
            usage = (await http.get(f"{gateway.url}/v1/usage", headers=auth(key))).json()
            if usage["audio_seconds"] > 0:
                break
            await asyncio.sleep(0.1)
    assert usage["audio_seconds"] >= 2 * 2048 / 24000 - 0.001


async def test_done_says_what_the_gateway_added_to_the_first_audio(gateway, worker, new_tenant):
    """Issue 34 item 15: `done.stats.gateway_ms`, the gateway's own share of a context's first audio
    on its own clock (the websocket's Server-Timing), the figure `bench gateway` reports as
    `ws_gateway_ms_p50`: positive and a small part of the client's wait."""
    _, key = await new_tenant()
    shares, waits = [], []
    async with await open_stream(gateway, key) as ws:
        for n in range(6):
            began = time.perf_counter()
            await ws.send(json.dumps({"type": "start", "context_id": f"t{n}", "voice": "tara", "text": "Timed.",
                                      "options": {"seed": n, "max_tokens": 15}}))
            await ws.send(json.dumps({"type": "end", "context_id": f"t{n}"}))
            first = None
            while isinstance(raw := await asyncio.wait_for(ws.recv(), 60), bytes):
                first = first or time.perf_counter()
            done = json.loads(raw)
            assert done["type"] == "done", done
            shares.append(done["stats"]["gateway_ms"])
            waits.append((first - began) * 1000)
    print(f"\ngateway_ms {shares} of client waits {[round(w, 1) for w in waits]} ms")
    assert all(0 < share < wait for share, wait in zip(shares, waits))
    assert statistics.median(shares) < statistics.median(waits) / 2

