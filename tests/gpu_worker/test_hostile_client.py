"""The worker under a hostile client (real worker process, raw websocket messages): every limit the
protocol documents holds, refused text is never spoken later, a context ends with exactly one
`done` or `error`, and refusals of single messages (`rejected`) never end a live context."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np
from websockets.asyncio.client import connect

from gpu_worker.orpheus import SAMPLES_PER_FRAME

FAST = {"max_tokens": 15, "seed": 1}  # 2 frames per engine request


async def send(ws, **message) -> None:
    await ws.send(json.dumps(message))


async def collect(ws, until_context: str, timeout: float = 120.0) -> tuple[list[dict], bytes]:
    """Every JSON reply until `until_context` ends (its done or error), and that context's audio."""
    replies, pcm = [], bytearray()
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                n = msg[1]
                if msg[2:2 + n].decode() == until_context:
                    pcm += msg[2 + n + 4:]
                continue
            reply = json.loads(msg)
            replies.append(reply)
            if reply["context_id"] == until_context and reply["type"] in ("done", "error"):
                return replies, bytes(pcm)


async def quiet_for(ws, seconds: float) -> list:
    """Whatever arrives within `seconds` (nothing, for a context that is really over)."""
    got = []
    try:
        async with asyncio.timeout(seconds):
            while True:
                got.append(await ws.recv())
    except TimeoutError:
        return got


def metric(worker, name: str) -> float:
    with urllib.request.urlopen(f"{worker.http}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            key, _, value = line.rpartition(" ")
            if key == name:
                return float(value)
    return 0.0


async def test_text_over_the_limit_is_never_buffered_and_ends_its_context(worker):
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="big", voice="tara", options=FAST)
        await send(ws, type="text", context_id="big", text="y" * 3000)
        await send(ws, type="text", context_id="big", text="z" * 2000)  # 5000 > 4096: refused whole
        await send(ws, type="flush", context_id="big")
        replies, pcm = await collect(ws, "big")
        assert [r["type"] for r in replies] == ["error"]
        assert replies[0]["code"] == "text_too_long" and replies[0]["retryable"] is False
        late = [json.loads(m) for m in await quiet_for(ws, 1.0)]
        # the flush reached a context that is over: refused, nothing spoken, no late `done`
        assert [(m["type"], m["context_id"]) for m in late] == [("rejected", "big")]
        assert pcm == b""
    health = await worker.wait_idle()
    assert health["active_streams"] == 0


async def test_queued_segments_are_bounded_per_context(worker):
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="flood", voice="tara", options={"max_tokens": 3000, "seed": 2})
        for i in range(40):
            await send(ws, type="text", context_id="flood", text=f"Segment {i}.")
            await send(ws, type="flush", context_id="flood")
        replies, _ = await collect(ws, "flood")
        assert replies[-1]["type"] == "error" and replies[-1]["code"] == "backlog_full"
        assert "16 segments" in replies[-1]["message"]
        assert [r["type"] for r in replies] == ["error"]  # nothing before it
        # the rest of the flood is refused message by message and never spoken: a context started
        # after it is answered next. (Read before closing: a client that leaves ~50 replies unread
        # stops reading its socket and waits out its 10 s close timeout.)
        await send(ws, type="start", context_id="after", voice="leo", text="After.", options=FAST)
        await send(ws, type="end", context_id="after")
        later, pcm = await collect(ws, "after")
        assert later[-1]["type"] == "done" and later[-1]["reason"] == "completed" and pcm
        refused = [r for r in later if r["context_id"] == "flood"]
        assert refused and {r["type"] for r in refused} == {"rejected"}, refused
    await worker.wait_idle()


async def test_one_connection_gets_a_bounded_share_of_the_slots(worker):
    """max_streams 8: one connection may hold 4; a second connection still gets in."""
    async with connect(worker.url) as greedy, connect(worker.url) as other:
        for i in range(5):
            await send(greedy, type="start", context_id=f"g{i}", voice="tara", text="Hold on.",
                       options={"max_tokens": 3000, "seed": i})
        replies, _ = await collect(greedy, "g4", timeout=30)
        refused = replies[-1]
        assert refused["type"] == "error" and refused["code"] == "busy" and refused["retryable"] is True
        assert "this connection holds 4 streams" in refused["message"]
        await send(other, type="start", context_id="o", voice="leo", text="Me too.", options=FAST)
        await send(other, type="end", context_id="o")
        done, pcm = await collect(other, "o")
        assert done[-1]["type"] == "done" and done[-1]["reason"] == "completed" and pcm
        for i in range(4):
            await send(greedy, type="cancel", context_id=f"g{i}")
        for i in range(4):
            replies, _ = await collect(greedy, f"g{i}")
            assert replies[-1]["reason"] == "cancelled"
    await worker.wait_idle()


async def test_duplicate_start_and_text_after_end_are_refusals_not_endings(worker):
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="c", voice="tara", text="First.", options={"max_tokens": 7 * 6 + 1, "seed": 3})
        await send(ws, type="start", context_id="c", voice="leo", text="Second.")
        await send(ws, type="end", context_id="c")
        await send(ws, type="text", context_id="c", text="Too late.")
        replies, pcm = await collect(ws, "c")
    kinds = [(r["type"], r.get("message_type")) for r in replies]
    assert kinds[:2] == [("rejected", "start"), ("rejected", "text")]
    assert "already active" in replies[0]["message"] and "after 'end'" in replies[1]["message"]
    assert replies[-1]["type"] == "done" and replies[-1]["stats"]["frames"] == 6
    assert len(pcm) == 6 * SAMPLES_PER_FRAME * 2  # the refused text was not spoken


async def test_lone_surrogate_text_is_refused_without_ending_the_context(worker):
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="u", voice="tara", text="Fine text.", options=FAST)
        await ws.send('{"type": "text", "context_id": "u", "text": "\\ud800 broken"}')
        await send(ws, type="end", context_id="u")
        replies, pcm = await collect(ws, "u")
    assert replies[0]["type"] == "rejected" and "not valid Unicode" in replies[0]["message"]
    assert replies[-1]["type"] == "done" and pcm


async def test_voice_ids_are_checked_exactly_and_never_echoed_whole(worker):
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="nl", voice="tara\n", text="Hi.", options=FAST)
        await send(ws, type="end", context_id="nl")
        replies, _ = await collect(ws, "nl")
        assert replies[-1]["code"] == "unknown_voice" and replies[-1]["retryable"] is False
        await send(ws, type="start", context_id="huge", voice="v" * 10_000, text="Hi.")
        replies, _ = await collect(ws, "huge")
        assert replies[-1]["type"] == "error" and replies[-1]["code"] == "bad_request"
        assert len(replies[-1]["message"]) < 200


async def test_text_with_no_place_to_cut_is_a_client_error_not_a_retry(worker):
    """A 4000-character word is under the text limit but no engine request can hold it (its audio
    budget alone is past the cap) and there is no space to cut at."""
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="e", voice="tara", text="Supercalifragilistic" * 200, options=FAST)
        await send(ws, type="end", context_id="e")
        replies, pcm = await collect(ws, "e")
    assert replies[-1]["type"] == "error" and replies[-1]["code"] == "text_too_long"
    assert replies[-1]["retryable"] is False and pcm == b""


async def test_text_with_nothing_to_read_is_not_spoken(worker):
    """4000 emoji: the text front end reads nothing in them (issue 36), so no engine request runs
    and the voice does not babble over an empty prompt; with `normalize` false they are the caller's
    prompt, ~16,000 tokens no request can hold: a client error, never a retry."""
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="e", voice="tara", text="\U0001F600" * 4000, options=FAST)
        await send(ws, type="end", context_id="e")
        replies, pcm = await collect(ws, "e")
        assert [r["type"] for r in replies] == ["done"] and pcm == b""
        assert replies[-1]["stats"]["engine_requests"] == 0
        await send(ws, type="start", context_id="raw", voice="tara", text="\U0001F600" * 4000,
                   options={**FAST, "normalize": False})
        await send(ws, type="end", context_id="raw")
        replies, pcm = await collect(ws, "raw")
    assert replies[-1]["type"] == "error" and replies[-1]["code"] == "text_too_long"
    assert replies[-1]["retryable"] is False and pcm == b""


async def test_long_text_is_spoken_as_several_requests_joined_without_clicks(worker):
    sentence = "This sentence is one of many in a long paragraph that a client sends in one go."
    text = " ".join([sentence] * 15)  # ~1200 characters: more than one request of a 4096-token context holds
    before = metric(worker, 'voicering_worker_engine_requests_total{finish="length"}')
    async with connect(worker.url) as ws:
        await send(ws, type="start", context_id="long", voice="tara", text=text,
                   options={**FAST, "trim_silence": False})
        await send(ws, type="end", context_id="long")
        replies, pcm = await collect(ws, "long", timeout=300)
    done = replies[-1]
    assert done["type"] == "done", replies
    stats = done["stats"]
    assert stats["engine_requests"] >= 3 and stats["segments"] == 1
    assert stats["finish_reason"] == "length"  # max_tokens cut every request: reported, not called complete silently
    assert stats["frames"] == 2 * stats["engine_requests"]
    audio = np.frombuffer(pcm, "<i2").astype(np.float64)
    assert len(audio) == stats["frames"] * SAMPLES_PER_FRAME
    per_request = 2 * SAMPLES_PER_FRAME
    level = np.sqrt(np.mean(audio ** 2))
    for join in range(per_request, len(audio), per_request):
        assert abs(audio[join - 1]) < 0.01 * level and abs(audio[join]) < 0.01 * level  # faded to ~0 at the join
    after = metric(worker, 'voicering_worker_engine_requests_total{finish="length"}')
    assert after - before >= stats["engine_requests"]
