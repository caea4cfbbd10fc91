"""`POST /v1/audio/speech` through a real `voicering gateway` process (uvicorn) to the session's real
worker (vLLM engine, stand-in weights), with the official `openai` client, sync and async."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import time

import av
import httpx
import openai
import pytest
import soundfile as sf

from gpu_worker.client import WorkerClient
from gpu_worker.protocol import ContextOptions

FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
EXTRA = {"seed": 11, "max_tokens": 15}  # voicering's own fields: reproducible and short (2 frames)
FRAME_S = 2048 / 24000


@pytest.fixture
async def key(new_tenant):
    _, api_key = await new_tenant()
    return api_key


def client(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


def decoded_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 48000
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_response_format_decodes_to_the_audio_spoken(gateway, key, fmt):
    with client(gateway, key).audio.speech.with_streaming_response.create(
            model="tts-1", voice="tara", input="Hello there.", response_format=fmt, extra_body=EXTRA) as response:
        assert response.headers["content-type"].startswith({"pcm": "audio/pcm", "mp3": "audio/mpeg", "opus": "audio/ogg",
                                                            "aac": "audio/aac", "flac": "audio/flac",
                                                            "wav": "audio/wav"}[fmt])
        data = b"".join(response.iter_bytes())
    # mp3 decoders keep the encoder's delay and padding (no Xing/LAME header in a stream): up to 2 mp3 frames
    assert decoded_seconds(data, fmt) == pytest.approx(2 * FRAME_S, abs=0.1 if fmt == "mp3" else 0.06)
    if fmt == "wav":
        samples, rate = sf.read(io.BytesIO(data), dtype="int16")
        assert rate == 24000 and len(samples) == 2 * 2048


def test_server_timing_splits_the_gateway_s_wait_from_the_worker_s(gateway, key):
    began = time.perf_counter()
    with httpx.stream("POST", f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "tts-1", "voice": "tara", "input": "Timed.", "response_format": "pcm", **EXTRA},
                      timeout=60) as response:
        ttfb_ms = (time.perf_counter() - began) * 1000
        body = response.read()
    assert response.status_code == 200 and body
    timing = dict(re.fullmatch(r"(\w+);dur=([\d.]+)", part.strip()).groups()
                  for part in response.headers["server-timing"].split(","))
    admit, worker_ms, place = float(timing["admit"]), float(timing["worker"]), float(timing["place"])
    assert set(timing) == {"admit", "worker", "place"} and 0 < admit and 0 < worker_ms
    assert admit + worker_ms <= ttfb_ms  # both inside what the client waited for its first byte
    assert 0 < place <= worker_ms  # a worker took the start before it spoke
    metrics = httpx.get(gateway.metrics_url, timeout=10).text  # the internal metrics server
    assert re.search(r'voicering_gateway_requests_total\{route="/v1/audio/speech",status="200"\} [1-9]', metrics)


async def test_pcm_equals_the_worker_s_samples_for_the_same_seed(gateway, worker, key):
    api = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    response = await api.audio.speech.create(model="voicering-orpheus", voice="tara", input="Same seed, same audio.",
                                             response_format="pcm", extra_body=EXTRA)
    async with await WorkerClient.connect(worker.url) as direct:
        spoken = await direct.say("tara", "Same seed, same audio.", options=ContextOptions(seed=11, max_tokens=15))
    assert response.content == spoken.pcm and spoken.pcm


async def test_normalize_false_reaches_the_worker_and_the_default_reads_the_digits(gateway, worker, key):
    """Issue 36: the gateway passes `normalize` through; the worker reads "$5" as the text front end
    does unless the caller says it normalizes itself (seeded audio is identical for identical prompts)."""
    api = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    text = "It is $5."

    async def http(**extra) -> bytes:
        response = await api.audio.speech.create(model="voicering-orpheus", voice="tara", input=text,
                                                 response_format="pcm", extra_body={**EXTRA, **extra})
        return response.content

    async with await WorkerClient.connect(worker.url) as direct:
        read = await direct.say("tara", "It is five dollars.", options=ContextOptions(seed=11, max_tokens=15))
        as_written = await direct.say("tara", text, options=ContextOptions(seed=11, max_tokens=15, normalize=False))
    assert read.pcm != as_written.pcm
    assert await http() == read.pcm
    assert await http(normalize=False) == as_written.pcm


def test_sse_events_carry_base64_audio_then_usage(gateway, key):
    with httpx.stream("POST", f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "tts-1", "voice": "leo", "input": "Events.", "response_format": "pcm",
                            "stream_format": "sse", **EXTRA}, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(audio) == 2 * 2048 * 2
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == 15
    # OpenAI's three token fields (input: the workers report no prompt tokens), voicering's seconds beside
    assert done["usage"]["input_tokens"] == 0 and done["usage"]["total_tokens"] == 15
    assert done["usage"]["audio_seconds"] == pytest.approx(2 * FRAME_S, abs=0.001)
    # the session worker is alone in the gateway's ring: it owns every voice and speaks it itself
    assert (done["served_by"], done["proxied"]) == (response.headers["x-voicering-worker"], False)
    assert done["served_by"]


def test_sse_with_alignment_sends_each_word_s_time_between_the_deltas_on_the_stretched_clock(gateway, key):
    def events(speed: float) -> list[dict]:
        with httpx.stream("POST", f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                          json={"model": "tts-1", "voice": "tara", "input": "I paid $5, okay?", "response_format": "pcm",
                                "stream_format": "sse", "alignment": "word", "speed": speed, "seed": 4,
                                "max_tokens": 7 * 10 + 1}, timeout=60) as response:
            assert response.status_code == 200
            return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]

    normal, fast = events(1.0), events(2.0)
    assert normal[0]["type"] == "speech.audio.delta" and normal[-1]["type"] == "speech.audio.done"
    assert {e["type"] for e in normal} == {"speech.audio.delta", "speech.alignment", "speech.audio.done"}
    words = [w for e in normal if e["type"] == "speech.alignment" for w in e["words"]]
    assert [w["text"] for w in words] == ["I", "paid", "$5", "okay"]
    assert all(e["estimated"] is True for e in normal if e["type"] == "speech.alignment")  # stand-in noise
    audio_s = len(b"".join(base64.b64decode(e["audio"]) for e in normal if e["type"] == "speech.audio.delta")) / 48000
    assert 0 <= words[0]["start_s"] and words[-1]["end_s"] <= audio_s + 1e-3
    halved = [w for e in fast if e["type"] == "speech.alignment" for w in e["words"]]
    # halved, to espeak-ng's reproducibility between two readings (~10 ms: tests/gateway/test_livekit_tts.py)
    assert [w["start_s"] for w in halved] == [pytest.approx(w["start_s"] / 2, abs=0.01) for w in words]
    assert halved[-1]["start_s"] < 0.75 * words[-1]["start_s"]  # not the unstretched times


def test_speed_changes_duration_not_pitch_range(gateway, key):
    api = client(gateway, key)
    normal = api.audio.speech.create(model="tts-1", voice="tara", input="Fast.", response_format="pcm",
                                     extra_body={"seed": 3, "max_tokens": 50})
    fast = api.audio.speech.create(model="tts-1", voice="tara", input="Fast.", response_format="pcm", speed=2.0,
                                   extra_body={"seed": 3, "max_tokens": 50})
    assert len(fast.content) == pytest.approx(len(normal.content) / 2, rel=0.1)


async def test_speed_does_not_change_what_is_billed(gateway, new_tenant):
    """Billed is the audio the worker generated, before the time-stretch: speed 4 bills the same
    seconds as speed 1, not a quarter of them."""
    _, key = await new_tenant()
    api = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    fast = await api.audio.speech.create(model="tts-1", voice="tara", input="Fast.", response_format="pcm",
                                         speed=4.0, extra_body={"seed": 3, "max_tokens": 7 * 7 + 1})
    sent_s = len(fast.content) / 48000
    assert sent_s > 0
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(50):
            usage = (await http.get(f"{gateway.url}/v1/usage", headers={"Authorization": f"Bearer {key}"})).json()
            if usage["requests"]:
                break
            await asyncio.sleep(0.1)
    assert usage["requests"] == 1 and usage["audio_seconds"] == pytest.approx(4 * sent_s, rel=0.15)


def test_public_port_serves_no_metrics(gateway):
    assert httpx.get(f"{gateway.url}/metrics", timeout=10).status_code == 404
    assert httpx.get(gateway.metrics_url, timeout=10).status_code == 200


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": "   \n"}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"response_format": "ogg"}, "response_format"),
    ({"speed": 4.5}, "speed"),
    ({"speed": 0.2}, "speed"),
    ({"temperature_of_the_room": 3}, "temperature_of_the_room"),
    ({"stream_format": "chunks"}, "stream_format"),
    ({"alignment": "word"}, "alignment"),  # timings are SSE events: refused on a raw audio body
    ({"alignment": "character", "stream_format": "sse"}, "alignment"),
])
def test_bad_requests_are_400_in_openai_s_shape(gateway, key, body, param):
    payload = {"model": "tts-1", "voice": "tara", "input": "Hi.", **body}
    response = httpx.post(f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"}, json=payload)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_the_openai_client_raises_its_bad_request_error(gateway, key):
    with pytest.raises(openai.BadRequestError) as err:
        client(gateway, key).audio.speech.create(model="tts-1", voice="tara", input="Hi.", speed=9.0)
    assert err.value.body["param"] == "speed"


def test_unknown_voice_and_model_are_404(gateway, key):
    api = client(gateway, key)
    with pytest.raises(openai.NotFoundError) as err:
        api.audio.speech.create(model="tts-1", voice="nobody", input="Hi.")
    assert err.value.body["code"] == "voice_not_found"
    with pytest.raises(openai.NotFoundError) as err:
        api.audio.speech.create(model="whisper-1", voice="tara", input="Hi.")
    assert err.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("header", [None, "Bearer vr_not-a-real-key-at-all-xxxxxxxxxxxxxxxxxxxxxxxx", "Basic abc"])
def test_missing_or_invalid_key_is_401(gateway, header):
    headers = {"Authorization": header} if header else {}
    response = httpx.post(f"{gateway.url}/v1/audio/speech", headers=headers,
                          json={"model": "tts-1", "voice": "tara", "input": "Hi."})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_models_are_listed(gateway, key):
    ids = [m.id for m in client(gateway, key).models.list()]
    assert "voicering-orpheus" in ids and "tts-1" in ids


def test_the_openapi_schema_documents_speech(gateway):
    schema = httpx.get(f"{gateway.url}/openapi.json").json()
    assert "/v1/audio/speech" in schema["paths"] and "SpeechRequest" in schema["components"]["schemas"]


def test_first_audio_is_sent_before_the_context_is_spoken(gateway, key):
    """The body is chunked and its first bytes leave with the first audio: with 40 frames to speak,
    the first chunk arrives well before the last."""
    chunks = []
    with httpx.stream("POST", f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "tts-1", "voice": "tara", "input": "A longer line to speak.",
                            "response_format": "pcm", "seed": 1, "max_tokens": 7 * 40 + 1}, timeout=120) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        for chunk in response.iter_raw():
            chunks.append(len(chunk))
    assert len(chunks) >= 3 and sum(chunks) == 40 * 2048 * 2
    assert chunks[0] <= 2048 * 2 * 2  # the first piece is one or two frames, not the whole file


async def test_health_shows_the_ring_the_gateway_routes_by_as_the_worker_shows_its_own(gateway, worker):
    """`voicering demo` waits on these before each line instead of sleeping: the gateway's view of the
    ring (epoch, summed heartbeat loads) next to the worker's."""
    async with httpx.AsyncClient(timeout=10) as http:
        deadline = time.monotonic() + 30
        while True:
            mine = (await http.get(f"{gateway.url}/health")).json()
            theirs = await asyncio.to_thread(worker.health)
            if mine["ring_epoch"] == theirs["ring_epoch"] and mine["ring_load"] == theirs["ring_load"] == 0:
                break
            assert time.monotonic() < deadline, (mine, theirs)
            await asyncio.sleep(0.2)
    assert mine["workers"] == theirs["ring_workers"] >= 1 and isinstance(mine["ring_epoch"], int)
