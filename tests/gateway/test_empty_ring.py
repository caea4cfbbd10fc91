"""A gateway whose ring has no worker (every worker drained, or the gateway started first) answers
every entrance with a retryable `no_worker`, at once: 503 with Retry-After on HTTP, an `error` on
the websocket. Before the fix the router raised `EmptyRing` at its first candidate, outside what
the callers caught: a bare 500 on HTTP and no answer at all on the websocket.

Real gateway process on a ring prefix no worker joined, real Redis; no worker is needed."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.fixtures.gateway import start_gateway

ANSWER_S = 20.0  # a generous bound on a loaded box; the answer is immediate (no worker to try)


@pytest.fixture(scope="module")
def lonely_gateway(redis_server, adapter_store, tmp_path_factory):
    handle = start_gateway(redis_server.url, adapter_store, tmp_path_factory.mktemp("lonely-gateway"),
                           "--ring-prefix", "test:empty-ring")
    yield handle
    handle.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_speech_on_an_empty_ring_is_503_no_worker_with_retry_after(lonely_gateway, new_tenant):
    _, key = await new_tenant()
    async with httpx.AsyncClient(timeout=ANSWER_S) as http:
        response = await http.post(f"{lonely_gateway.url}/v1/audio/speech", headers=auth(key),
                                   json={"model": "tts-1", "voice": "tara", "input": "Anyone there?",
                                         "response_format": "pcm"})
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "no_worker_available" and "no worker is serving" in error["message"]


async def test_a_stream_start_on_an_empty_ring_gets_a_retryable_error(lonely_gateway, new_tenant):
    _, key = await new_tenant()
    async with connect(f"{lonely_gateway.ws_url}/v1/tts/stream", additional_headers=auth(key)) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "c1", "voice": "tara", "text": "Anyone?"}))
        await ws.send(json.dumps({"type": "end", "context_id": "c1"}))
        message = await answer_to(ws, "c1")
        assert message["type"] == "error" and message["context_id"] == "c1", message
        assert message["retryable"] is True and message["code"] in ("no_worker", "no_worker_available"), message
        # the connection lives on: a second context gets its own answer
        await ws.send(json.dumps({"type": "start", "context_id": "c2", "voice": "leo", "text": "Hello?"}))
        await ws.send(json.dumps({"type": "end", "context_id": "c2"}))
        second = await answer_to(ws, "c2")
        assert second["type"] == "error" and second["context_id"] == "c2" and second["retryable"] is True


async def answer_to(ws, context_id: str) -> dict:
    """The next `error` for ``context_id``. Before it may come the `rejected` of an earlier
    context's `end`: a context whose start failed is over, and an `end` the gateway reads only
    after that (a loaded box) names no open context; it had no effect, and says so."""
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), ANSWER_S))
        if message["type"] == "rejected":
            assert message["message_type"] == "end" and message["context_id"] != context_id, message
            assert "no open context has this id" in message["message"], message
            continue
        return message
