"""The Pipecat TTS service in a real Pipecat pipeline in-process (pipecat-ai 1.14: a PipelineWorker
run by a WorkerRunner, no transport; the helpers are bench/pipecat.py's, the bench's own), against
the session's real `voicering gateway` process and worker, through `/v1/tts/stream` with a key.

- a turn as an LLM writes it (response start, tokens, response end) speaks: TTSStartedFrame, 24 kHz
  mono audio, one TTSTextFrame per word sent, in order, on increasing PTS (the worker's word
  timings; the stand-in's noise gets estimated ones), TTSStoppedFrame, and Pipecat's TTFB metric;
- a TTSSpeakFrame's audio is byte-identical to a raw websocket context's with the same seed;
- several turns share one websocket;
- an interruption mid-turn: no audio leaves the service after it (none within 50 ms, none at all),
  and the gateway's context is cancelled (the worker counts a cancelled context, goes idle, and
  the gateway logs the context's hop as cancelled); the next turn speaks;
- the gateway's errors arrive as Pipecat ErrorFrames with its code and message: an unknown voice
  (the service stops taking work: every turn would fail), a bad key at the handshake.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

from pipecat.frames.frames import (ErrorFrame, Frame, InterruptionFrame, InterruptionWorkerFrame,
                                   LLMFullResponseStartFrame, LLMTextFrame, MetricsFrame, TTSAudioRawFrame,
                                   TTSStartedFrame, TTSStoppedFrame, TTSTextFrame)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.services.tts_service import TextAggregationMode
from pipecat.utils.errors import ErrorCategory
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from bench.pipecat import running, words
from gateway.pipecat import VoiceringError, VoiceringTTSService
from gpu_worker.protocol import AudioChunk
from gpu_worker.trace_context import parse_hop

TEXT = "Hello there. This turn speaks through Pipecat."
INTERRUPT_BOUND_S = 0.050


def service(gateway, key: str, **settings) -> VoiceringTTSService:
    return VoiceringTTSService(api_key=key, url=gateway.url,
                               settings=VoiceringTTSService.Settings(voice="tara", **settings))


def pcm(frames: list[Frame]) -> bytes:
    return b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))


def cancelled_contexts(worker) -> float:
    with urllib.request.urlopen(f"{worker.http}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "voicering_worker_contexts_total" and s.labels.get("outcome") == "cancelled")


def gateway_hops(gateway, outcome: str) -> int:
    hops = (parse_hop(line) for line in gateway.log_path.read_text(errors="replace").splitlines())
    return sum(1 for hop in hops if hop is not None and hop.hop == "gateway" and hop.outcome == outcome)


async def raw_context(gateway, key: str, text: str, options: dict) -> bytes:
    """The same context straight on the gateway's websocket: start with the text, flush, end."""
    async with connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers={"Authorization": f"Bearer {key}"},
                       max_size=1 << 22) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "raw", "voice": "tara", "text": text,
                                  "options": options}))
        await ws.send(json.dumps({"type": "flush", "context_id": "raw"}))
        await ws.send(json.dumps({"type": "end", "context_id": "raw"}))
        audio = []
        while True:
            message = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(message, bytes):
                audio.append(AudioChunk.decode(message).pcm)
            elif json.loads(message)["type"] in ("done", "error"):
                assert json.loads(message)["type"] == "done", message
                return b"".join(audio)


async def test_a_turn_speaks_with_word_timestamps_in_order_and_pipecat_s_ttfb(gateway, worker, new_tenant):
    _, key = await new_tenant()
    tts = service(gateway, key, seed=11, max_tokens=36)
    async with running(tts) as bot:
        frames = await bot.turn(TEXT)
        spoken = await bot.speak("One more line.")
        errors = bot.errors()
    assert not errors, errors
    started, stopped = [f for f in frames if isinstance(f, TTSStartedFrame)], [f for f in frames if isinstance(f, TTSStoppedFrame)]
    assert len(started) == 1 and len(stopped) == 1 and started[0].context_id == stopped[0].context_id
    audio = [f for f in frames if isinstance(f, TTSAudioRawFrame)]
    assert audio and {(f.sample_rate, f.num_channels) for f in audio} == {(24000, 1)}
    assert {f.context_id for f in audio} == {started[0].context_id}  # one context for the turn's two sentences
    timed = [f for f in frames if isinstance(f, TTSTextFrame)]
    assert [f.text for f in timed] == [w.strip(".") for w in TEXT.split()]  # every word sent, once, in order
    assert " ".join(f.raw_text for f in timed) == TEXT  # the LLM's text they stand for: what the context records
    stamps = [f.pts for f in timed]
    assert all(stamps) and stamps == sorted(stamps) and stamps[-1] > stamps[0]  # on the audio's clock, in order
    assert frames.index(timed[-1]) > frames.index(audio[0])  # words follow the audio they describe
    ttfb = [d.value for f in frames if isinstance(f, MetricsFrame) for d in f.data
            if isinstance(d, TTFBMetricsData) and d.value > 0]  # (the pipeline's first metrics are empty, 0)
    assert len(ttfb) == 1 and ttfb[0] < 120  # Pipecat's TTFB of the turn: its first text to its first audio
    assert pcm(spoken)
    assert tts.sockets_opened == 1 and tts.open_sockets == 0  # two turns, one websocket (closed at the end)
    await worker.wait_idle()


async def test_token_streaming_lets_the_worker_cut_the_sentences(gateway, worker, new_tenant):
    """TOKEN aggregation: the LLM's tokens go to the gateway as they come, with `chunking: "auto"`,
    and no flush; the turn speaks every word, in order (the worker's cuts: test_auto_chunking.py)."""
    _, key = await new_tenant()
    reply = "Sure, Dr. Smith is in at 3 p.m. today. She can see you then."
    tts = VoiceringTTSService(api_key=key, url=gateway.url, text_aggregation_mode=TextAggregationMode.TOKEN,
                              settings=VoiceringTTSService.Settings(voice="tara", seed=5, max_tokens=22))
    async with running(tts) as bot:
        frames = await bot.turn(reply)
        assert not bot.errors()
    assert pcm(frames)
    timed = [f.text for f in frames if isinstance(f, TTSTextFrame)]
    # each word as written, once, in order: "Dr." and "3 p.m." are one word each, as the text front end reads them
    assert timed == ["Sure", "Dr.", "Smith", "is", "in", "at", "3 p.m.", "today", "She", "can", "see", "you", "then"]
    await worker.wait_idle()


async def test_a_speak_frame_s_audio_equals_a_raw_websocket_context_s(gateway, worker, new_tenant):
    _, key = await new_tenant()
    line = "The same line, twice."
    tts = service(gateway, key, seed=23, max_tokens=29)
    async with running(tts) as bot:
        spoken = await bot.speak(line)
        assert not bot.errors()
    raw = await raw_context(gateway, key, line, {"seed": 23, "max_tokens": 29, "alignment": "word"})
    assert pcm(spoken) == raw and raw


async def test_an_interruption_stops_the_audio_and_cancels_the_gateway_context(gateway, worker, new_tenant):
    _, key = await new_tenant()
    await worker.wait_idle()
    cancelled_before, hops_before = cancelled_contexts(worker), gateway_hops(gateway, "cancelled")
    tts = service(gateway, key, seed=5, max_tokens=7 * 150 + 1)  # ~12 s of audio: still speaking when cut
    async with running(tts) as bot:
        since = len(bot.down.frames)
        await bot.say(LLMFullResponseStartFrame(), *[LLMTextFrame(w) for w in words(
            "This is a long answer that the listener cuts off in the middle. It would go on for a while.")])
        await bot.down.until(lambda fs: len([f for f in fs[since:] if isinstance(f, TTSAudioRawFrame)]) >= 3)
        await bot.say(InterruptionWorkerFrame())  # what a user turn starting pushes
        await bot.down.until(lambda fs: any(isinstance(f, InterruptionFrame) for f in fs[since:]))
        cut_at = next(t for t, f in bot.down.frames[since:] if isinstance(f, InterruptionFrame))
        cut = bot.down.of(TTSStartedFrame, since)[0].context_id
        await worker.wait_idle(timeout=30)  # the worker's engine request is gone
        after = await bot.speak("And now something else.")  # the next turn speaks
        assert not bot.errors(), bot.errors()
    late = [round(t - cut_at, 4) for t, f in bot.down.frames
            if isinstance(f, TTSAudioRawFrame) and f.context_id == cut and t > cut_at]
    assert not [d for d in late if d > INTERRUPT_BOUND_S], f"audio of the interrupted turn {late} s after the cut"
    assert late == []  # none at all: Pipecat drops the context's queue and the gateway's late audio is dropped
    assert pcm(after)
    assert cancelled_contexts(worker) == cancelled_before + 1  # the worker cancelled that context
    async with asyncio.timeout(10):
        while gateway_hops(gateway, "cancelled") < hops_before + 1:  # and the gateway logged it so
            await asyncio.sleep(0.05)
    assert tts.sockets_opened == 1


async def test_the_gateway_s_errors_are_error_frames_with_its_code_and_message(gateway, new_tenant):
    _, key = await new_tenant()
    unknown = VoiceringTTSService(api_key=key, url=gateway.url,
                                  settings=VoiceringTTSService.Settings(voice="nobody-here", max_tokens=15))
    async with running(unknown) as bot:
        frames = await bot.speak("Hello?")
        await bot.up.until(lambda fs: any(isinstance(f, ErrorFrame) for f in fs))
        error = bot.errors()[0]
    assert not pcm(frames)
    assert isinstance(error.exception, VoiceringError) and error.exception.code == "voice_not_found"
    assert "voice_not_found" in error.error and "nobody-here" in error.exception.message
    assert error.category is ErrorCategory.INVALID_REQUEST and not unknown.is_usable  # every turn would fail

    refused = VoiceringTTSService(api_key="vr_not-a-key", url=gateway.url,
                                  settings=VoiceringTTSService.Settings(voice="tara"))
    async with running(refused) as bot:
        await bot.up.until(lambda fs: any(isinstance(f, ErrorFrame) for f in fs))
        error = bot.errors()[0]
    assert error.exception.code == "invalid_api_key" and "HTTP 401" in error.error
    assert error.category is ErrorCategory.AUTHENTICATION and not refused.is_usable and refused.sockets_opened == 0
