"""No caller's input decides the fate of a shared link (issue 19): the protocol encodes UTF-8 as
itself, and the pool refuses, unsent, a message a worker would refuse (over its `max_size`), so
one context's oversized text never closes the connection other contexts share.

Against the session `worker` (a real `voicering worker`, max_size `MAX_MESSAGE_BYTES`), a ring in
the real Redis, and real websocket servers beside it: one that records what reaches it (a spare
owner a retry would go to) and one with a small `max_size` (it closes with 1009 as a worker does).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.server import ServerConnection, serve

from gpu_worker.client import PoolSettings, RingRouter, WorkerPool, WorkerRequestError
from gpu_worker.protocol import MAX_MESSAGE_BYTES, PushText, Start, encode, parse_client
from tests.gpu_worker.test_pool import fast, ids_with_owners, pcm_bytes, ring_of

pytestmark = pytest.mark.timeout(300)


def test_encode_sends_utf8_as_itself_and_parses_back():
    text = "é" * 1000 + " 😀 \u0001 \"q\""
    frame = encode(PushText("c1", text)).encode()
    assert len(frame) == len(b'{"context_id":"c1","text":"","type":"text"}') + 2000 + 3 + 4 + 6 + 5  # é 2, 😀 4, \\u0001 6
    start = Start("c1", "tara", text)
    assert parse_client(encode(start)) == start
    assert parse_client(json.dumps({"type": "start", "context_id": "c1", "voice": "tara", "text": text})) == start  # escaped too


def test_the_pool_refuses_what_a_worker_refuses_by_default():
    assert PoolSettings().peer_max_message_bytes == MAX_MESSAGE_BYTES


@contextlib.asynccontextmanager
async def recording_server(max_size: int | None = None) -> AsyncIterator[tuple[str, list]]:
    """A websocket server that reads every message and answers none; yields its URL and what it got."""
    received: list = []

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(message)

    async with serve(handler, "127.0.0.1", 0, max_size=max_size) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", received


async def test_a_frame_over_the_worker_limit_fails_only_its_own_message(worker, redis_url):
    """An oversized `start` or `text` is refused to its caller (text_too_long, not retryable), never
    sent, never retried on the next owner; the shared link stays up, the context that sent the
    oversized `text` and another one on the same link both complete, nobody is ejected."""
    await worker.wait_idle()
    spare_id = ids_with_owners(["worker-a"], ["spare"], {"tara": "worker-a"})[0]
    async with recording_server() as (spare_url, spare_got), \
            ring_of(redis_url, {"worker-a": worker.url, spare_id: spare_url}) as (watcher, settings, _):
        async with WorkerPool(RingRouter(watcher, settings), PoolSettings(consecutive_errors=1)) as pool:
            held = await pool.start("tara", "Held open. ", options=fast(5))
            assert held.worker_id == "worker-a" and pool.handshakes == 1
            huge = "é" * (MAX_MESSAGE_BYTES // 2 + 1)  # over the limit in UTF-8 bytes, not in characters

            with pytest.raises(WorkerRequestError) as start_refused:
                await pool.start("tara", huge, options=fast(6))
            with pytest.raises(WorkerRequestError) as push_refused:
                await held.push(huge)
            for refused in (start_refused.value, push_refused.value):
                assert refused.error.code == "text_too_long" and not refused.retryable
                assert str(MAX_MESSAGE_BYTES) in refused.error.message

            await held.push("And the rest.")  # the context carries on: the refused push had no effect
            other = await pool.start("tara", "Same link.", options=fast(7))
            for stream in (held, other):
                await stream.end()
                pcm = b"".join([chunk async for chunk in stream.audio()])
                assert stream.done.reason == "completed" and len(pcm) == pcm_bytes(2) and stream.attempts == 1
                assert stream.rejected == []
            stats = pool.peer_stats("worker-a")
            assert pool.handshakes == 1 and stats.links == 1 and stats.links_opened == 1 and stats.errors == 0
            assert pool.ejected() == set() and spare_got == []  # no retry elsewhere, no ejection
    await worker.wait_idle()


async def test_text_under_the_limit_in_utf8_reaches_the_worker_on_a_link_that_stays(worker):
    """400,000 'é' is 800 kB of UTF-8 (2.4 MB ASCII-escaped): it is under the worker's message
    limit, so the worker refuses it for its own reason (too many characters) and the link lives."""
    await worker.wait_idle()
    async with WorkerPool.static([worker.url], PoolSettings(consecutive_errors=1)) as pool:
        other = await pool.start("tara", "Sharing the link.", options=fast(8))
        flood = await pool.start("tara", "é" * 400_000, options=fast(9))
        with pytest.raises(WorkerRequestError) as refused:
            async for _ in flood.audio():
                pass
        assert refused.value.error.code == "text_too_long" and flood.attempts == 1
        await other.end()
        pcm = b"".join([chunk async for chunk in other.audio()])
        assert other.done.reason == "completed" and len(pcm) == pcm_bytes(2)
        stats = pool.peer_stats(worker.url)
        assert pool.handshakes == 1 and stats.links == 1 and stats.errors == 0 and pool.ejected() == set()
    await worker.wait_idle()


async def test_a_link_closed_with_1009_does_not_eject_the_worker(worker, redis_url):
    """A peer that closes a connection because a message was too big (1009) says the sender
    erred, not the worker: the contexts on it retry elsewhere, and the peer is not ejected
    even with `consecutive_errors=1`."""
    await worker.wait_idle()
    small_id = ids_with_owners(["worker-a"], ["small"], {"tara": "small"})[0]
    async with recording_server(max_size=256) as (small_url, small_got), \
            ring_of(redis_url, {"worker-a": worker.url, small_id: small_url}) as (watcher, settings, _):
        async with WorkerPool(RingRouter(watcher, settings), PoolSettings(consecutive_errors=1)) as pool:
            stream = await pool.start("tara", "A start of more than two hundred and fifty six bytes. " * 6,
                                      options=fast(10))
            await stream.end()
            pcm = b"".join([chunk async for chunk in stream.audio()])
            assert stream.done.reason == "completed" and pcm and stream.worker_id == "worker-a"
            assert stream.attempts == 2 and small_got == []  # refused by the small peer, spoken by the worker
            assert pool.ejected() == set() and pool.peer_stats(small_id).errors == 0
    await worker.wait_idle()
