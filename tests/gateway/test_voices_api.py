"""Voices and cloning through a real `voicering gateway` process (uvicorn), real Redis and real files:
upload checks, the byte limit enforced while the body streams, voice and training-job limits, list,
get and delete (the job cancelled, the slot freed, adapter, placement and uploads gone), tenant
isolation; and, on a gateway of its own in this process, the clone watcher living through a Redis
outage while new uploads are refused with 503.

No trainer consumes the session gateway's queue here, so the clones these tests make stay queued
(`test_clone_e2e.py` trains one for real)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from gateway.quotas import Quotas
from gateway.tenants import TenantPolicy, Tenants, connect_redis
from hashring.settings import RingSettings
from hashring.store import RingStore
from lora_training.jobs import JobQueue
from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX
from tests.fixtures.models import CLUSTER_PREFIX
from tests.fixtures.speech import SAMPLE_RATE

CONSENT = "I, the speaker in these recordings, agree that this account may train and serve a clone of my voice."
SESSION_TRAIN_PREFIX = "voicering:train"  # the session gateway's queue (GatewaySettings' default)


# -- upload material --------------------------------------------------------------------------------


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module")
def corpus(creator_corpus) -> dict:
    """All 32 espeak-ng sentences (~65 s of speech, over the default 60 s minimum) and their manifest."""
    files = [(clip.path.name, clip.path.read_bytes()) for clip in creator_corpus]
    manifest = json.dumps({clip.path.name: clip.transcript for clip in creator_corpus}).encode()
    return {"files": files, "manifest": manifest, "clips": creator_corpus}


def form(name: str | None, files, *, consent: str | None = CONSENT, manifest: bytes | None = None, **extra):
    data = {k: v for k, v in {"name": name, "consent": consent, **extra}.items() if v is not None}
    parts = [("files", (filename, content, "audio/wav")) for filename, content in files]
    if manifest is not None:
        parts.append(("transcripts", ("transcripts.json", manifest, "application/json")))
    return {"data": data, "files": parts}


def post_voice(gateway, key: str, name: str | None, files, **kw) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/voices", headers={"Authorization": f"Bearer {key}"},
                      timeout=60, **form(name, files, **kw))


def get(gateway, key: str, path: str) -> httpx.Response:
    return httpx.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def delete(gateway, key: str, name: str) -> httpx.Response:
    return httpx.delete(f"{gateway.url}/v1/voices/{name}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def speak(gateway, key: str, voice: str) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": "tts-1", "voice": voice, "input": "Hello.", "response_format": "pcm",
                            "max_tokens": 14})


def names(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [v["id"] for v in response.json()["data"]]


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def stored_for(gateway, tenant) -> list[Path]:
    """Every file kept under the gateway's uploads for the tenant, and any upload still arriving."""
    kept = sorted(p for p in (gateway.uploads / tenant.id).rglob("*") if p.is_file())
    incoming = gateway.uploads / ".incoming"
    return kept + (sorted(incoming.rglob("*")) if incoming.exists() else [])


@pytest.fixture
def queue(redis_url):
    q = JobQueue.connect(redis_url, SESSION_TRAIN_PREFIX)
    yield q
    q.close()


@pytest.fixture
async def quotas(redis_url):
    redis = connect_redis(redis_url, timeout_s=2.0)
    yield Quotas(redis, GATEWAY_TENANT_PREFIX)
    await redis.aclose()


# -- upload checks ----------------------------------------------------------------------------------


def long_silence_flac(minutes: int) -> bytes:
    """Digital silence as flac: a few hundred KB that would decode to `minutes` of audio."""
    out = io.BytesIO()
    with sf.SoundFile(out, "w", SAMPLE_RATE, 1, format="FLAC") as f:
        block = np.zeros(60 * SAMPLE_RATE, np.int16)
        for _ in range(minutes):
            f.write(block)
    return out.getvalue()


@pytest.fixture(scope="module")
def bad_cases(corpus) -> dict:
    """case -> (form fields, error code, param, words of the message)."""
    speech = corpus["files"]
    few = speech[:3]
    few_manifest = json.dumps({c.path.name: c.transcript for c in corpus["clips"][:3]}).encode()
    one = json.dumps({"take.wav": "The birch canoe slid on the smooth planks."}).encode()
    rng = np.random.default_rng(3)
    return {
        "corrupt file": (dict(name="v", files=[("take.wav", rng.bytes(50_000))], manifest=one),
                         "bad_audio", "files", "take.wav: not a readable audio file"),
        "silent audio": (dict(name="v", files=[("take.wav", wav_bytes(np.zeros(70 * SAMPLE_RATE, np.int16)))],
                              manifest=one), "bad_audio", "files", "take.wav: the audio is near-silent"),
        "too short": (dict(name="v", files=few, manifest=few_manifest), "speech_amount", "files",
                      "at least 60 s is needed"),
        "too much audio": (dict(name="v", files=[("take.flac", long_silence_flac(46))],
                                manifest=json.dumps({"take.flac": "Silence."}).encode()), "audio_too_long", "files",
                           "the uploads hold over 46 minutes of audio; the limit is 30 minutes"),
        "no consent": (dict(name="v", files=few, manifest=few_manifest, consent=None), "consent_required",
                       "consent", "the speaker's consent"),
        "blank consent": (dict(name="v", files=few, manifest=few_manifest, consent="  \n"), "consent_required",
                          "consent", "the speaker's consent"),
        "bad name": (dict(name="no/slash", files=few, manifest=few_manifest), "invalid_name", "name",
                     "is not usable"),
        "name with a space": (dict(name="my voice", files=few, manifest=few_manifest), "invalid_name", "name",
                              "is not usable"),
        "base voice name": (dict(name="tara", files=few, manifest=few_manifest), "reserved_name", "name",
                            "'tara' is a base voice"),
        "no name": (dict(name=None, files=few, manifest=few_manifest), "missing_field", "name",
                    "give the voice a name"),
        "no files": (dict(name="v", files=[], manifest=few_manifest), "missing_field", "files",
                     "no audio was uploaded"),
        "manifest names other files": (dict(name="v", files=few, manifest=one), "transcripts", "transcripts",
                                       "transcripts name files that were not uploaded: take.wav"),
        "unknown field": (dict(name="v", files=few, manifest=few_manifest, voice_style="calm"),
                          "unknown_parameter", "voice_style", "Unrecognized request argument supplied: voice_style"),
    }


CASES = ["corrupt file", "silent audio", "too short", "too much audio", "no consent", "blank consent", "bad name",
         "name with a space", "base voice name", "no name", "no files", "manifest names other files",
         "unknown field"]


@pytest.mark.parametrize("case", CASES)
async def test_a_bad_upload_is_400_saying_what_to_fix_and_nothing_is_kept(gateway, new_tenant, bad_cases, case):
    tenant, key = await new_tenant()
    fields, code, param, message = bad_cases[case]
    kw = dict(fields)
    response = post_voice(gateway, key, kw.pop("name"), kw.pop("files"), **kw)
    error = error_of(response, 400)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    assert message in error["message"]
    assert stored_for(gateway, tenant) == []
    assert names(get(gateway, key, "/v1/voices")) == ["tara", "leo"]


async def test_an_upload_without_transcripts_is_queued_for_the_trainer_s_asr(gateway, new_tenant, corpus, queue):
    _, key = await new_tenant()
    response = post_voice(gateway, key, "untyped", corpus["files"])  # clone_asr is on by default
    assert response.status_code == 202, response.text
    spec = queue.spec(response.json()["job_id"])
    assert spec.transcripts is None and not any(p.with_suffix(".txt").exists() for p in spec.audio)


def test_with_clone_asr_off_files_without_a_transcript_are_refused(corpus, tmp_path):
    from gateway.cloning.checks import check_uploads
    from gateway.cloning.errors import BadUpload
    from gateway.cloning.uploads import Upload
    from lora_training.settings import DataParams

    (tmp_path / "audio").mkdir()
    audio = [shutil.copy(clip.path, tmp_path / "audio" / clip.path.name) for clip in corpus["clips"][:2]]
    with pytest.raises(BadUpload) as refused:
        check_uploads(Upload(tmp_path, audio=[Path(p) for p in audio]), DataParams(), asr=False)
    assert refused.value.code == "transcripts" and "audio files without a transcript" in str(refused.value)


def test_a_body_that_is_not_multipart_is_400(gateway, new_tenant_key):
    response = httpx.post(f"{gateway.url}/v1/voices", headers={"Authorization": f"Bearer {new_tenant_key}"},
                          json={"name": "v", "consent": CONSENT})
    assert error_of(response, 400)["code"] == "invalid_content_type"


@pytest.fixture
async def new_tenant_key(new_tenant) -> str:
    return (await new_tenant())[1]


def test_voices_need_an_api_key(gateway):
    assert httpx.get(f"{gateway.url}/v1/voices").status_code == 401
    assert httpx.post(f"{gateway.url}/v1/voices", files={"files": ("a.wav", b"x")}).status_code == 401
    assert httpx.delete(f"{gateway.url}/v1/voices/x", headers={"Authorization": "Bearer vr_nope"}).status_code == 401


# -- the byte limit, while the body streams ---------------------------------------------------------

LIMIT = 256 * 1024
BOUNDARY = "voicering-test-boundary"


async def _raw_request(gateway, key: str, headers: str, body: bytes) -> tuple[str, dict]:
    """Send the head and `body` on a raw socket, then send nothing more and read the answer (status
    line, JSON body): an answer here proves the server replied before the request body was complete."""
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write((f"POST /v1/voices HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                      f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n{headers}\r\n").encode() + body)
        await writer.drain()
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)).decode("latin-1")
        status, *lines = head.strip().split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in lines)
        content = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), 20)
        return status, json.loads(content)
    finally:
        writer.close()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_an_upload_over_the_limit_is_413_while_it_streams_and_nothing_is_kept(gateway, new_tenant, corpus):
    tenant, key = await new_tenant(max_upload_bytes=LIMIT)
    head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="consent"\r\n\r\n{CONSENT}\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="long.wav"\r\n'
            'Content-Type: audio/wav\r\n\r\n').encode()
    audio = b"".join(content for _, content in corpus["files"])  # real speech, far more than the limit
    assert len(audio) > 4 * LIMIT
    sent = head + audio[:LIMIT + 64 * 1024]  # past the limit, then the client goes quiet (no closing boundary)
    body = b"".join(_chunk(sent[i:i + 16384]) for i in range(0, len(sent), 16384))  # chunked: no length to check
    status, answer = await _raw_request(gateway, key, "Transfer-Encoding: chunked\r\n", body)
    assert status.startswith("HTTP/1.1 413"), (status, answer)
    error = answer["error"]
    assert error["code"] == "upload_too_large" and error["param"] == "files" and str(LIMIT) in error["message"]
    assert stored_for(gateway, tenant) == [] and not (gateway.uploads / tenant.id).exists()

    # a declared length over the limit is refused before any of the body is read
    status, answer = await _raw_request(gateway, key, f"Content-Length: {100 * LIMIT}\r\n", b"")
    assert status.startswith("HTTP/1.1 413") and answer["error"]["code"] == "upload_too_large", (status, answer)
    assert names(get(gateway, key, "/v1/voices")) == ["tara", "leo"]
    assert stored_for(gateway, tenant) == []


async def test_an_ordinary_client_sees_the_413(gateway, new_tenant, corpus):
    tenant, key = await new_tenant(max_upload_bytes=LIMIT)
    response = post_voice(gateway, key, "big", corpus["files"], manifest=corpus["manifest"])
    assert error_of(response, 413)["code"] == "upload_too_large"
    assert stored_for(gateway, tenant) == []


# -- limits, list, get, delete ----------------------------------------------------------------------


async def test_max_voices_is_429_and_the_refused_upload_is_not_kept(gateway, new_tenant, corpus):
    tenant, key = await new_tenant(max_voices=1)
    assert post_voice(gateway, key, "first", corpus["files"], manifest=corpus["manifest"]).status_code == 202
    kept = stored_for(gateway, tenant)
    response = post_voice(gateway, key, "second", corpus["files"], manifest=corpus["manifest"])
    error = error_of(response, 429)
    assert error["code"] == "voices_limit_exceeded" and "delete one" in error["message"]
    assert "Retry-After" not in response.headers  # waiting does not help: deleting a voice does
    assert stored_for(gateway, tenant) == kept
    assert names(get(gateway, key, "/v1/voices")) == ["tara", "leo", "first"]


async def test_max_training_jobs_is_429_and_the_voice_is_not_registered(gateway, new_tenant, corpus, quotas):
    tenant, key = await new_tenant(max_training_jobs=1)
    first = post_voice(gateway, key, "first", corpus["files"], manifest=corpus["manifest"])
    assert first.status_code == 202
    kept = stored_for(gateway, tenant)
    error = error_of(post_voice(gateway, key, "second", corpus["files"], manifest=corpus["manifest"]), 429)
    assert error["code"] == "training_jobs_limit_exceeded" and "wait for one to finish" in error["message"]
    assert names(get(gateway, key, "/v1/voices")) == ["tara", "leo", "first"]
    assert stored_for(gateway, tenant) == kept
    assert await quotas.training_jobs(tenant) == {first.json()["job_id"]}


async def test_a_clone_is_listed_described_and_deleted_while_training(
        gateway, new_tenant, corpus, queue, quotas, stand_in, adapter_store, redis_url):
    tenant, key = await new_tenant()
    response = post_voice(gateway, key, "alice", corpus["files"], manifest=corpus["manifest"])
    assert response.status_code == 202, response.text
    created = response.json()
    assert (created["id"], created["object"], created["type"], created["state"]) == ("alice", "voice", "clone", "queued")
    job_id = created["job_id"]

    listed = get(gateway, key, "/v1/voices").json()["data"]
    assert [(v["id"], v["type"], v["state"]) for v in listed] == [
        ("tara", "base", "ready"), ("leo", "base", "ready"), ("alice", "clone", "queued")]
    voice = get(gateway, key, "/v1/voices/alice").json()
    assert voice["state"] == "queued" and voice["progress"] == 0 and voice["eta_s"] is None
    assert voice["reason"] is None and voice["message"] == "waiting for a trainer"

    # what the job and the stores hold for it
    voice_id = f"{tenant.id}/alice"
    status = queue.status(job_id)
    assert status.state == "queued" and status.voice_id == voice_id
    spec = queue.spec(job_id)
    folder = gateway.uploads / tenant.id / "alice" / job_id
    assert sorted(p.name for p in spec.audio) == sorted(name for name, _ in corpus["files"])
    assert all(p.parent == folder / "audio" and p.is_file() for p in spec.audio)
    assert spec.transcripts == folder / "transcripts.json" and spec.tenant == tenant.id and spec.name == "alice"
    assert await quotas.training_jobs(tenant) == {job_id}
    not_ready = error_of(speak(gateway, key, "alice"), 409)
    assert not_ready["code"] == "voice_not_ready" and "not ready yet (training)" in not_ready["message"]
    # the moment a trainer published it and an operator gave it replicas, just before the delete
    shutil.copytree(next(stand_in.voices.iterdir()), adapter_store / voice_id)
    async with RingStore(RingSettings(redis_url=redis_url, prefix=CLUSTER_PREFIX)) as ring:
        await ring.set_replicas(voice_id, 2)
        assert (await ring.snapshot()).replicas[voice_id] == 2

        deleted = delete(gateway, key, "alice")
        assert deleted.status_code == 200 and deleted.json() == {"id": "alice", "object": "voice.deleted",
                                                                 "deleted": True}
        assert voice_id not in (await ring.snapshot()).replicas
    assert queue.status(job_id) is None and queue.spec(job_id) is None  # deleted with the voice (issue 34, item 7)
    assert await quotas.training_jobs(tenant) == frozenset()
    assert not (adapter_store / voice_id).exists()
    assert not (gateway.uploads / tenant.id).exists()
    assert error_of(get(gateway, key, "/v1/voices/alice"), 404)["code"] == "voice_not_found"
    assert names(get(gateway, key, "/v1/voices")) == ["tara", "leo"]
    assert error_of(speak(gateway, key, "alice"), 404)["code"] == "voice_not_found"
    assert error_of(delete(gateway, key, "alice"), 404)["code"] == "voice_not_found"


async def test_another_tenant_s_voice_is_404_exactly_like_a_missing_one(gateway, new_tenant, corpus):
    owner, owner_key = await new_tenant()
    _, other_key = await new_tenant()
    assert post_voice(gateway, owner_key, "mine", corpus["files"], manifest=corpus["manifest"]).status_code == 202

    def same_as_missing(response: httpx.Response, missing: httpx.Response) -> None:
        assert response.status_code == missing.status_code == 404
        assert response.json() == json.loads(missing.text.replace("nobody-has-this", "mine"))

    same_as_missing(get(gateway, other_key, "/v1/voices/mine"), get(gateway, other_key, "/v1/voices/nobody-has-this"))
    same_as_missing(delete(gateway, other_key, "mine"), delete(gateway, other_key, "nobody-has-this"))
    same_as_missing(speak(gateway, other_key, "mine"), speak(gateway, other_key, "nobody-has-this"))
    assert names(get(gateway, other_key, "/v1/voices")) == ["tara", "leo"]
    assert get(gateway, owner_key, "/v1/voices/mine").json()["state"] == "queued"  # untouched by the other tenant
    assert delete(gateway, owner_key, "mine").status_code == 200


def test_base_voices_are_described_and_cannot_be_deleted(gateway, new_tenant_key):
    voice = get(gateway, new_tenant_key, "/v1/voices/leo").json()
    assert (voice["id"], voice["type"], voice["state"], voice["progress"]) == ("leo", "base", "ready", 100)
    error = error_of(delete(gateway, new_tenant_key, "leo"), 400)
    assert error["code"] == "base_voice" and "only your own clones" in error["message"]


async def test_a_name_in_use_is_409(gateway, new_tenant, corpus):
    _, key = await new_tenant()
    assert post_voice(gateway, key, "twice", corpus["files"], manifest=corpus["manifest"]).status_code == 202
    error = error_of(post_voice(gateway, key, "twice", corpus["files"], manifest=corpus["manifest"]), 409)
    assert error["code"] == "voice_exists"


async def test_transcripts_as_sidecar_files_and_other_formats_are_accepted(gateway, new_tenant, corpus, queue):
    _, key = await new_tenant()
    files = []
    for clip in corpus["clips"]:  # flac instead of wav, each with <stem>.txt beside it
        samples = clip.load()
        out = io.BytesIO()
        sf.write(out, samples, SAMPLE_RATE, format="FLAC")
        files += [(f"{clip.path.stem}.flac", out.getvalue()), (f"{clip.path.stem}.txt", clip.transcript.encode())]
    response = post_voice(gateway, key, "flac-voice", files)
    assert response.status_code == 202, response.text
    spec = queue.spec(response.json()["job_id"])
    assert spec.transcripts is None and all(p.suffix == ".flac" and p.with_suffix(".txt").is_file() for p in spec.audio)


# -- the watcher through a Redis outage, on a gateway of its own --------------------------------------


async def _serve(settings):
    import uvicorn

    from gateway.api.app import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=settings.port,
                                           log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(), name="test-gateway")
    deadline = time.monotonic() + 30
    while not server.started:
        assert not task.done(), "the gateway stopped while starting"
        assert time.monotonic() < deadline, "the gateway did not start"
        await asyncio.sleep(0.05)
    return server, task


async def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        found = await condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_the_watcher_lives_through_a_redis_outage_and_uploads_are_503_meanwhile(corpus, tmp_path, caplog):
    import redis as sync_redis

    from gateway.settings import GatewaySettings
    from hashring.ports import free_port
    from hashring.embedded import EmbeddedRedis

    caplog.set_level(logging.WARNING, logger="gateway.cloning")
    with EmbeddedRedis() as own:
        settings = GatewaySettings(redis_url=own.url, port=free_port(), workers=("ws://127.0.0.1:9",),
                                   uploads_dir=tmp_path / "uploads", voices_dir=tmp_path / "voices",
                                   train_prefix=f"test-clone-{uuid.uuid4().hex[:6]}")
        server, task = await _serve(settings)
        redis = connect_redis(own.url, timeout_s=1.0)
        raw = sync_redis.Redis.from_url(own.url)
        try:
            tenant, key = await Tenants(redis, settings.tenant_prefix).create(
                "acme", policy=TenantPolicy(consent="statement"))  # it sends typed consent
            url = f"http://127.0.0.1:{settings.port}"
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as api:
                created = await api.post("/v1/voices", **form("steady", corpus["files"], manifest=corpus["manifest"]))
                assert created.status_code == 202, created.text
                job_id = created.json()["job_id"]
                assert (await api.get("/v1/voices/steady")).json()["state"] == "queued"  # the key is now cached

                saved = {name: raw.dump(name) for name in raw.keys("*")}
                own.stop()
                refused = await api.post("/v1/voices", **form("later", corpus["files"], manifest=corpus["manifest"]))
                assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
                assert refused.json()["error"]["code"] == "unavailable"
                assert not (settings.uploads_dir / tenant.id / "later").exists()
                assert list((settings.uploads_dir / ".incoming").iterdir()) == []
                await asyncio.sleep(1.5)  # several watcher rounds against a dead Redis
                watchers = [t for t in asyncio.all_tasks() if t.get_name() == "clone-watcher"]
                assert len(watchers) == 1 and not watchers[0].done()
                assert any("clone watcher" in r.getMessage() for r in caplog.records)

                own.start()
                for name, blob in saved.items():
                    raw.restore(name, 0, blob, replace=True)
                queue = JobQueue.connect(own.url, settings.train_prefix)
                try:
                    queue.cancel(job_id)  # an operator cancels it: `voicering jobs --cancel`
                finally:
                    queue.close()

                async def failed():
                    voice = (await api.get("/v1/voices/steady")).json()
                    return voice if voice["state"] == "failed" else None

                voice = await _wait_for(failed, 20, "the watcher to fail the cancelled clone")
                assert "cancelled" in voice["reason"]
                quotas = Quotas(redis, settings.tenant_prefix)
                await _wait_for(lambda: _empty(quotas.training_jobs(tenant)), 10, "the training slot to be freed")
                assert raw.hlen(f"{settings.tenant_prefix}:clones") == 0
        finally:
            server.should_exit = True
            await task
            await redis.aclose()
            raw.close()


async def _empty(awaitable) -> bool:
    return not await awaitable
