"""The lease on a job, by the trainer's own clock and fenced by its token, on real redis-servers:
a trainer cut off from Redis (server killed, or frozen so calls hang) stops within about the
lease; a stale holder can neither write the job nor publish its voice, the new holder can."""

import json
import signal
import time

import pytest

from hashring.embedded import EmbeddedRedis
from lora_training import publish as pub
from lora_training.consumer import Heartbeat
from lora_training.errors import LeaseLost
from lora_training.jobs import JobQueue, Lease
from lora_training.pipeline import JobSpec
from lora_training.stop import Stop

LEASE_MS = 600


@pytest.fixture
def own_redis():
    """A redis-server of this test's own, free to kill or freeze."""
    server = EmbeddedRedis().start()
    yield server
    if server.running:
        server._proc.send_signal(signal.SIGCONT)
    server.stop()


def _spec(tmp_path, name="v") -> JobSpec:
    return JobSpec(name=name, tenant="acme", audio=[tmp_path / "take.wav"])


def _wait(condition, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, "condition not met in time"
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.parametrize("cut", ["killed", "frozen"])
def test_a_trainer_cut_off_from_redis_stops_within_the_lease(own_redis, tmp_path, cut):
    queue = JobQueue.connect(own_redis.url, prefix="cut")
    try:
        job = queue.submit(_spec(tmp_path)).job_id
        delivery = queue.next("t", block_ms=100, claim_idle_ms=60_000)
        lease, stop = Lease(queue, job, "tok", LEASE_MS), Stop()
        assert lease.acquire()
        with Heartbeat(queue, lease, delivery, "t", stop):
            time.sleep(3 * LEASE_MS / 1000)  # renewals keep it
            assert not stop.requested and not lease.expired
            if cut == "killed":
                own_redis.kill()
            else:  # a partition: requests hang instead of failing
                own_redis._proc.send_signal(signal.SIGSTOP)
            waited = _wait(lambda: stop.requested, timeout=5.0)
            assert waited < LEASE_MS / 1000 + 0.5  # by its own clock, whatever Redis says (or not)
            if cut == "frozen":
                own_redis._proc.send_signal(signal.SIGCONT)
        with pytest.raises(LeaseLost):
            stop.check()
    finally:
        queue.close()


def test_a_stale_holder_can_neither_write_nor_publish_and_the_new_holder_can(queue, stand_in, tmp_path):
    job = queue.submit(_spec(tmp_path)).job_id
    store = tmp_path / "store"
    stale = Lease(queue, job, "trainer-a:1", 10_000)
    assert stale.acquire()
    stale.update(state="validating")
    staged_a = pub.stage(stand_in.voice("tara"), store, job, {"job_id": job})
    # trainer-a is partitioned long enough for its lock to expire in Redis (its clock says it is fine)
    queue.release(job, "trainer-a:1")
    fresh = Lease(queue, job, "trainer-b:2", 10_000)
    assert fresh.acquire() and not stale.expired

    with pytest.raises(LeaseLost):
        stale.update(state="ready")
    with pytest.raises(LeaseLost):
        pub.publish(staged_a, store, "acme/v", max_rank=32, fence=stale.fence_publish)
    assert not (store / "acme" / "v").exists() and queue.status(job).state == "validating"

    staged_b = pub.stage(stand_in.voice("tara"), store, job, {"job_id": job})
    assert staged_b != staged_a and not staged_a.exists()  # each attempt stages apart; earlier ones go
    assert pub.publish(staged_b, store, "acme/v", max_rank=32, fence=fresh.fence_publish) == store / "acme" / "v"
    fresh.update(state="ready")
    assert json.loads((store / "acme" / "v" / "voicering.json").read_text())["job_id"] == job
    assert queue.redis.hget(queue.job_key(job), "publish_token") == "trainer-b:2"
    assert queue.status(job).state == "ready"


def test_a_lease_expired_by_the_trainers_clock_is_refused_even_if_redis_still_holds_it(queue, stand_in, tmp_path):
    job = queue.submit(_spec(tmp_path)).job_id
    lease = Lease(queue, job, "tok", 200)
    assert lease.acquire()
    assert queue.renew(job, "tok", 10_000)  # a renewal that reached Redis but whose reply never came back
    time.sleep(0.3)
    assert lease.expired and queue.holder(job) == "tok"  # the trainer cannot know it still holds the lock
    staged = pub.stage(stand_in.voice("tara"), tmp_path / "store", job, {"job_id": job})
    with pytest.raises(LeaseLost):
        pub.publish(staged, tmp_path / "store", "acme/v", max_rank=32, fence=lease.fence_publish)
    assert not (tmp_path / "store" / "acme" / "v").exists()
    assert queue.redis.hget(queue.job_key(job), "publish_token") is None
