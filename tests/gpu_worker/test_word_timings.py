"""Word timings through the session's real worker (issue 37 item 2): a version-2 start asking for
`alignment: "word"` gets `alignment` messages after the audio they describe, in the caller's words,
on the context's clock across segments. The stand-in's audio is noise, so every word here is the
estimate (`estimated: true`; docs/alignment.md); aligned timings on speech are the aligner's tests
and bench."""

from __future__ import annotations

import json

from websockets.asyncio.client import connect

from gpu_worker.client import WorkerClient
from gpu_worker.protocol import PROTOCOL_HEADER, AudioChunk, ContextOptions

SAMPLE_RATE = 24000
WORDS = ContextOptions(max_tokens=7 * 12 + 1, seed=11, alignment="word")


async def speak_raw(url: str, messages: list[dict], *, version: int = 2) -> list[object]:
    """Every message of one context as it came, audio chunks as their sample counts."""
    headers = {PROTOCOL_HEADER: str(version)} if version >= 2 else None
    got: list[object] = []
    async with connect(url, additional_headers=headers, max_size=1 << 22) as ws:
        for message in messages:
            await ws.send(json.dumps(message))
        while True:
            raw = await ws.recv()
            if isinstance(raw, bytes):
                got.append(len(AudioChunk.decode(raw).pcm) // 2)
                continue
            message = json.loads(raw)
            got.append(message)
            if message["type"] in ("done", "error"):
                return got


def start(text: str, **options) -> dict:
    return {"type": "start", "context_id": "c", "voice": "tara", "text": text,
            "options": {"max_tokens": 7 * 12 + 1, "seed": 11, "alignment": "word", **options}}


async def test_each_word_is_timed_once_in_the_caller_s_words_after_its_audio(worker):
    got = await speak_raw(worker.url, [start("Well <laugh> I paid $5 at 3:30pm, okay?"), {"type": "end",
                                                                                      "context_id": "c"}])
    assert got[0]["type"] == "opened" and got[-1]["type"] == "done"
    heard, words = 0, []
    for item in got:
        if isinstance(item, int):
            heard += item
        elif item["type"] == "alignment":
            assert item["context_id"] == "c" and item["estimated"] is True  # stand-in noise: the estimate
            assert all(w["end_s"] <= heard / SAMPLE_RATE + 1e-3 for w in item["words"])  # after its audio
            words += item["words"]
    assert [w["text"] for w in words] == ["Well", "I", "paid", "$5", "at", "3:30pm", "okay"]
    starts = [w["start_s"] for w in words]
    assert starts == sorted(starts) and all(w["end_s"] >= w["start_s"] >= 0 for w in words)
    assert words[-1]["end_s"] <= got[-1]["stats"]["audio_s"] + 1e-3


async def test_a_second_segment_is_timed_on_the_same_clock_after_the_first(worker):
    async with await WorkerClient.connect(worker.url, version=2) as client:
        stream = await client.start("tara", "First part here.", options=WORDS)
        await stream.flush()
        await stream.push("And then the second.")
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
    words = [w for a in stream.alignments for w in a.words]
    assert [w.text for w in words] == ["First", "part", "here", "And", "then", "the", "second"]
    assert words[3].start_s >= words[2].end_s and words[-1].end_s <= len(pcm) / 2 / SAMPLE_RATE + 1e-3
    assert stream.done.stats.segments == 2


async def test_text_spoken_as_written_is_timed_as_written(worker):
    async with await WorkerClient.connect(worker.url, version=2) as client:
        stream = await client.start("tara", "Paid 5 dollars.", options=ContextOptions(
            max_tokens=7 * 8 + 1, seed=3, alignment="word", normalize=False))
        await stream.end()
        [chunk async for chunk in stream.audio()]
    assert [w.text for a in stream.alignments for w in a.words] == ["Paid", "5", "dollars"]


async def test_a_version_1_connection_asking_for_timings_is_refused_and_others_get_the_old_bytes(worker):
    refused = await speak_raw(worker.url, [start("Hello there.")], version=1)
    assert refused[-1]["type"] == "error" and refused[-1]["code"] == "bad_request"
    assert "version 2" in refused[-1]["message"] and len(refused) == 1
    plain = await speak_raw(worker.url, [{**start("Hello there."), "options": {"max_tokens": 15, "seed": 1}},
                                         {"type": "end", "context_id": "c"}])
    assert not [m for m in plain if isinstance(m, dict) and m["type"] == "alignment"]
