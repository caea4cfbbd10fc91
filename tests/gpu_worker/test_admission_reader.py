"""L12 (issue #20): a context that is slow to stop must never hold up its connection's reader.

The reader used to cancel a context and then await its task (`asyncio.gather`) before reading the
next message, so every other context on the connection waited for that context's cleanup. Today
no real component is slow to stop on cue (a voice load, a relay's cancel to its owner and an
engine abort all return within milliseconds here), so the voice cache below is the one stand-in:
its load never finishes and, once cancelled, stops only when the test opens `gate`. Everything
else is real: the worker's websocket server, its reader, admission and protocol, on a real socket.
While the cancelled context is still stopping, the reader must answer the same connection's other
messages; the cancelled context's own answer comes once it has stopped.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from contextlib import asynccontextmanager

import pytest
from websockets.asyncio.client import connect

from gpu_worker.engine import SamplingOptions
from gpu_worker.protocol import MAX_TEXT_CHARS, PROTOCOL_HEADER
from gpu_worker.server import WorkerServer
from gpu_worker.context import ContextDeps
from gpu_worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(60)


class SlowToStop:
    """A voice cache whose loads never finish; a cancelled load stops only once `gate` is set."""

    def __init__(self) -> None:
        self.loading: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.gate = asyncio.Event()
        self.stopping = 0

    async def acquire(self, voice_id: str) -> None:
        self.loading[voice_id].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping += 1
            await self.gate.wait()
            raise

    def release(self, voice: object) -> None:
        pass

    async def prewarm(self, voices: list[str]) -> dict[str, str]:
        return {}


@asynccontextmanager
async def worker_server(cache: SlowToStop):
    server = WorkerServer(WorkerSettings(model="unused", port=0, max_streams=4),
                          ContextDeps(engine=None, runner=None, defaults=SamplingOptions(), adapters=cache))  # type: ignore[arg-type]
    ws_server = await server.serve()
    try:
        yield server, f"ws://127.0.0.1:{ws_server.sockets[0].getsockname()[1]}"
    finally:
        cache.gate.set()  # whatever happened, let every context stop
        ws_server.close()
        await ws_server.wait_closed()
        await server.aclose()


async def recv_json(ws, timeout: float = 20.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


@pytest.mark.parametrize("ending", ["cancel", "limit"])
async def test_a_context_slow_to_stop_does_not_hold_up_the_connections_other_messages(ending):
    cache = SlowToStop()
    async with worker_server(cache) as (server, url), connect(url, additional_headers={PROTOCOL_HEADER: "2"}) as ws:
        assert ws.response.headers[PROTOCOL_HEADER] == "2"
        await ws.send(json.dumps({"type": "start", "context_id": "slow", "voice": "tara", "text": "Hello."}))
        assert await recv_json(ws) == {"context_id": "slow", "load": 1, "type": "opened"}
        await asyncio.wait_for(cache.loading["tara"].wait(), 10)
        if ending == "cancel":
            await ws.send(json.dumps({"type": "cancel", "context_id": "slow"}))
        else:  # a context-ending limit: more text before a flush than a context may buffer
            await ws.send(json.dumps({"type": "text", "context_id": "slow", "text": "x" * MAX_TEXT_CHARS}))
        # while it stops: the same connection's next messages are answered at once
        await ws.send(json.dumps({"type": "text", "context_id": "nobody", "text": "Hi."}))
        probe = await recv_json(ws)  # the old reader sat in the cancelled context's cleanup: this never came
        assert (probe["type"], probe["context_id"], probe["code"]) == ("rejected", "nobody", "bad_request")
        await ws.send(json.dumps({"type": "cancel", "context_id": "slow"}))  # it is ending: refused after its end
        await ws.send(json.dumps({"type": "start", "context_id": "other", "voice": "leo", "text": "Hi."}))
        assert await recv_json(ws) == {"context_id": "other", "load": 2, "type": "opened"}  # the stopping one still holds its slot
        assert cache.stopping == 1 and server.active == 2
        cache.gate.set()  # now it may stop: its one answer comes, after everything it had queued
        answer = await recv_json(ws)
        assert answer["context_id"] == "slow" and answer["load"] == 1  # "other" still runs
        if ending == "cancel":
            assert (answer["type"], answer["reason"]) == ("done", "cancelled")
        else:
            assert (answer["type"], answer["code"]) == ("error", "text_too_long")
        again = await recv_json(ws)  # the late cancel's refusal never comes before the end it followed
        assert (again["type"], again["context_id"]) == ("rejected", "slow") and "is ending" in again["message"]
        await ws.send(json.dumps({"type": "cancel", "context_id": "other"}))
        done = await recv_json(ws)
        assert (done["type"], done["context_id"], done["reason"], done["load"]) == ("done", "other", "cancelled", 0)
    assert server.active == 0


async def test_a_closed_connection_ends_its_stopping_contexts_too():
    cache = SlowToStop()
    async with worker_server(cache) as (server, url):
        async with connect(url) as ws:
            await ws.send(json.dumps({"type": "start", "context_id": "slow", "voice": "tara", "text": "Hello."}))
            await asyncio.wait_for(cache.loading["tara"].wait(), 10)
            await ws.send(json.dumps({"type": "cancel", "context_id": "slow"}))
            await asyncio.sleep(0.1)  # let it start stopping; then the client leaves
        cache.gate.set()
        for _ in range(100):
            if server.active == 0:
                break
            await asyncio.sleep(0.05)
        assert server.active == 0
