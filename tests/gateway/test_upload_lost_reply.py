"""An upload whose Redis write happened but whose answer came too late (found beside two CPU
burners: a starved gateway's 1 s Redis clock ran out on a reply that was on its way). The client
is told to retry (503 `unavailable`) or its upload goes on; either way nothing of the first try may
refuse the retry as `voice_exists`.

A real `voicering gateway` process talks to the session Redis through a TCP proxy of this module
that forwards every command at once and holds Redis's reply to the first command that carries
the voice's name (the registration) past the gateway's Redis clock: the write is done, its answer
is late. redis-py then sends the command again on a fresh connection (`connect_redis`'s one retry)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from gateway.tenants import Tenants, VoiceNotFound, connect_redis
from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX, start_gateway
from tests.gateway.test_upload_hostile import CONSENT, garbage, post_voice

pytestmark = pytest.mark.timeout(180)

NAME = "late-answer"  # the first Redis command carrying it is the voice's registration
REDIS_TIMEOUT_S = 1.0  # the gateway's clock for one Redis call (its default)
HOLD_S = 3 * REDIS_TIMEOUT_S


@dataclass
class Held:
    url: str
    held: int = 0  # answers held so far


@contextlib.asynccontextmanager
async def late_answers(redis_port: int, marker: bytes, holds: int) -> AsyncIterator[Held]:
    """A proxy to Redis on loopback whose first ``holds`` commands carrying ``marker`` go through at
    once and are each answered `HOLD_S` late (a connection's commands wait for their answers, so the
    next bytes back on that connection are that command's answer)."""
    pumps: set[asyncio.Task] = set()
    state = Held("")
    armed = [holds]

    async def commands(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, marked: asyncio.Event) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(1 << 16):
                if armed[0] and marker in chunk:
                    armed[0] -= 1
                    marked.set()
                writer.write(chunk)
                await writer.drain()
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()

    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, marked: asyncio.Event) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(1 << 16):
                if marked.is_set():
                    marked.clear()
                    state.held += 1
                    await asyncio.sleep(HOLD_S)
                writer.write(chunk)  # to a client that gave up on it: dropped
                await writer.drain()
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", redis_port)
        marked = asyncio.Event()
        for pump in (commands(client_r, redis_w, marked), answers(redis_r, client_w, marked)):
            pumps.add(task := asyncio.create_task(pump))
            task.add_done_callback(pumps.discard)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    try:
        yield state
    finally:
        server.close()
        for task in list(pumps):
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


@pytest.mark.parametrize("holds", [1, 2], ids=["the-resend-answered", "both-answers-late"])
async def test_a_registration_answered_too_late_never_refuses_the_upload_or_its_retry(holds, redis_server, new_tenant,
                                                                                     tmp_path):
    """One late answer: redis-py's resend finds the voice this very upload wrote, and the upload goes
    on. Both late: 503 `unavailable`, and the registration the upload may have written is undone, so
    the client's retry goes on. Either way the upload reaches its checks (which refuse these bytes)."""
    tenant, key = await new_tenant()
    registry_redis = connect_redis(redis_server.url, timeout_s=5.0)
    registry = Tenants(registry_redis, GATEWAY_TENANT_PREFIX)
    # the registration script loaded in Redis, as on any gateway that has registered a voice: the
    # held command then runs at once (unloaded, it would fail NOSCRIPT and run only on the resend)
    await registry.register_voice(tenant, "warm-up", consent=CONSENT)
    await registry.delete_voice(tenant, "warm-up")
    (tmp_path / "voices").mkdir()
    try:
        async with late_answers(redis_server.port, NAME.encode(), holds) as proxy:
            # started on a thread: its start-up's Redis calls go through the proxy on this loop
            gateway = await asyncio.to_thread(start_gateway, proxy.url, tmp_path / "voices", tmp_path, env={
                "VOICERING_GATEWAY_REDIS_TIMEOUT_S": str(REDIS_TIMEOUT_S),
                "VOICERING_GATEWAY_TRAIN_PREFIX": f"test:train:{uuid.uuid4().hex[:8]}"})
            try:
                async with httpx.AsyncClient(timeout=60) as http:
                    answer = await post_voice(http, gateway, key, NAME, [garbage()])  # not audio
                    assert proxy.held == holds, gateway.log_tail()
                    if holds == 2:
                        assert answer.status_code == 503, answer.text
                        assert answer.json()["error"]["code"] == "unavailable", answer.text
                        with pytest.raises(VoiceNotFound):  # nothing of it is left to refuse the retry
                            await registry.voice(tenant, NAME)
                        answer = await post_voice(http, gateway, key, NAME, [garbage()])  # the retry
            finally:
                await asyncio.to_thread(gateway.stop)
        assert answer.status_code == 400, answer.text  # not 409 voice_exists: its own registration
        assert answer.json()["error"]["code"] == "bad_audio", answer.text
        with pytest.raises(VoiceNotFound):  # the refused upload undid its registration
            await registry.voice(tenant, NAME)
    finally:
        await registry_redis.aclose()
