"""A gateway stopping (SIGTERM: a rollout, an HPA scale-down) drains its `/v1/tts/stream` sockets
instead of cutting them: a real `voicering gateway` process of its own, the session's real worker.

- a context open at SIGTERM runs to its end, and its socket then closes with 1001;
- a new `start` on a socket of the stopping gateway gets `error` `going_away`, retryable;
- at the grace, what is still open closes with 1001, and the process exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.fixtures.gateway import start_gateway


async def open_stream(gateway, key: str):
    return await connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers={"Authorization": f"Bearer {key}"},
                         max_size=1 << 22)


async def next_message(ws, timeout: float = 120) -> dict:
    """The next JSON message (audio frames skipped)."""
    while True:
        raw = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(raw, str):
            return json.loads(raw)


async def first_audio(ws, timeout: float = 120) -> None:
    while not isinstance(await asyncio.wait_for(ws.recv(), timeout), bytes):
        pass


async def draining(gateway, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while "stopping: draining" not in gateway.log_path.read_text():
        assert time.monotonic() < deadline, gateway.log_tail()
        await asyncio.sleep(0.05)


async def close_code(ws, timeout: float = 60) -> int:
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else -1


async def test_an_open_context_finishes_and_new_ones_go_elsewhere(worker, redis_server, adapter_store, new_tenant,
                                                                  tmp_path):
    gateway = start_gateway(redis_server.url, adapter_store, tmp_path / "gw", "--grace", "60")
    try:
        _, key = await new_tenant()
        async with await open_stream(gateway, key) as ws:
            await ws.send(json.dumps({"type": "start", "context_id": "a", "voice": "tara", "text": "First part.",
                                      "options": {"seed": 3, "max_tokens": 15}}))
            await ws.send(json.dumps({"type": "flush", "context_id": "a"}))
            await first_audio(ws)  # the context is open and speaking
            gateway.proc.send_signal(signal.SIGTERM)
            await draining(gateway)
            await ws.send(json.dumps({"type": "start", "context_id": "b", "voice": "tara", "text": "Too late.",
                                      "options": {"max_tokens": 15}}))
            refused = await next_message(ws)
            assert refused["type"] == "error" and refused["context_id"] == "b"
            assert refused["code"] == "going_away" and refused["retryable"] is True
            # the open context still takes text and speaks it to its end
            await ws.send(json.dumps({"type": "text", "context_id": "a", "text": "Second part."}))
            await ws.send(json.dumps({"type": "end", "context_id": "a"}))
            while (done := await next_message(ws))["type"] != "done":
                assert done["type"] not in ("error",), done
            assert done["context_id"] == "a" and done["reason"] == "completed"
            assert await close_code(ws) == 1001
        gateway.proc.wait(60)
    finally:
        gateway.stop()
    assert "draining 1 stream socket(s) with 1 open context(s)" in gateway.log_path.read_text()


async def test_at_the_grace_what_is_still_open_closes_with_1001(worker, redis_server, adapter_store, new_tenant,
                                                                tmp_path):
    grace = 2.0
    gateway = start_gateway(redis_server.url, adapter_store, tmp_path / "gw", "--grace", str(grace))
    try:
        _, key = await new_tenant()
        async with await open_stream(gateway, key) as idle, await open_stream(gateway, key) as busy:
            await busy.send(json.dumps({"type": "start", "context_id": "a", "voice": "tara", "text": "Hello.",
                                        "options": {"max_tokens": 15}}))
            await busy.send(json.dumps({"type": "flush", "context_id": "a"}))
            await first_audio(busy)  # open, and never ended by this client
            began = time.monotonic()
            gateway.proc.send_signal(signal.SIGTERM)
            assert await close_code(idle) == 1001  # nothing open on it: closed at once
            assert time.monotonic() - began < grace
            assert await close_code(busy) == 1001
            assert time.monotonic() - began >= grace - 0.2
        gateway.proc.wait(60)
    finally:
        gateway.stop()
