"""`/v1/tts/stream` as a hostile tenant uses it (issue 19), through a real `voicering gateway`
process to the session's real worker: oversized text never reaches the shared link to a worker
(another tenant's speech on that link completes whole, the link is the same socket afterwards,
the gateway's memory stays flat), a key revoked or limited while its socket is open is held to
it within `auth_cache_s`, each `start` counts against the rate limit, and refused contexts are
not metered.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlparse

import httpx
import psutil
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.tenants import Tenants, connect_redis
from gpu_worker.protocol import MAX_CONTEXT_BACKLOG_CHARS, MAX_TEXT_CHARS
from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX, start_gateway
from tests.fixtures.hostile import PeakRss

pytestmark = pytest.mark.timeout(600)

AUTH_CACHE_S = 2.0  # of the gateway started here for the re-check tests
RSS_GROWTH_LIMIT = 200 << 20


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def open_stream(gateway, key: str):
    return await connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers=auth(key), max_size=1 << 22)


def start(cid: str, text: str, **options) -> str:
    message = {"type": "start", "context_id": cid, "voice": "tara", "text": text}
    if options:
        message["options"] = options
    return json.dumps(message, ensure_ascii=False)


def prose(chars: int) -> str:
    """Speakable non-ASCII text of exactly `chars` characters (2-byte UTF-8 letters, sentences)."""
    line = "Ça a été dit. "
    return (line * (chars // len(line) + 1))[:chars]


def msg(kind: str, cid: str, **fields) -> str:
    return json.dumps({"type": kind, "context_id": cid, **fields}, ensure_ascii=False)


async def next_json(ws, timeout: float = 60) -> dict:
    """The next JSON message (audio frames skipped)."""
    while True:
        raw = await asyncio.wait_for(ws.recv(), timeout)
        if not isinstance(raw, bytes):
            return json.loads(raw)


async def until_end(ws, cid: str, timeout: float = 120) -> list[dict]:
    """JSON messages up to and including the `done`/`error` of context `cid`."""
    seen = []
    while True:
        message = await next_json(ws, timeout)
        seen.append(message)
        if message["type"] in ("done", "error") and message.get("context_id") == cid:
            return seen


def links_to(pid: int, worker_url: str) -> set[int]:
    """Local ports of the process's open TCP connections to the worker: its pool's links."""
    port = urlparse(worker_url).port
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


SPEECH = {"model": "tts-1", "input": "The other tenant speaks a long line, all of it.", "voice": "tara",
          "response_format": "pcm", "seed": 19, "max_tokens": 700}


async def speak(http: httpx.AsyncClient, gateway, key: str) -> bytes:
    response = await http.post(f"{gateway.url}/v1/audio/speech", json=SPEECH, headers=auth(key))
    assert response.status_code == 200, response.text
    return response.content


async def attack(gateway, key: str, told: dict) -> None:
    """Oversized shapes on /v1/tts/stream; `told` gets what the attacker was told."""
    ws = await open_stream(gateway, key)  # 200,000 'é': 400 kB of UTF-8, over any legal message
    await ws.send(start("flood", "é" * 200_000))
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 30)
    told["flood"] = closed.value.rcvd.code if closed.value.rcvd else None

    async with await open_stream(gateway, key) as ws:
        await ws.send(start("big", "é" * 30_000))  # a legal message size, over the text limit
        told["big"] = await next_json(ws)
        # over the text a context may buffer before a flush: refused, the context goes on
        await ws.send(start("p", "", seed=3, max_tokens=15))  # opens on a worker, nothing to say yet
        await ws.send(msg("text", "p", text=prose(MAX_TEXT_CHARS - 4)))
        await ws.send(msg("text", "p", text="é" * 200))  # over MAX_TEXT_CHARS before a flush
        await ws.send(msg("cancel", "p"))
        told["p"] = await until_end(ws, "p")
        # more messages than a context may send before its first audio (each counts at least one;
        # empty flushes, so the worker is never asked to speak): refused past the bound
        await ws.send(start("q", "", seed=3, max_tokens=15))
        for _ in range(MAX_CONTEXT_BACKLOG_CHARS):  # the start counts one: the last flush is one too many
            await ws.send(msg("flush", "q"))
        await ws.send(msg("cancel", "q"))
        told["q"] = await until_end(ws, "q")
        await ws.send(start("after", "Still here.", seed=4, max_tokens=15))  # the attacker's socket still works
        await ws.send(msg("end", "after"))
        told["after"] = (await until_end(ws, "after"))[-1]


async def test_oversized_text_never_touches_another_tenant_s_speech_or_the_link(quick_gateway, worker, new_tenant):
    # a gateway started by this module: its pool's links are younger than max_connection_age_s (600 s)
    # all through the test, so a scheduled rotation (the session gateway's link may be 590 s old
    # here) is never taken for a link the attack closed
    gateway = quick_gateway
    _, attacker = await new_tenant()
    _, victim = await new_tenant()
    async with httpx.AsyncClient(timeout=180) as http:
        reference = await speak(http, gateway, victim)  # also opens the gateway's link to the worker
        links = links_to(gateway.proc.pid, worker.url)
        assert links and len(reference) > 100_000
        watch = PeakRss(gateway.proc.pid).start()
        async with http.stream("POST", f"{gateway.url}/v1/audio/speech", json=SPEECH, headers=auth(victim)) as resp:
            assert resp.status_code == 200
            body = resp.aiter_bytes()
            got = [await anext(body)]  # the victim's audio is flowing over the link: now attack
            told: dict = {}
            try:
                await attack(gateway, attacker, told)
            except TimeoutError:
                raise AssertionError(f"the attacker was left waiting; told so far: {told}\n{gateway.log_tail()}") from None
            got += [chunk async for chunk in body]
        growth = watch.stop()
        again = await speak(http, gateway, victim)

    assert told["flood"] == 1009  # the attacker's own socket: message too big
    assert told["big"]["type"] == "error" and told["big"]["code"] == "text_too_long"
    assert told["big"]["context_id"] == "big"
    for cid, code in (("p", "text_too_long"), ("q", "backlog_full")):  # refusals of one message, not endings
        assert [m["code"] for m in told[cid] if m["type"] == "rejected"] == [code], told[cid]
        assert told[cid][-1]["type"] == "done" and told[cid][-1]["reason"] == "cancelled", told[cid][-1]
    assert told["after"]["type"] == "done" and told["after"]["reason"] == "completed"
    assert len(b"".join(got)) == len(reference) == len(again)  # whole, and the same as before and after
    assert links <= links_to(gateway.proc.pid, worker.url)  # the same sockets: no link was closed and re-dialed
    assert growth < RSS_GROWTH_LIMIT, f"gateway RSS grew {growth / 2**20:.0f} MiB during the attack"
    await worker.wait_idle()


async def test_each_start_counts_against_the_rate_limit(gateway, worker, new_tenant):
    _, key = await new_tenant(requests_per_minute=3)
    async with await open_stream(gateway, key) as ws:  # the handshake is one request
        for cid in ("r1", "r2"):
            await ws.send(start(cid, "Counted.", seed=5, max_tokens=15))
            await ws.send(msg("end", cid))
            assert (await until_end(ws, cid))[-1]["type"] == "done"
        await ws.send(start("r3", "One too many.", seed=5, max_tokens=15))
        refused = (await until_end(ws, "r3"))[-1]
    assert refused["type"] == "error" and refused["code"] == "requests_limit_exceeded" and refused["retryable"]
    await worker.wait_idle()


async def test_contexts_refused_before_a_worker_opened_them_are_not_metered(gateway, worker, new_tenant):
    _, key = await new_tenant()
    async with await open_stream(gateway, key) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "nobody", "voice": "nobody-at-all", "text": "Hi."}))
        assert (await until_end(ws, "nobody"))[-1]["code"] == "voice_not_found"
        await ws.send(start("long", "x" * (MAX_TEXT_CHARS + 1)))
        assert (await until_end(ws, "long"))[-1]["code"] == "text_too_long"
        await ws.send(start("ok", "Metered.", seed=6, max_tokens=15))
        await ws.send(msg("end", "ok"))
        assert (await until_end(ws, "ok"))[-1]["type"] == "done"
    async with httpx.AsyncClient() as http:
        for _ in range(100):
            usage = (await http.get(f"{gateway.url}/v1/usage", headers=auth(key))).json()
            if usage["audio_seconds"] > 0:
                break
            await asyncio.sleep(0.1)
    assert usage["requests"] == 1 and usage["audio_seconds"] > 0


# -- the key re-checked on an open socket ------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_gateway(worker, redis_server, adapter_store, tmp_path_factory):
    """A gateway of its own, started with this module: its `auth_cache_s` is short, so its sockets
    re-check keys every second, and its links to the worker are new."""
    handle = start_gateway(redis_server.url, adapter_store, tmp_path_factory.mktemp("quick-gateway"),
                           env={"VOICERING_GATEWAY_AUTH_CACHE_S": str(AUTH_CACHE_S)})
    yield handle
    handle.stop()


@pytest.fixture
async def registry(redis_url):
    redis = connect_redis(redis_url, timeout_s=2.0)
    yield Tenants(redis, GATEWAY_TENANT_PREFIX)
    await redis.aclose()


async def test_a_revoked_key_s_open_socket_is_told_and_closed(quick_gateway, worker, new_tenant, registry):
    tenant, key = await new_tenant()
    async with await open_stream(quick_gateway, key) as ws:
        await ws.send(start("long", "A long line that is still being spoken.", seed=7, max_tokens=3000))
        await ws.send(msg("end", "long"))
        while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
            pass  # speaking
        await registry.revoke(tenant.id)
        told = []
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(AUTH_CACHE_S + 20):  # generous: a loaded box
                while True:
                    raw = await ws.recv()
                    if not isinstance(raw, bytes):
                        told.append(json.loads(raw))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    errors = [m for m in told if m["type"] == "error"]
    assert errors and errors[-1]["code"] == "invalid_api_key" and errors[-1]["context_id"] is None
    assert not any(m["type"] == "done" and m.get("reason") == "completed" for m in told)
    await worker.wait_idle()  # the open context was cancelled on the worker


async def test_lowered_limits_reach_an_open_socket(quick_gateway, worker, new_tenant, registry):
    tenant, key = await new_tenant(max_streams=3)
    async with await open_stream(quick_gateway, key) as ws:
        await ws.send(start("warm", "Before.", seed=8, max_tokens=15))
        await ws.send(msg("end", "warm"))
        assert (await until_end(ws, "warm"))[-1]["type"] == "done"
        await registry.set_limits(tenant.id, max_streams=1)
        await asyncio.sleep(AUTH_CACHE_S)
        deadline = time.monotonic() + 30  # generous: the re-check lands within AUTH_CACHE_S on an idle box
        for attempt in range(1000):
            held, second = f"held{attempt}", f"second{attempt}"
            await ws.send(start(held, "Held open while another one starts.", seed=8, max_tokens=3000))
            await ws.send(msg("end", held))
            while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
                pass  # it speaks: it holds the tenant's one slot
            await ws.send(start(second, "One stream too many.", seed=8, max_tokens=15))
            await ws.send(msg("end", second))
            outcome = (await until_end(ws, second))[-1]
            await ws.send(msg("cancel", held))
            await until_end(ws, held)
            if outcome["type"] == "error":
                break
            assert time.monotonic() < deadline, "the lowered max_streams never reached the open socket"
            await asyncio.sleep(0.5)
    assert outcome["code"] == "streams_limit_exceeded"
    await worker.wait_idle()
