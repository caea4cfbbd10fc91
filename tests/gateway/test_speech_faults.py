"""The speech endpoint when things go wrong: a client that hangs up, a tenant at its stream
limit, every worker full, Redis gone. Real gateway process, real worker, real Redis."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect

from gpu_worker.client import WorkerClient
from gpu_worker.protocol import ContextOptions


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


LONG = {"model": "tts-1", "voice": "tara", "input": "A long line.", "response_format": "pcm", "seed": 5,
        "max_tokens": 3000}


async def test_a_client_that_hangs_up_cancels_the_worker_and_its_audio_is_metered(gateway, worker, new_tenant):
    _, key = await new_tenant()
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{gateway.url}/v1/audio/speech", headers=auth(key), json=LONG) as response:
            assert response.status_code == 200
            got = 0
            async for chunk in response.aiter_raw():
                got += len(chunk)
                if got >= 3 * 4096:
                    break  # leaving the block closes the connection mid-body
        await worker.wait_idle()  # the engine request was aborted, not run to its 3000 tokens
        for _ in range(50):
            usage = (await http.get(f"{gateway.url}/v1/usage", headers=auth(key))).json()
            if usage["audio_seconds"] > 0:
                break
            await asyncio.sleep(0.1)
    assert usage["audio_seconds"] >= got / 48000 - 0.001 and usage["requests"] >= 1  # shown to the ms


async def test_a_tenant_at_its_stream_limit_gets_429_with_retry_after(gateway, worker, new_tenant):
    _, key = await new_tenant(max_streams=1)
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{gateway.url}/v1/audio/speech", headers=auth(key), json=LONG) as first:
            assert first.status_code == 200
            second = await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(key),
                                     json={**LONG, "max_tokens": 15})
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert second.json()["error"]["code"] == "streams_limit_exceeded"
        await worker.wait_idle()
        third = await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(key), json={**LONG, "max_tokens": 15})
        assert third.status_code == 200  # the slot came back when the first stream ended


async def test_every_worker_full_is_503_with_retry_after(gateway, worker, new_tenant):
    """Eight long streams straight to the worker (its max_streams) fill it; the gateway's request
    then finds no worker that can take it before any audio: 503, not a hang or a 500."""
    _, key = await new_tenant()
    holders = [await WorkerClient.connect(worker.url) for _ in range(2)]  # 4 per connection, its share
    try:
        streams = [await holders[i % 2].start("leo", "Hold.", options=ContextOptions(seed=i, max_tokens=3000))
                   for i in range(8)]
        for stream in streams:
            await stream.end()
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(key),
                                       json={**LONG, "max_tokens": 15})
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["code"] == "no_worker_available"
        for stream in streams:
            await stream.cancel()
    finally:
        for holder in holders:
            await holder.aclose()
    await worker.wait_idle()


async def test_with_redis_down_known_keys_keep_speaking_and_unknown_ones_get_503(gateway, new_tenant, redis_server):
    _, known = await new_tenant()
    _, unseen = await new_tenant()
    short = {**LONG, "max_tokens": 15}
    async with httpx.AsyncClient(timeout=60) as http:
        assert (await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(known), json=short)).status_code == 200
        redis_server.kill()
        try:
            served = await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(known), json=short)
            refused = await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(unseen), json=short)
        finally:
            redis_server.start()
    assert served.status_code == 200 and len(served.content) == 2 * 4096
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    assert "retry-after" in refused.headers


async def test_metrics_count_requests_by_route_and_status(gateway, new_tenant):
    _, key = await new_tenant()
    async with httpx.AsyncClient(timeout=60) as http:
        await http.post(f"{gateway.url}/v1/audio/speech", headers=auth(key), json={**LONG, "max_tokens": 15})
        await http.post(f"{gateway.url}/v1/audio/speech", headers=auth("vr_nope"), json=LONG)
        text = (await http.get(gateway.metrics_url)).text  # the internal metrics server
    assert 'voicering_gateway_requests_total{route="/v1/audio/speech",status="200"}' in text
    assert 'voicering_gateway_requests_total{route="/v1/audio/speech",status="401"}' in text
    assert 'voicering_gateway_ttfb_seconds_count{format="pcm",route="speech"}' in text


async def test_with_redis_down_a_voice_keeps_the_default_dictionaries_last_seen(gateway, worker, new_tenant,
                                                                                redis_server):
    """The default look-up must not turn a Redis outage into 503s for known keys (the test above):
    the gateway uses the defaults it last saw, and the worker the dictionary it holds by version.
    A request that names dictionaries is refused instead (never spoken without them)."""
    _, key = await new_tenant()
    speech = f"{gateway.url}/v1/audio/speech"
    body = {"model": "tts-1", "voice": "tara", "input": "Dr. Who.", "response_format": "pcm", "seed": 11,
            "max_tokens": 15}
    async with httpx.AsyncClient(timeout=60) as http:
        made = await http.post(f"{gateway.url}/v1/pronunciations", headers=auth(key),
                               json={"name": "names", "rules": [{"written": "Who", "spoken": "Hoo"}]})
        assert made.status_code == 201
        attached = await http.put(f"{gateway.url}/v1/voices/tara/pronunciations", headers=auth(key),
                                  json={"pronunciations": ["names"]})
        assert attached.status_code == 200
        before = await http.post(speech, headers=auth(key), json=body)
        redis_server.kill()
        try:
            during = await http.post(speech, headers=auth(key), json=body)
            named = await http.post(speech, headers=auth(key), json={**body, "pronunciations": ["names"]})
        finally:
            redis_server.start()
    async with await WorkerClient.connect(worker.url) as client:
        hoo = (await client.say("tara", "Doctor Hoo.", options=ContextOptions(seed=11, max_tokens=15))).pcm
    assert before.status_code == 200 and before.content == hoo  # the voice's default, named by nobody
    assert during.status_code == 200 and during.content == hoo
    assert named.status_code == 503 and "retry-after" in named.headers
