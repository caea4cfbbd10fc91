"""The Redis job queue on a real redis-server: submit/list/cancel, the lease lock, re-claiming
abandoned entries, and a trainer's handling of locked, cancelled and failing jobs."""

import time

import pytest

from lora_training.consumer import Heartbeat, TrainWorker
from lora_training.errors import JobStopped, LeaseLost
from lora_training.jobs import JobQueue, Lease
from lora_training.pipeline import JobSpec
from lora_training.stop import Stop


def _spec(uploads, name="v") -> JobSpec:
    return JobSpec(name=name, tenant="acme", audio=uploads.audio, transcripts=uploads.manifest)


def _settings(train_settings, queue, **extra):
    return train_settings.model_copy(update={"queue_prefix": queue.prefix, "block_ms": 100, **extra})


def test_submit_list_and_status_are_visible_to_other_connections(queue, uploads, redis_url):
    first = queue.submit(_spec(uploads, "one"))
    second = queue.submit(_spec(uploads, "two"))
    other = JobQueue.connect(redis_url, prefix=queue.prefix)
    try:
        assert [s.job_id for s in other.list()] == [second.job_id, first.job_id]
        status = other.status(first.job_id)
        assert status.state == "queued" and status.voice_id == "acme/one" and status.progress == 0
        assert other.spec(first.job_id) == _spec(uploads, "one").model_copy(update={
            "job_id": first.job_id, "created_at": other.spec(first.job_id).created_at})
        queue.update(first.job_id, state="training", progress=42.5, step=3, total_steps=10)
        seen = other.status(first.job_id)
        assert (seen.state, seen.progress, seen.step, seen.total_steps) == ("training", 42.5, 3, 10)
    finally:
        other.close()


def test_lease_lock_is_exclusive_renewed_only_by_its_holder_and_expires(queue):
    assert queue.acquire("j", "a", 10_000)
    assert not queue.acquire("j", "b", 10_000)
    assert not queue.renew("j", "b", 10_000) and queue.renew("j", "a", 10_000)
    queue.release("j", "b")  # not the holder: no effect
    assert queue.holder("j") == "a"
    queue.release("j", "a")
    assert queue.acquire("j", "b", 200)
    time.sleep(0.35)  # the holder stopped renewing: the lease runs out
    assert queue.holder("j") is None and queue.acquire("j", "c", 10_000)


def test_abandoned_entries_are_reclaimed_only_after_going_idle(queue, uploads):
    job = queue.submit(_spec(uploads)).job_id
    first = queue.next("trainer-a", block_ms=100, claim_idle_ms=300)
    assert first.job_id == job and not first.reclaimed
    assert queue.next("trainer-b", block_ms=100, claim_idle_ms=300) is None  # owned and fresh
    for _ in range(4):  # a live owner keeps touching its entry
        time.sleep(0.15)
        queue.touch(first, "trainer-a")
        assert queue.next("trainer-b", block_ms=10, claim_idle_ms=300) is None
    time.sleep(0.4)  # trainer-a died
    again = queue.next("trainer-b", block_ms=100, claim_idle_ms=300)
    assert again.job_id == job and again.reclaimed and again.entry_id == first.entry_id
    queue.ack(again)
    assert queue.pending() == 0


def test_a_locked_job_is_never_run_by_a_second_trainer(queue, uploads, train_settings):
    job = queue.submit(_spec(uploads)).job_id
    assert queue.acquire(job, "trainer-a:live", 10_000)  # another trainer is running it
    worker = TrainWorker(_settings(train_settings, queue, consumer="trainer-b"), queue, console=False)
    delivery = queue.next("trainer-b", block_ms=100, claim_idle_ms=60_000)
    assert worker.process(delivery) is False
    status = queue.status(job)
    assert status.state == "queued" and status.attempts == 0 and queue.pending() == 1
    assert queue.holder(job) == "trainer-a:live"


def test_cancel_a_queued_job(queue, uploads, train_settings):
    job = queue.submit(_spec(uploads)).job_id
    assert queue.cancel(job).state == "cancelled"
    worker = TrainWorker(_settings(train_settings, queue, consumer="t"), queue, console=False)
    assert worker.run(max_jobs=1, stop_event=_after(1.0)) == 0  # skipped, acked
    assert queue.pending() == 0 and queue.status(job).attempts == 0


def test_a_failing_job_ends_failed_with_its_reason(queue, uploads, train_settings, tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"not audio at all")
    spec = JobSpec(name="v", tenant="acme", audio=[broken])
    (tmp_path / "broken.txt").write_text("text")
    job = queue.submit(spec).job_id
    settings = _settings(train_settings, queue, consumer="t", adapter_store=tmp_path / "store", work_dir=tmp_path / "w")
    assert TrainWorker(settings, queue, console=False).run(max_jobs=1) == 1
    status = queue.status(job)
    assert status.state == "failed" and status.error_code == "bad_audio" and "broken.wav" in status.error
    assert status.attempts == 1 and queue.pending() == 0 and queue.holder(job) is None


def test_heartbeat_renews_the_lease_and_turns_cancel_or_loss_into_a_stop(queue, uploads):
    job = queue.submit(_spec(uploads)).job_id
    delivery = queue.next("t", block_ms=100, claim_idle_ms=60_000)
    lease = Lease(queue, job, "tok", 300)
    assert lease.acquire()
    stop = Stop()
    with Heartbeat(queue, lease, delivery, "t", stop):
        time.sleep(0.8)  # well past the lease: renewals kept it
        assert queue.holder(job) == "tok" and not stop.requested
        queue.cancel(job)
        _wait(lambda: stop.requested)
    with pytest.raises(JobStopped):
        stop.check()
    lost = Stop()
    with Heartbeat(queue, lease, delivery, "t", lost):
        queue.release(job, "tok")
        queue.acquire(job, "somebody-else", 10_000)
        _wait(lambda: lost.requested)
    with pytest.raises(LeaseLost):
        lost.check()


def _wait(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _after(seconds: float):
    import threading

    event = threading.Event()
    threading.Timer(seconds, event.set).start()
    return event
