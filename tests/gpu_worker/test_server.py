"""The worker end to end: a real `voicering worker` process (real vLLM engine, stand-in weights,
2 LoRA voices) over real websockets on loopback."""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest
from websockets.asyncio.client import connect

from gpu_worker.client import WorkerClient, WorkerRequestError
from gpu_worker.orpheus import SAMPLES_PER_FRAME
from gpu_worker.protocol import ContextOptions

SHORT = ContextOptions(max_tokens=7 * 12 + 1, seed=7)


async def test_health_is_counts_only(worker):
    """Probed every few seconds by every orchestrator: counts, never a walk of the adapter store and
    never a list of (tenants') voice ids."""
    health = await asyncio.to_thread(worker.health)
    assert health["status"] == "ok"
    assert "voices" not in health
    assert all(not isinstance(v, list | dict) for v in health.values())
    assert isinstance(health["adapters_resident"], int)


async def test_say_streams_whole_frames_with_stats(worker):
    async with await WorkerClient.connect(worker.url) as client:
        speech = await client.say("tara", "Hello there.", options=SHORT)
    stats = speech.done.stats
    assert stats.frames == 12 and stats.invalid_tokens == 0
    assert len(speech.pcm) == stats.frames * SAMPLES_PER_FRAME * 2  # every frame emitted, PCM16
    assert speech.chunks >= 3  # streamed, not one blob
    assert stats.ttfb_ms is not None and stats.ttfb_ms > 0
    assert stats.audio_s == pytest.approx(12 * SAMPLES_PER_FRAME / 24000, rel=1e-3)
    assert np.abs(np.frombuffer(speech.pcm, "<i2")).max() > 0


async def test_same_seed_is_reproducible_and_lora_weights_matter(worker, adapter_store):
    # Same prompt name ("tara"), different adapter weights: only the LoRA differs.
    for name, source in (("tara-copy", "tara"), ("leo-as-tara", "leo")):
        if not (adapter_store / name).exists():
            shutil.copytree(adapter_store / source, adapter_store / name)
            (adapter_store / name / "voicering.json").write_text(json.dumps({"prompt_name": "tara"}))
    async with await WorkerClient.connect(worker.url) as client:
        tara = await client.say("tara", "Same words.", options=SHORT)
        copy = await client.say("tara-copy", "Same words.", options=SHORT)
        other = await client.say("leo-as-tara", "Same words.", options=SHORT)
        leo = await client.say("leo", "Same words.", options=SHORT)
    assert tara.pcm == copy.pcm
    assert tara.pcm != other.pcm
    assert tara.pcm != leo.pcm


async def test_four_concurrent_streams_on_one_connection(worker):
    async with await WorkerClient.connect(worker.url) as client:
        results = await asyncio.gather(*(
            client.say(voice, f"Stream number {i}.", options=ContextOptions(max_tokens=7 * 8 + 1, seed=i))
            for i, voice in enumerate(["tara", "leo", "tara", "leo"])
        ))
    for speech in results:
        assert speech.done.reason == "completed"
        assert speech.done.stats.frames == 8 and speech.done.stats.invalid_tokens == 0
        assert len(speech.pcm) == 8 * SAMPLES_PER_FRAME * 2
    assert len({s.pcm for s in results}) == 4


async def test_streaming_text_push_flush_end(worker):
    async with await WorkerClient.connect(worker.url) as client:
        stream = await client.start("leo", options=ContextOptions(max_tokens=7 * 4 + 1, seed=3))
        await stream.push("First part, ")
        await stream.push("then more.")
        await stream.flush()
        await stream.push("A second segment.")
        await stream.end()
        pcm = b"".join([c async for c in stream.audio()])
    assert stream.done.stats.segments == 2
    assert stream.done.stats.frames == 8
    assert len(pcm) == 8 * SAMPLES_PER_FRAME * 2


async def test_cancel_frees_the_engine_slot(worker):
    async with await WorkerClient.connect(worker.url) as client:
        stream = await client.start("tara", "A long sentence that we will not wait for.", options=ContextOptions(max_tokens=2000))
        await stream.end()
        got_audio = False
        async for _ in stream.audio():
            got_audio = True
            await stream.cancel()
            break
        assert got_audio
        rest = [c async for c in stream.audio()]  # drains until the worker's done(cancelled)
        assert stream.done is not None and stream.done.reason == "cancelled"
        assert len(rest) < 50
    await worker.wait_idle()


async def test_client_disconnect_mid_stream_aborts_and_others_continue(worker):
    survivor = await WorkerClient.connect(worker.url)
    try:
        ongoing = asyncio.create_task(survivor.say("leo", "I keep talking.", options=ContextOptions(max_tokens=7 * 20 + 1, seed=5)))
        quitter = await WorkerClient.connect(worker.url)
        stream = await quitter.start("tara", "I will hang up.", options=ContextOptions(max_tokens=3000))
        await stream.end()
        async for _ in stream.audio():
            break
        quitter._ws.transport.abort()  # the TCP connection drops without a close handshake
        await quitter.aclose()
        speech = await asyncio.wait_for(ongoing, timeout=120)
        assert speech.done.stats.frames == 20
    finally:
        await survivor.aclose()
    await worker.wait_idle()


async def test_unknown_voice_is_a_clear_error(worker):
    async with await WorkerClient.connect(worker.url) as client:
        with pytest.raises(WorkerRequestError) as err:
            await client.say("nobody-here", "Hi.")
        assert err.value.error.code == "unknown_voice" and not err.value.retryable
        assert "nobody-here" in err.value.error.message
        # the connection is still usable
        ok = await client.say("tara", "Still here.", options=SHORT)
        assert ok.done.reason == "completed"


@pytest.mark.parametrize("text", ["", "   \n\t "])
async def test_empty_text_is_rejected(worker, text):
    async with await WorkerClient.connect(worker.url) as client:
        with pytest.raises(WorkerRequestError) as err:
            await client.say("tara", text)
        assert err.value.error.code == "empty_text"


async def test_text_over_limit_is_rejected(worker):
    async with await WorkerClient.connect(worker.url) as client:
        with pytest.raises(WorkerRequestError) as err:
            await client.say("tara", "x" * 5000)
        assert err.value.error.code == "text_too_long" and "4096" in err.value.error.message
    await worker.wait_idle()


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("raw", "kind", "needle"),
    [
        ("not json", "rejected", "not valid JSON"),
        ("[1, 2]", "rejected", "JSON object"),
        ('{"type": "dance", "context_id": "a"}', "rejected", "unknown message type"),
        ('{"type": "start", "voice": "tara"}', "rejected", "context_id"),
        ('{"type": "start", "context_id": "a"}', "error", "voice"),  # a refused start: context 'a' never opened
        ('{"type": "start", "context_id": "a", "voice": "tara", "options": {"temperature": "hot"}}', "error", "temperature"),
        ('{"type": "start", "context_id": "a", "voice": "tara", "bogus": 1}', "error", "unknown field"),
        ('{"type": "text", "context_id": "ghost", "text": "hi"}', "rejected", "no active context"),
        (b"\x00\x01binary", "rejected", "binary"),
        # shapes that used to kill the reader task and the whole connection silently
        ('{"type": ["start"], "context_id": "a"}', "rejected", "unknown message type"),
        ('{"type": {}, "context_id": "a"}', "rejected", "unknown message type"),
        (DEEP, "rejected", "nested too deeply"),
        ('{"type": "text", "context_id": "a", "text": "x", "n": ' + "9" * 5000 + "}", "rejected", "number too large"),
        ('{"type": "start", "context_id": "\\ud800", "voice": "tara"}', "rejected", "context_id"),
        ('{"type": "start", "context_id": "s", "voice": "tara", "text": "\\udc00"}', "error", "not valid Unicode"),
    ],
)
async def test_malformed_messages_are_answered_and_other_contexts_carry_on(worker, raw, kind, needle):
    async with connect(worker.url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "live", "voice": "tara", "text": "I keep going.",
                                  "options": {"max_tokens": 7 * 4 + 1, "seed": 1}}))
        await ws.send(raw)
        await ws.send(json.dumps({"type": "end", "context_id": "live"}))
        replies, audio = [], 0
        while not replies or replies[-1]["type"] not in ("done",) or replies[-1]["context_id"] != "live":
            msg = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(msg, bytes):
                audio += 1
            else:
                replies.append(json.loads(msg))
        answer = replies[0]
        assert answer["type"] == kind and answer["retryable"] is False
        assert answer["code"] == "bad_request"
        assert needle in answer["message"] and len(answer["message"]) < 300
        if kind == "rejected":
            assert answer["context_id"] in (None, "a", "ghost")
        assert audio > 0 and replies[-1]["reason"] == "completed"  # the other context was untouched
        assert [r["type"] for r in replies] == [kind, "done"]


async def test_ids_outside_the_audio_range_never_misalign_frames(worker):
    """Constraint off: the random model emits text/special ids; they are counted and skipped."""
    async with await WorkerClient.connect(worker.url) as client:
        speech = await client.say("tara", "Anything at all.", options=ContextOptions(max_tokens=300, seed=11, constraint="off"))
    stats = speech.done.stats
    assert stats.invalid_tokens > 0
    assert stats.tokens >= stats.invalid_tokens + 7 * stats.frames
    assert len(speech.pcm) == stats.frames * SAMPLES_PER_FRAME * 2


async def test_serving_time_trim_never_cuts_audio_that_starts_loud(worker):
    """The worker's head-silence gate is on by default; the stand-in's noise starts at once, so it
    must pass every sample through untouched."""
    async with await WorkerClient.connect(worker.url) as client:
        trimmed = await client.say("tara", "Trim me.", options=ContextOptions(max_tokens=7 * 10 + 1, seed=21))
        plain = await client.say("tara", "Trim me.", options=ContextOptions(max_tokens=7 * 10 + 1, seed=21,
                                                                               trim_silence=False))
    assert trimmed.pcm == plain.pcm
    assert trimmed.done.stats.head_silence_dropped_ms == 0.0
