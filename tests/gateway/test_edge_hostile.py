"""The gateway's HTTP edge against hostile strangers (issue 19), on real gateway processes:

- a body is never read before its key is checked (401 with the head alone), and never beyond its
  route's limit (413 from Content-Length, or counted as a chunked body streams in), while the
  gateway's memory stays flat and another tenant's stream completes whole;
- connections that never finish their request head are closed by the server (both of uvicorn's
  HTTP parsers), and a normal request meanwhile is answered;
- a head over `max_head_bytes` or `max_headers` is answered 431 before it is buffered (both
  parsers), the gateway's memory flat under 100 connections each sending an endless header line,
  and websocket upgrades meanwhile work;
- `/metrics` is not on the public port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from gateway.api.speech import body_limit
from gateway.settings import GatewaySettings
from tests.fixtures.gateway import start_gateway
from tests.fixtures.hostile import PeakRss

pytestmark = pytest.mark.timeout(300)

HEADER_TIMEOUT_S = 3.0
MIB = 1 << 20
SPEAK = {"model": "tts-1", "voice": "tara", "input": "Another tenant speaks.", "response_format": "pcm", "seed": 2,
         "max_tokens": 7 * 30 + 1}  # 30 frames
SPEAK_BYTES = 30 * 2048 * 2


def raw_head(url: str, head: bytes, timeout_s: float = 20.0) -> bytes:
    """Send a request head alone (no body byte) and read the answer until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


async def other_tenant_speaks(gateway, key: str) -> int:
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"},
                                   json=SPEAK)
        assert response.status_code == 200
        return len(response.content)


# -- bodies ------------------------------------------------------------------------------------------


def test_a_request_without_a_key_is_refused_before_any_body_byte(gateway):
    """Old: FastAPI waited for the whole 512 MiB body before its dependency saw the missing key."""
    for auth in (b"", b"Authorization: Bearer vr_" + b"x" * 43 + b"\r\n"):
        head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + auth +
                b"Content-Length: %d\r\n\r\n" % (512 * MIB))
        answer = raw_head(gateway.url, head)  # the server answers and closes: the body is never read
        status, _, rest = answer.partition(b"\r\n")
        assert status.startswith(b"HTTP/1.1 401"), answer[:300]
        assert b"connection: close" in rest.lower() and b'"code":"invalid_api_key"' in rest


async def test_a_chunked_body_without_a_key_leaves_the_gateway_s_memory_flat(gateway, new_tenant):
    _, other = await new_tenant()
    sent = 0

    async def endless():
        nonlocal sent
        block = b"x" * MIB
        while sent < 512 * MIB:
            sent += len(block)
            yield block

    with PeakRss(gateway.proc.pid) as memory:
        speaking = asyncio.create_task(other_tenant_speaks(gateway, other))
        async with httpx.AsyncClient(timeout=60) as http:
            try:
                response = await http.post(f"{gateway.url}/v1/audio/speech", content=endless(),
                                           headers={"Content-Type": "application/json"})
                assert response.status_code == 401
            except httpx.TransportError:
                pass  # the server answered 401 and closed while the client was still writing
        spoken = await speaking
    assert spoken == SPEAK_BYTES  # the other tenant's audio came whole
    assert sent < 128 * MIB, f"the gateway read {sent / MIB:.0f} MiB of an unauthenticated body"
    assert memory.growth < 64 * MIB, f"gateway RSS grew {memory.growth / MIB:.0f} MiB"


async def test_a_body_over_the_route_s_limit_is_413_declared_or_streamed(gateway, new_tenant):
    _, key = await new_tenant()
    _, other = await new_tenant()
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    limit = body_limit(GatewaySettings())
    # declared: refused from the head, the body never read
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + key.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (limit + 1))
    answer = raw_head(gateway.url, head)
    assert answer.startswith(b"HTTP/1.1 413") and b'"code":"request_too_large"' in answer, answer[:300]
    # chunked: counted as it streams, refused the moment it passes the limit
    sent = 0

    async def endless():
        nonlocal sent
        while sent < 256 * MIB:
            sent += 64 * 1024
            yield b" " * (64 * 1024)

    with PeakRss(gateway.proc.pid) as memory:
        speaking = asyncio.create_task(other_tenant_speaks(gateway, other))
        async with httpx.AsyncClient(timeout=60) as http:
            try:
                response = await http.post(f"{gateway.url}/v1/audio/speech", content=endless(), headers=auth)
                assert response.status_code == 413
                error = response.json()["error"]
                assert error["code"] == "request_too_large" and str(limit) in error["message"]
            except httpx.TransportError:
                pass
        assert await speaking == SPEAK_BYTES
    assert sent < 64 * MIB and memory.growth < 64 * MIB
    # a body within the limit is read and spoken as before
    async with httpx.AsyncClient(timeout=120) as http:
        ok = await http.post(f"{gateway.url}/v1/audio/speech", headers=auth,
                             json={**SPEAK, "max_tokens": 15, "input": "é" * 200})
    assert ok.status_code == 200


def test_no_route_lets_fastapi_read_a_body_before_its_dependencies():
    """Every JSON route reads its body itself, after the key (edge.read_body): FastAPI parses a
    declared body before any dependency runs."""
    from fastapi.routing import APIRoute

    from gateway.api.app import create_app

    routes = [r for r in create_app(GatewaySettings()).routes if isinstance(r, APIRoute)]
    assert routes and all(r.body_field is None for r in routes), [r.path for r in routes if r.body_field]


# -- slow heads ----------------------------------------------------------------------------------------


@pytest.fixture(params=["httptools", "h11"])
def slow_head_gateway(request, redis_server, adapter_store, tmp_path):
    handle = start_gateway(redis_server.url, adapter_store, tmp_path / request.param,
                           env={"VOICERING_GATEWAY_HTTP": request.param,
                                "VOICERING_GATEWAY_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)})
    yield handle
    handle.stop()


async def test_connections_that_never_finish_their_head_are_closed(slow_head_gateway, new_tenant):
    gateway = slow_head_gateway
    _, key = await new_tenant()
    host, port = gateway.url.removeprefix("http://").split(":")
    socks = []
    for i in range(300):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /v1/mod" if i % 3 else b"")  # half a request line, or nothing at all
        socks.append(sock)
    try:
        opened = time.monotonic()
        async with httpx.AsyncClient(timeout=30) as http:  # a normal request meanwhile is answered
            models = await http.get(f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert models.status_code == 200
        deadline = opened + HEADER_TIMEOUT_S + 20  # generous: a loaded 2-core box
        open_ = list(socks)
        while open_ and time.monotonic() < deadline:
            still = []
            for sock in open_:
                sock.settimeout(0.01)
                try:
                    if sock.recv(1024) == b"":
                        continue  # closed by the server
                except TimeoutError:
                    pass
                except OSError:
                    continue  # reset by the server
                still.append(sock)
            open_ = still
            await asyncio.sleep(0.2)
        assert not open_, f"{len(open_)} of 300 slow connections still open {HEADER_TIMEOUT_S + 20:.0f} s later"
    finally:
        for sock in socks:
            sock.close()


async def test_a_kept_alive_connection_is_closed_when_its_next_head_stalls(slow_head_gateway):
    host, port = slow_head_gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HEADER_TIMEOUT_S + 20) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first or not first.endswith(b"}"):  # the whole JSON answer
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /hea")  # the next request starts, then stalls
        began = time.monotonic()
        assert sock.recv(65536) == b""  # closed by the server (keep-alive or head deadline)
        assert time.monotonic() - began < HEADER_TIMEOUT_S + 20


# -- head bounds (issue 34 item 2) ---------------------------------------------------------------------


def head_of(*fields: bytes) -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: gw\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


async def hold_an_unfinished_header_line(url: str, size: int) -> tuple[int, bytes]:
    """Send a request line and `size` bytes of one header line that never ends, and hold the
    connection: (bytes the server took before it answered or closed, its answer)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent, block = 0, b"a" * (64 * 1024)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Filler: ")
        while sent < size:
            writer.write(block)
            await writer.drain()
            sent += len(block)
        return sent, await asyncio.wait_for(reader.read(), HEADER_TIMEOUT_S + 20)
    except OSError:  # the server answered and closed while this side was still writing
        try:
            return sent, await asyncio.wait_for(reader.read(), 5)
        except (OSError, TimeoutError):
            return sent, b""
    finally:
        writer.close()


async def test_heads_over_their_bounds_are_431_and_the_gateway_s_memory_stays_flat(slow_head_gateway, new_tenant,
                                                                                  request):
    """2,000 headers, one 1 MiB header, and 100 connections each holding an unfinished 4 MiB
    header line (the attack of issue 34: 128 -> 539 MB before); websockets upgrade meanwhile."""
    gateway = slow_head_gateway
    _, key = await new_tenant()
    settings = GatewaySettings()
    for head in (head_of(*(b"X-N%d: v" % i for i in range(2000))), head_of(b"X-Big: " + b"a" * MIB)):
        answer = raw_head(gateway.url, head)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b'"code":"request_header_fields_too_large"' in answer and b"connection: close" in answer.lower()
    # within both bounds: served
    filler = b"X-Fill: " + b"a" * (settings.max_head_bytes - 4096)
    fields = [b"X-N%d: v" % i for i in range(settings.max_headers - 4)]
    for head in (head_of(filler), head_of(*fields)):
        assert raw_head(gateway.url, head.replace(b"Host: gw", b"Host: gw\r\nConnection: close")).startswith(
            b"HTTP/1.1 200 "), head[:80]
    with PeakRss(gateway.proc.pid) as memory:
        attack = [asyncio.create_task(hold_an_unfinished_header_line(gateway.url, 4 * MIB)) for _ in range(100)]
        async with httpx.AsyncClient(timeout=30) as http:  # meanwhile the API and websocket upgrades work
            models = await http.get(f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        async with connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers={"Authorization": f"Bearer {key}"},
                           open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "cancel", "context_id": "none"}))
            refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
        outcomes = await asyncio.gather(*attack)
    print(f"\n100 unfinished 4 MiB header lines ({request.node.callspec.params['slow_head_gateway']}): gateway RSS "
          f"{memory.base / MIB:.0f} MiB, peak +{memory.growth / MIB:.1f} MiB; each client sent up to "
          f"{max(sent for sent, _ in outcomes) / 1024:.0f} KiB (dropped unread after its 431)")
    assert models.status_code == 200 and refused["type"] == "rejected"
    assert all(answer.startswith(b"HTTP/1.1 431 ") or answer == b"" for _, answer in outcomes)
    assert sum(answer.startswith(b"HTTP/1.1 431 ") for _, answer in outcomes) >= 90, "heads were not refused 431"
    assert memory.growth < 32 * MIB, f"gateway RSS grew {memory.growth / MIB:.0f} MiB"


# -- metrics -------------------------------------------------------------------------------------------


def test_metrics_are_on_the_internal_port_only(slow_head_gateway):
    gateway = slow_head_gateway
    public = httpx.get(f"{gateway.url}/metrics", timeout=10)
    assert public.status_code == 404 and "voicering_gateway" not in public.text
    internal = httpx.get(gateway.metrics_url, timeout=10)
    assert internal.status_code == 200 and "voicering_gateway_requests_total" in internal.text
    assert httpx.get(gateway.metrics_url.replace("/metrics", "/v1/models"), timeout=10).status_code == 404
