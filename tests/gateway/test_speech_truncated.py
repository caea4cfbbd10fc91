"""A speech response cut short after its first audio must look cut short (issue 19, M5).

The 200 is out once audio flows, so a worker lost mid-context cannot change the status: SSE
ends with an `error` event (OpenAI's error object) and no `speech.audio.done`; raw audio ends
without the chunked body's last chunk, so httpx and the openai client raise instead of handing
back a short file as if it were whole.

The failure is real: a worker of this test's own (the session worker is shared), behind a gateway
pinned to it, SIGKILLed while three streams are mid-context. Worker and gateway stop at the end.

The gateway says so once, in its own words (issue 34 item 16): one line for the burst, naming how
many responses were cut, the worker and why, with their trace ids; never uvicorn's "ASGI callable
returned without completing response." once per request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal

import httpx
import openai
import pytest

from gateway.api.cuts import UVICORN_INCOMPLETE
from tests.fixtures.gateway import start_gateway
from tests.fixtures.fleet import WorkerSpec

pytestmark = pytest.mark.timeout(600)

LONG = {"model": "tts-1", "voice": "tara", "input": "A long line that is cut short.", "seed": 5,
        "max_tokens": 3000}  # ~36 s of audio: far longer than the test waits


DOOMED = WorkerSpec("doomed", ("--max-streams", "4"))
WORKERS = (DOOMED,)  # started ahead of this module (tests/fixtures/fleet.py)


@pytest.fixture
def doomed(fleet, request, adapter_store, redis_server, tmp_path):
    """A worker of its own and a gateway pinned to it (`--worker URL`: no ring)."""
    (worker,) = fleet.take(request, DOOMED)
    gateway = start_gateway(redis_server.url, adapter_store, tmp_path / "gateway", "--worker", worker.url)
    try:
        yield worker, gateway
    finally:
        gateway.stop()
        worker.stop()


async def test_audio_cut_after_its_first_chunk_is_an_error_for_every_client(doomed, new_tenant):
    worker, gateway = doomed
    _, key = await new_tenant()
    auth = {"Authorization": f"Bearer {key}"}
    started = [asyncio.Event() for _ in range(3)]

    async def raw_httpx() -> tuple[int, BaseException | None]:
        got = 0
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", f"{gateway.url}/v1/audio/speech", headers=auth,
                                   json={**LONG, "response_format": "pcm"}) as response:
                assert response.status_code == 200
                try:
                    async for chunk in response.aiter_bytes():
                        got += len(chunk)
                        started[0].set()
                except httpx.HTTPError as exc:
                    return got, exc
        return got, None

    async def raw_openai() -> tuple[int, BaseException | None]:
        api = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)
        got = 0
        try:
            async with api.audio.speech.with_streaming_response.create(
                    model="tts-1", voice="tara", input=LONG["input"], response_format="mp3",
                    extra_body={"seed": 5, "max_tokens": 3000}) as response:
                async for chunk in response.iter_bytes():
                    got += len(chunk)
                    started[1].set()
        except Exception as exc:  # the SDK's own transport (it ships an httpx of its own) or openai.APIError
            return got, exc
        finally:
            await api.close()
        return got, None

    async def sse() -> list[dict]:
        events = []
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", f"{gateway.url}/v1/audio/speech", headers=auth,
                                   json={**LONG, "response_format": "pcm", "stream_format": "sse"}) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():  # raises if the body itself were cut
                    if line.startswith("data: "):
                        events.append(json.loads(line[len("data: "):]))
                        started[2].set()
        return events

    tasks = [asyncio.create_task(raw_httpx()), asyncio.create_task(raw_openai()), asyncio.create_task(sse())]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 180)
    os.killpg(worker.proc.pid, signal.SIGKILL)  # the worker and its engine, mid-context
    (raw_got, raw_error), (sdk_got, sdk_error), events = await asyncio.wait_for(asyncio.gather(*tasks), 120)

    # raw audio: the body ends without its last chunk; both clients raise
    assert raw_got > 0 and isinstance(raw_error, httpx.RemoteProtocolError), raw_error
    assert sdk_got > 0 and sdk_error is not None, "the openai client kept a truncated mp3 as if it were whole"
    assert isinstance(sdk_error, openai.APIError) or type(sdk_error).__name__ == "RemoteProtocolError", sdk_error
    # SSE: audio, then an error in OpenAI's shape, and no done
    assert events[0]["type"] == "speech.audio.delta" and base64.b64decode(events[0]["audio"])
    assert events[-1]["type"] == "error" and set(events[-1]["error"]) == {"message", "type", "param", "code"}
    assert events[-1]["error"]["code"] == "worker_lost" and events[-1]["error"]["message"]
    assert not [e for e in events if e["type"] == "speech.audio.done"]
    # the gateway lives on, and the truncated streams were metered as opened (requests and audio)
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(f"{gateway.url}/health")).status_code == 200
        for _ in range(50):
            usage = (await http.get(f"{gateway.url}/v1/usage", headers=auth)).json()
            if usage["requests"] >= 3:
                break
            await asyncio.sleep(0.1)
    assert usage["requests"] == 3 and usage["audio_seconds"] > 0
    # the gateway's log: the burst said once, in its words; uvicorn's line never
    for _ in range(50):  # the burst's line is written CUT_REPORT_S after its first cut
        cut_lines = [line for line in gateway.log_path.read_text().splitlines() if "speech response(s) after" in line]
        if cut_lines:
            break
        await asyncio.sleep(0.1)
    log = gateway.log_path.read_text()
    assert UVICORN_INCOMPLETE not in log, gateway.log_tail()
    assert len(cut_lines) == 1 and "cut 3 speech response(s)" in cut_lines[0], cut_lines or gateway.log_tail()
    assert f"worker {worker.url} failed (worker_lost" in cut_lines[0], cut_lines[0]
