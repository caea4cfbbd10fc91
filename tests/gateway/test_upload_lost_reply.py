"""An upload whose Redis write happened but whose answer came too late (found beside two CPU
burners: a starved gateway's 1 s Redis clock ran out on a reply that was on its way). The client
is told to retry (503 `unavailable`) or its upload goes on; either way nothing of the first try may
refuse the retry as `voice_exists`.

A real `voicering gateway` process talks to the session Redis through a TCP proxy
(tests/fixtures/late_redis.py) that forwards every command at once and holds Redis's reply to the
first command that carries the voice's name (the registration) past the gateway's Redis clock: the
write is done, its answer is late. redis-py then sends the command again on a fresh connection
(`connect_redis`'s one retry). The last test holds the job's submit instead, past the gateway's
training-queue clock (`train_timeout_s`), which is not sent again: the job is queued, the upload
refused, and the job must be taken back with it."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from gateway.tenants import Tenants, VoiceNotFound, connect_redis
from lora_training.jobs import JobQueue
from lora_training.pipeline import JobSpec
from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX, start_gateway
from tests.fixtures.late_redis import late_answers
from tests.fixtures.speech import upload_parts
from tests.gateway.test_upload_hostile import CONSENT, garbage, post_voice

pytestmark = pytest.mark.timeout(180)

NAME = "late-answer"  # the first Redis command carrying it is the voice's registration
REDIS_TIMEOUT_S = 1.0  # the gateway's clock for one Redis call (its default)
HOLD_S = 3 * REDIS_TIMEOUT_S


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
        async with late_answers(redis_server.port, NAME.encode(), holds, HOLD_S) as proxy:
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


async def test_an_upload_whose_submit_was_answered_too_late_leaves_no_job_and_its_retry_is_queued(
        redis_server, new_tenant, creator_corpus, tmp_path):
    """The upload passes its checks and its job is queued, but the submit's answer comes after the
    gateway's training-queue clock: 503 `training_queue_unavailable`, and the job it may have queued is withdrawn
    with the rest of the upload (it used to stay queued, for a trainer to run on files the refused
    upload had removed). The client's retry is queued as one job."""
    tenant, key = await new_tenant()
    prefix = f"test:train:{uuid.uuid4().hex[:8]}"
    queue = JobQueue.connect(redis_server.url, prefix)
    # the submit script loaded and the group made, as on any live queue: the held submit then runs at once
    queue.withdraw(queue.submit(JobSpec(name="warm-up", tenant=tenant.id, audio=[creator_corpus[0].path])).job_id)
    registry_redis = connect_redis(redis_server.url, timeout_s=5.0)
    registry = Tenants(registry_redis, GATEWAY_TENANT_PREFIX)
    parts = upload_parts(creator_corpus)
    (tmp_path / "voices").mkdir()
    try:
        # the submit is the only command that carries a job spec's upload checks
        async with late_answers(redis_server.port, b'"upload_checks"', 1, HOLD_S) as proxy:
            gateway = await asyncio.to_thread(start_gateway, proxy.url, tmp_path / "voices", tmp_path, env={
                "VOICERING_GATEWAY_TRAIN_TIMEOUT_S": str(REDIS_TIMEOUT_S),
                "VOICERING_GATEWAY_TRAIN_PREFIX": prefix})
            try:
                async with httpx.AsyncClient(timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
                    async def upload() -> httpx.Response:
                        return await http.post(f"{gateway.url}/v1/voices", data={"name": NAME, "consent": CONSENT},
                                               files=parts)

                    answer = await upload()
                    assert proxy.held == 1, gateway.log_tail()
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["error"]["code"] == "training_queue_unavailable", answer.text
                    assert await asyncio.to_thread(queue.list) == []  # nothing queued for a trainer
                    assert await asyncio.to_thread(queue.redis.xlen, queue.stream) == 0
                    with pytest.raises(VoiceNotFound):
                        await registry.voice(tenant, NAME)
                    answer = await upload()  # the retry
            finally:
                await asyncio.to_thread(gateway.stop)
        assert answer.status_code == 202, answer.text
        (job,) = await asyncio.to_thread(queue.list)
        assert job.job_id == answer.json()["job_id"] and job.state == "queued"
    finally:
        queue.close()
        await registry_redis.aclose()
