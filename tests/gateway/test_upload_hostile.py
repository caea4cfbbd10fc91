"""`POST /v1/voices` as a hostile tenant uses it (issue 19), against real `voicering gateway` processes:

- hours of silence in a megabyte (m4a whose header declares them, a streamed mkv that declares
  nothing, flac) are refused with 400 audio_too_long while the gateway's memory stays flat, two at
  once, and another tenant's speech meanwhile comes back whole;
- the cheap refusals (name taken, max_voices, no training slot) come before any decode;
- a part's headers are bounded, and a form of many files holds one file open at a time;
- a body that stalls, or crawls past its total time, is cut with 408 and its files removed;
- decodes are bounded per gateway (503) and per tenant (429), with Retry-After;
- and, in this process, the DecodePool's bounds and cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from gateway.cloning import DecodePool, DecodesBusy
from gateway.cloning.decoding import DecodeStopped
from gateway.quotas import Quotas
from gateway.tenants import Tenants, connect_redis
from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX, start_gateway
from tests.fixtures.hostile import PeakRss, silent_stream

pytestmark = pytest.mark.timeout(600)

CONSENT = "I, the speaker in these recordings, agree that this account may train and serve a clone of my voice."
RSS_GROWTH_LIMIT = 300 << 20
HOURS = 4
BOUNDARY = "hostile-upload-boundary"
IDLE_S, BODY_S = 3.0, 12.0  # the body timeouts of the gateway started here


# -- hostile media: hours of silence in about a megabyte --------------------------------------------


def silent_flac(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with sf.SoundFile(out, "w", rate, 1, format="FLAC") as f:
        block = np.zeros(60 * rate, np.int16)
        for _ in range(int(seconds // 60)):
            f.write(block)
    return out.getvalue()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("hostile")
    media = {
        "hours.m4a": silent_stream(folder / "hours.m4a", HOURS * 3600, container="mp4").read_bytes(),
        "hours.mkv": silent_stream(folder / "hours.mkv", HOURS * 3600, container="matroska",
                                   seekable=False).read_bytes(),
        "hours.flac": silent_flac(HOURS * 3600),
        "hour.webm": silent_stream(folder / "hour.webm", 3600, container="webm", codec="libopus",
                                   seekable=False).read_bytes(),
    }
    assert all(len(data) < 8 << 20 for data in media.values())
    return media


def garbage() -> tuple[str, bytes]:
    return "take.wav", np.random.default_rng(5).bytes(20_000)


# -- talking to the gateway -------------------------------------------------------------------------


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def post_voice(http: httpx.AsyncClient, gateway, key: str, name: str, files: list[tuple[str, bytes]]):
    manifest = json.dumps({filename: "Silence." for filename, _ in files}).encode()
    parts = [("files", (filename, content, "application/octet-stream")) for filename, content in files]
    parts.append(("transcripts", ("transcripts.json", manifest, "application/json")))
    return await http.post(f"{gateway.url}/v1/voices", headers=auth(key), data={"name": name, "consent": CONSENT},
                           files=parts)


async def checked(http: httpx.AsyncClient, gateway, key: str, name: str, files: list[tuple[str, bytes]]):
    """`post_voice`, sent again after its Retry-After while the gateway answers 503 `unavailable`, as a
    client does: on a box loaded past its cores (two CPU burners) a Redis call of the upload's can run
    past the gateway's 1 s clock. The answer of the upload's checks, or the third 503."""
    for _ in range(3):
        response = await post_voice(http, gateway, key, name, files)
        if response.status_code != 503 or response.json()["error"]["code"] != "unavailable":
            break
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
    return response


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def incoming(gateway) -> list[Path]:
    folder = gateway.uploads / ".incoming"
    return sorted(folder.iterdir()) if folder.exists() else []


def written_parts(gateway) -> int:
    """Files the gateway has written under its uploads' folders in flight. A folder can go while it
    is read (an earlier request's, removed as its answer is sent): it counts none."""
    count = 0
    for folder in incoming(gateway):
        with contextlib.suppress(FileNotFoundError):
            count += sum(1 for _ in (folder / "audio").iterdir())
    return count


SPEECH = {"model": "tts-1", "input": "The other tenant speaks a long line, all of it.", "voice": "tara",
          "response_format": "pcm", "seed": 19, "max_tokens": 280}


async def speak(http: httpx.AsyncClient, gateway, key: str) -> bytes:
    response = await http.post(f"{gateway.url}/v1/audio/speech", json=SPEECH, headers=auth(key))
    assert response.status_code == 200, response.text
    return response.content


class RawUpload:
    """A POST /v1/voices written by hand on a socket (chunked), to send what no client library sends:
    huge part headers, a body that stops midway. Sending and reading are independent (a server that
    answered early and closed makes the sends fail, never the read of its answer)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, gateway, key: str) -> RawUpload:
        host, port = gateway.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.setblocking(False)
        upload = cls(sock)
        await upload._send((f"POST /v1/voices HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n").encode())
        return upload

    async def _send(self, data: bytes) -> bool:
        try:
            await self._loop.sock_sendall(self.sock, data)
            return True
        except OSError:  # the server answered and closed
            return False

    async def send(self, data: bytes, *, piece: int = 1 << 16) -> None:
        """`data` as chunks of `piece` bytes, until the server stops reading."""
        for at in range(0, len(data), piece):
            if not await self._send(f"{len(data[at:at + piece]):x}\r\n".encode() + data[at:at + piece] + b"\r\n"):
                return

    async def end(self) -> None:
        await self.send(f"--{BOUNDARY}--\r\n".encode())
        await self._send(b"0\r\n\r\n")

    async def answer(self, timeout: float = 60) -> tuple[int, dict]:
        received = b""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    more = await self._loop.sock_recv(self.sock, 1 << 16)
                except ConnectionResetError:
                    more = b""
                received += more
                head, sep, body = received.partition(b"\r\n\r\n")
                if sep:
                    status, *lines = head.decode("latin-1").split("\r\n")
                    fields = dict(line.lower().split(": ", 1) for line in lines)
                    if len(body) >= int(fields["content-length"]):
                        return int(status.split()[1]), json.loads(body[:int(fields["content-length"])])
                if not more:
                    raise ConnectionError(f"closed before a whole answer: {received[:200]!r}")

    def close(self) -> None:
        self.sock.close()


def text_part(name: str, value: str, *extra_headers: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra_headers)
    return f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n{headers}\r\n{value}\r\n'.encode()


def file_part(filename: str, content: bytes) -> bytes:
    return (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + content + b"\r\n"


@pytest.fixture
async def tenants(redis_url):
    redis = connect_redis(redis_url, timeout_s=2.0)
    yield Tenants(redis, GATEWAY_TENANT_PREFIX), Quotas(redis, GATEWAY_TENANT_PREFIX)
    await redis.aclose()


# -- hours of silence -------------------------------------------------------------------------------


@pytest.mark.parametrize(("filename", "minutes"), [("hours.m4a", HOURS * 60), ("hours.mkv", 45),
                                                   ("hours.flac", HOURS * 60)])
async def test_hours_of_silence_are_refused_in_any_container_without_memory_growth(
        gateway, new_tenant, hostile, filename, minutes):
    """The m4a declares its four hours (refused from its header, like the flac); the streamed mkv
    declares nothing, so it is decoded up to the cap (45 minutes of audio) and refused there."""
    tenant, key = await new_tenant()
    async with httpx.AsyncClient(timeout=120) as http:
        watch = PeakRss(gateway.proc.pid).start()
        response = await post_voice(http, gateway, key, "v", [(filename, hostile[filename])])
        growth = watch.stop()
    error = error_of(response, 400)
    assert (error["code"], error["param"]) == ("audio_too_long", "files")
    assert error["message"].startswith(f"the uploads hold over {minutes} minutes of audio; the limit is 30 minutes "
                                       "of speech (2700 s of audio per upload")
    assert growth < RSS_GROWTH_LIMIT, f"gateway RSS grew {growth >> 20} MB"
    assert incoming(gateway) == [] and not (gateway.uploads / tenant.id).exists()


async def test_two_at_once_while_another_tenant_speaks(gateway, new_tenant, hostile):
    (_, first), (_, second), (_, victim) = [await new_tenant() for _ in range(3)]
    async with httpx.AsyncClient(timeout=180) as http:
        reference = await speak(http, gateway, victim)
        watch = PeakRss(gateway.proc.pid).start()
        refused = asyncio.gather(checked(http, gateway, first, "v", [("hours.m4a", hostile["hours.m4a"])]),
                                 checked(http, gateway, second, "v", [("hours.mkv", hostile["hours.mkv"])]))
        spoken = await speak(http, gateway, victim)
        answers = await refused
        growth = watch.stop()
    assert [error_of(r, 400)["code"] for r in answers] == ["audio_too_long", "audio_too_long"]
    assert len(spoken) == len(reference) > 50_000  # whole
    assert growth < RSS_GROWTH_LIMIT, f"gateway RSS grew {growth >> 20} MB"


# -- the cheap refusals first -----------------------------------------------------------------------


async def test_a_taken_name_is_refused_before_the_files_are_decoded(gateway, new_tenant, hostile, tenants):
    """Decoding the mkv first would answer 400 audio_too_long (after seconds of CPU); the name comes first."""
    registry, _ = tenants
    tenant, key = await new_tenant()
    await registry.register_voice(tenant, "taken", consent=CONSENT)
    async with httpx.AsyncClient(timeout=120) as http:
        response = await post_voice(http, gateway, key, "taken", [("hours.mkv", hostile["hours.mkv"])])
    assert error_of(response, 409)["code"] == "voice_exists"
    assert (await registry.voice(tenant, "taken")).state == "ready"  # the refused upload did not touch it
    assert incoming(gateway) == []


async def test_max_voices_and_training_slots_are_refused_before_decoding_and_undone(gateway, new_tenant, tenants):
    registry, quotas = tenants
    tenant, key = await new_tenant(max_voices=1)
    await registry.register_voice(tenant, "first", consent=CONSENT)
    busy, busy_key = await new_tenant(max_training_jobs=1)
    await quotas.acquire_training_slot(busy, "clone-elsewhere")
    async with httpx.AsyncClient(timeout=60) as http:
        over_voices = await post_voice(http, gateway, key, "second", [garbage()])
        no_slot = await post_voice(http, gateway, busy_key, "v", [garbage()])
    assert error_of(over_voices, 429)["code"] == "voices_limit_exceeded"  # not bad_audio: nothing was decoded
    assert error_of(no_slot, 429)["code"] == "training_jobs_limit_exceeded"
    assert [v.name for v in await registry.voices(tenant)] == ["first"]
    assert await registry.voices(busy) == []  # registered, then undone when no slot was free
    assert await quotas.training_jobs(busy) == {"clone-elsewhere"}
    assert incoming(gateway) == []


# -- multipart: bounded headers, one open file --------------------------------------------------------


async def test_a_part_with_megabytes_of_headers_is_refused_at_the_bound(gateway, new_tenant):
    _, key = await new_tenant()
    watch = PeakRss(gateway.proc.pid).start()
    upload = await RawUpload.open(gateway, key)
    try:
        sending = asyncio.create_task(upload.send(text_part("name", "v", "X-Padding: " + "a" * (8 << 20))))
        status, answer = await upload.answer()
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
    finally:
        upload.close()
    growth = watch.stop()
    assert status == 400 and answer["error"]["code"] in ("headers_too_large", "invalid_multipart"), answer
    assert growth < 100 << 20, f"gateway RSS grew {growth >> 20} MB"


async def test_many_headers_of_a_part_are_refused_with_headers_too_large(gateway, new_tenant):
    """Each header under any one-line limit, together 28 kB in one part: over MAX_PART_HEADER_BYTES."""
    _, key = await new_tenant()
    padding = [f"X-Padding-{i}: {'a' * 4000}" for i in range(7)]
    upload = await RawUpload.open(gateway, key)
    try:
        await upload.send(text_part("name", "v", *padding) + text_part("consent", CONSENT))
        await upload.end()
        status, answer = await upload.answer()
    finally:
        upload.close()
    assert status == 400 and answer["error"]["code"] == "headers_too_large", answer
    assert "8192 bytes of headers" in answer["error"]["message"]
    assert incoming(gateway) == []


async def test_a_form_of_many_files_holds_one_file_open_at_a_time(gateway, new_tenant):
    _, key = await new_tenant()
    files = 300
    upload = await RawUpload.open(gateway, key)
    try:
        await upload.send(text_part("name", "v") + text_part("consent", CONSENT)
                          + b"".join(file_part(f"take{i}.wav", b"x" * 1000) for i in range(files)))
        deadline = time.monotonic() + 60  # until the gateway has written every part (no closing boundary yet)
        while written_parts(gateway) < files:
            assert time.monotonic() < deadline, "the parts never reached the disk"
            await asyncio.sleep(0.05)
        uploads = str(gateway.uploads.resolve())
        held = []
        for fd in Path(f"/proc/{gateway.proc.pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(uploads):
                    held.append(fd)
        assert len(held) <= 1, f"{len(held)} upload files open"
        await upload.end()
        status, answer = await upload.answer()
    finally:
        upload.close()
    # not audio (the trainers transcribe, so no transcripts are needed): refused, and nothing kept
    assert status == 400 and answer["error"]["code"] == "bad_audio", answer
    assert incoming(gateway) == []


# -- body timeouts and decode bounds, on a gateway of this module's own ------------------------------


@pytest.fixture(scope="module")
def strict_gateway(redis_server, tmp_path_factory):
    """Short body timeouts, one decode at a time (for one tenant and in all), a queue of its own."""
    folder = tmp_path_factory.mktemp("strict-gateway")
    (folder / "voices").mkdir()
    handle = start_gateway(redis_server.url, folder / "voices", folder, env={
        "VOICERING_GATEWAY_UPLOAD_IDLE_TIMEOUT_S": str(IDLE_S), "VOICERING_GATEWAY_UPLOAD_BODY_TIMEOUT_S": str(BODY_S),
        "VOICERING_GATEWAY_MAX_CONCURRENT_DECODES": "1", "VOICERING_GATEWAY_MAX_DECODES_PER_TENANT": "1",
        "VOICERING_GATEWAY_TRAIN_PREFIX": f"test:train:{uuid.uuid4().hex[:8]}"})
    yield handle
    handle.stop()


async def test_a_body_that_stalls_is_cut_and_its_files_removed(strict_gateway, new_tenant):
    _, key = await new_tenant()
    upload = await RawUpload.open(strict_gateway, key)
    try:
        await upload.send(text_part("name", "v") + file_part("take.wav", b"RIFF" + bytes(5000))[:-2])
        assert await _wait_for(lambda: incoming(strict_gateway))  # received, then nothing more comes
        status, answer = await upload.answer(timeout=IDLE_S + 30)
    finally:
        upload.close()
    assert status == 408 and answer["error"]["code"] == "request_timeout", answer
    assert f"nothing arrived for {IDLE_S:g} s" in answer["error"]["message"]
    assert incoming(strict_gateway) == []


async def test_a_body_that_crawls_past_its_total_time_is_cut(strict_gateway, new_tenant):
    _, key = await new_tenant()
    upload = await RawUpload.open(strict_gateway, key)
    try:
        await upload.send(text_part("name", "v") + file_part("take.wav", b"")[:-2])
        answered = asyncio.create_task(upload.answer(timeout=BODY_S + 30))
        while not answered.done():  # a byte every half second: never idle for IDLE_S
            await upload.send(b"\x00")
            await asyncio.wait([answered], timeout=0.5)
        status, answer = answered.result()
    finally:
        upload.close()
    assert status == 408 and answer["error"]["code"] == "request_timeout", answer
    assert f"took longer than {BODY_S:g} s" in answer["error"]["message"]
    assert incoming(strict_gateway) == []


async def test_decodes_past_the_gateway_s_and_the_tenant_s_bound_are_refused_with_retry_after(
        strict_gateway, new_tenant, hostile, tenants):
    """While one upload decodes (an hour of streamed opus: decoded to the 45-minute cap, seconds of
    CPU), another of the same tenant gets 429 and one of another tenant 503, both with Retry-After."""
    registry, _ = tenants
    (tenant, key), (other, other_key) = await new_tenant(), await new_tenant()  # 2 training slots each
    async with httpx.AsyncClient(timeout=120) as http:
        decoding = asyncio.create_task(post_voice(http, strict_gateway, key, "long", [("hour.webm", hostile["hour.webm"])]))
        registered = await _wait_for_async(lambda: registry.voices(tenant), timeout=60)
        assert [v.name for v in registered] == ["long"]  # past name, count and slot: decoding now
        same_tenant = await post_voice(http, strict_gateway, key, "again", [garbage()])
        other_tenant = await post_voice(http, strict_gateway, other_key, "v", [garbage()])
        first = await decoding
    assert not decoding.cancelled() and error_of(first, 400)["code"] == "audio_too_long"
    error = error_of(same_tenant, 429)
    assert error["code"] == "decodes_limit_exceeded" and same_tenant.headers["Retry-After"] == "5"
    error = error_of(other_tenant, 503)
    assert error["code"] == "decodes_busy" and other_tenant.headers["Retry-After"] == "5"
    assert await registry.voices(tenant) == [] and await registry.voices(other) == []  # all undone
    assert incoming(strict_gateway) == []


async def _wait_for(condition, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)
    return value


async def _wait_for_async(condition, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (value := await condition()):
        if time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)
    return value


# -- the DecodePool, in this process -------------------------------------------------------------------


async def test_the_pool_bounds_decodes_per_tenant_and_in_all_and_frees_them_when_done():
    pool = DecodePool(max_decodes=2, max_per_tenant=1)
    release = threading.Event()
    try:
        first = asyncio.create_task(pool.run("t1", lambda check: release.wait(30) and "one"))
        second = asyncio.create_task(pool.run("t2", lambda check: release.wait(30) and "two"))
        await _wait_for(lambda: pool.running() == 2)
        with pytest.raises(DecodesBusy) as same:
            await pool.run("t1", lambda check: "never")
        with pytest.raises(DecodesBusy) as full:
            await pool.run("t3", lambda check: "never")
        assert (same.value.scope, same.value.code) == ("tenant", "decodes_limit_exceeded")
        assert (full.value.scope, full.value.code) == ("gateway", "decodes_busy")
        assert same.value.retry_after_s > 0 and full.value.retry_after_s > 0
        release.set()
        assert await asyncio.gather(first, second) == ["one", "two"]
        assert pool.running() == 0
        assert await pool.run("t1", lambda check: "again") == "again"
    finally:
        release.set()
        pool.close()


async def test_a_cancelled_request_stops_its_decode_and_the_slot_frees_once_the_thread_has():
    pool = DecodePool(max_decodes=1, max_per_tenant=1)
    started, stopped = threading.Event(), threading.Event()

    def work(check) -> None:
        started.set()
        try:
            while True:  # a decode, block by block
                check()
                time.sleep(0.01)
        except DecodeStopped:
            time.sleep(0.2)  # the thread takes a moment to unwind
            stopped.set()
            raise

    try:
        task = asyncio.create_task(pool.run("t1", work))
        assert await asyncio.to_thread(started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.running() == 1 or stopped.is_set()  # held until the thread is out
        assert await asyncio.to_thread(stopped.wait, 30)
        assert await _wait_for(lambda: pool.running() == 0)
    finally:
        pool.close()
