"""The pool's links against real sockets that misbehave, no worker process: a TCP listener that
accepts and never answers the handshake (a black-holed worker), and a websocket server that
sends the first audio of a context and then stalls. Plus what every dial says: the protocol
version header, and the version the worker answered, kept per link."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Response

from gpu_worker.client import NoWorkerAvailable, PoolSettings, WorkerPool, WorkerRequestError
from gpu_worker.protocol import PROTOCOL_HEADER, AudioChunk
from tests.gpu_worker.test_pool import fast, silent_server

pytestmark = pytest.mark.timeout(120)


async def test_requests_queued_behind_a_black_holed_dial_share_its_one_timeout():
    """Regression (issue 20, M7): five contexts that need a connection to a worker that accepts
    TCP and never answers the handshake waited for the dial one after another, each re-dialing,
    so the k-th gave up after k × `open_timeout_s`. They share the one dial's outcome now: all
    give up together, after one timeout, and the worker is dialed once."""
    timeout = 2.0
    async with silent_server() as (url, accepted), WorkerPool.static([url], PoolSettings(open_timeout_s=timeout)) as pool:
        began = time.monotonic()

        async def start(i: int) -> float:
            with pytest.raises(NoWorkerAvailable):
                await pool.start("tara", f"Line {i}.", options=fast(i))
            return time.monotonic() - began

        waited = await asyncio.gather(*(start(i) for i in range(5)))
        assert min(waited) >= timeout * 0.9
        assert max(waited) < timeout * 3  # on the old code the fifth waited ~5 × 2 s
        assert accepted[0] == 1 and pool.peer_stats(url).dials == 1
        assert pool.ejected() == {url}


async def stalling_server(chunks_per_ask: int = 1):
    """A websocket server that answers every flush or end of a context with `chunks_per_ask` audio
    chunks and then says nothing more (never `done`); records every message it got."""
    received: list[dict] = []

    async def handler(ws: ServerConnection) -> None:
        seq: dict[str, int] = {}
        async for raw in ws:
            message = json.loads(raw)
            received.append(message)
            if message["type"] in ("flush", "end"):
                ctx = message["context_id"]
                for _ in range(chunks_per_ask):
                    n = seq.get(ctx, 0)
                    await ws.send(AudioChunk(ctx, n, b"\x00\x01" * 240).encode())
                    seq[ctx] = n + 1

    return handler, received


async def test_an_context_that_stalls_after_its_first_audio_fails_alone_and_the_link_stays_up():
    """Regression (issue 20, M13): after its first audio nothing timed a context out, so a
    worker that stopped mid-context held its caller forever. While the worker owes audio (text
    flushed since the last chunk, or the context ended without `done`), a gap over
    `stall_timeout_s` ends it with a retryable `worker_timeout`: cancelled on the worker, not
    retried (the caller has part of it), the link kept. Silence after all that was asked for has
    come is the caller's own pace: no clock runs."""
    handler, received = await stalling_server()
    async with serve(handler, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with WorkerPool.static([url], PoolSettings(stall_timeout_s=1.0, first_audio_timeout_s=5.0)) as pool:
            stream = await pool.start("tara", "First sentence.", options=fast())
            await stream.flush()
            audio = stream.audio()
            assert await asyncio.wait_for(anext(audio), 10)  # the segment's audio came
            with pytest.raises(TimeoutError):  # nothing more owed: the caller may take its time
                await asyncio.wait_for(anext(audio), 2.5)
            audio = stream.audio()
            await stream.end()  # from here the worker owes the rest and `done`; it sends one chunk and stalls
            began = time.monotonic()
            got = 0
            with pytest.raises(WorkerRequestError) as err:
                async with asyncio.timeout(20):  # the old code waits forever
                    async for _ in audio:
                        got += 1
            assert 1.0 <= time.monotonic() - began < 15 and got == 1
            assert err.value.error.code == "worker_timeout" and err.value.retryable
            assert "stopped sending audio" in err.value.error.message
            assert stream.attempts == 1  # never retried after audio
            await asyncio.sleep(0.2)
            assert [m["type"] for m in received] == ["start", "flush", "end", "cancel"]
            (ws,) = pool.connections(url)
            assert ws.state.name == "OPEN"  # the link stays up for the others
            assert pool.ejected() == set() and pool.peer_stats(url).errors == 1  # one failure counted, no ejection


async def test_every_dial_says_its_protocol_version_and_the_pool_keeps_the_answer_per_link():
    asked: list[str | None] = []

    def v2(connection, request, response: Response) -> Response:
        asked.append(request.headers.get(PROTOCOL_HEADER))
        response.headers[PROTOCOL_HEADER] = "2"
        return response

    def v1(connection, request, response: Response) -> Response:
        asked.append(request.headers.get(PROTOCOL_HEADER))
        return response

    async def quiet(ws: ServerConnection) -> None:
        async for _ in ws:
            pass

    async with serve(quiet, "127.0.0.1", 0, process_response=v2) as new, \
            serve(quiet, "127.0.0.1", 0, process_response=v1) as old:
        urls = [f"ws://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in (new, old)]
        async with WorkerPool.static(urls) as pool:
            assert await pool.prewarm(urls) == 2
            assert asked == ["2", "2"]
            assert pool.peer_stats(urls[0]).version == 2 and pool.peer_stats(urls[1]).version == 1
