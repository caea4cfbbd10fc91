"""A submit its caller gave up on: Redis ran the submit script (the job is queued) and the caller's
clock ran out on the answer. redis-py does not send it again: the caller sees InfrastructureError
(the gateway's upload answers 503) while the job waits for a trainer. `withdraw` takes it back, and
takes nothing else. The late queue talks to the session Redis through the proxy of
tests/fixtures/late_redis.py, which holds the answer to the first command carrying the job's id
past the queue's clock."""

from __future__ import annotations

import asyncio

import pytest

from lora_training.errors import InfrastructureError
from lora_training.jobs import JobQueue
from lora_training.pipeline import JobSpec
from tests.fixtures.late_redis import late_answers

pytestmark = pytest.mark.timeout(120)

SOCKET_TIMEOUT_S = 1.0  # the late queue's clock on one answer
HOLD_S = 3 * SOCKET_TIMEOUT_S


def _spec(uploads, name: str) -> JobSpec:
    return JobSpec(name=name, tenant="acme", audio=uploads.audio, transcripts=uploads.manifest)


def _entries(queue: JobQueue, job_id: str) -> list[str]:
    return [entry for entry, fields in queue.redis.xrange(queue.stream) if fields.get("job_id") == job_id]


async def test_a_submit_whose_answer_was_lost_fails_though_it_queued_the_job_and_withdraw_takes_it_back(
        redis_server, queue, uploads):
    queue.submit(_spec(uploads, "warm-up"))  # the script loaded and the group made, as on any live queue: the
    # held command then runs at once (unloaded, it would fail NOSCRIPT and run only on a second try)
    spec = _spec(uploads, "late")
    async with late_answers(redis_server.port, spec.job_id.encode(), 1, HOLD_S) as proxy:
        late = JobQueue.connect(proxy.url, queue.prefix, timeout_s=SOCKET_TIMEOUT_S)
        try:
            with pytest.raises(InfrastructureError, match="submitting a job"):
                await asyncio.to_thread(late.submit, spec)
            assert proxy.held == 1
            assert queue.status(spec.job_id).state == "queued" and len(_entries(queue, spec.job_id)) == 1
            assert await asyncio.to_thread(late.withdraw, spec.job_id)  # the caller takes it back
        finally:
            late.close()
    assert queue.status(spec.job_id) is None and _entries(queue, spec.job_id) == []
    assert queue.redis.zscore(queue.index, spec.job_id) is None


def test_a_withdrawn_job_leaves_nothing_for_a_trainer(queue, uploads):
    given_up = queue.submit(_spec(uploads, "given-up")).job_id
    kept = queue.submit(_spec(uploads, "kept")).job_id
    assert queue.withdraw(given_up)
    assert queue.status(given_up) is None and _entries(queue, given_up) == []
    assert queue.redis.zscore(queue.index, given_up) is None
    delivery = queue.next("trainer", block_ms=100, claim_idle_ms=60_000)
    assert delivery is not None and delivery.job_id == kept  # the other job is untouched
    assert queue.next("trainer", block_ms=100, claim_idle_ms=60_000) is None
    assert queue.withdraw("never-submitted")  # nothing to take back: nothing left


def test_a_withdrawn_job_a_trainer_holds_is_asked_to_stop_and_kept_until_it_has(queue, uploads):
    job = queue.submit(_spec(uploads, "held")).job_id
    delivery = queue.next("trainer", block_ms=100, claim_idle_ms=60_000)
    assert delivery.job_id == job and queue.acquire(job, "trainer-token", 60_000)
    assert not queue.withdraw(job)  # its trainer stops at its next step; the trim takes the records then
    assert queue.status(job).cancel_requested
