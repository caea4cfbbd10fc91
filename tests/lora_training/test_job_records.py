"""A job's records in Redis do not outlive their use (issue 34, item 7), on a real redis-server:
`JobQueue.delete` removes a final job's hash, index entry and stream entry and leaves a live or
locked one alone; `JobQueue.trim` removes the jobs final for longer than the keep period, and a
trainer (`TrainWorker.run`) trims as it goes."""

from __future__ import annotations

import threading
import time

import pytest

from lora_training.consumer import TrainWorker
from lora_training.jobs import GROUP, JobQueue, Lease
from lora_training.pipeline import JobSpec

DAY_S = 86_400.0


def _submit(queue: JobQueue, tmp_path, name: str) -> str:
    return queue.submit(JobSpec(name=name, tenant="acme", audio=[tmp_path / f"{name}.wav"],
                                consent_phrase="anchor lemon tiger")).job_id


def _finish(queue: JobQueue, job_id: str, state: str = "ready") -> None:
    """As a trainer ends a job: delivered, locked, outcome and ack in one step, lock released."""
    delivery = queue.next("trainer-1", block_ms=100, claim_idle_ms=3_600_000)
    assert delivery is not None and delivery.job_id == job_id, delivery
    lease = Lease(queue, job_id, f"token-{job_id}", 30_000)
    assert lease.acquire()
    lease.finish(delivery, state=state, message="done")
    lease.release()


def _records(queue: JobQueue, job_id: str) -> dict:
    """Everything Redis holds for the job: its hash, its index entry, its stream entry."""
    entry = queue.redis.hget(queue.job_key(job_id), "entry_id")
    return {"hash": queue.redis.exists(queue.job_key(job_id)) == 1,
            "index": queue.redis.zscore(queue.index, job_id) is not None,
            "stream": entry is not None and bool(queue.redis.xrange(queue.stream, entry, entry))}


def _stream_ids(queue: JobQueue) -> set[str]:
    return {fields["job_id"] for _, fields in queue.redis.xrange(queue.stream)}


def _aged(queue: JobQueue, job_id: str, *, ended_days_ago: float) -> None:
    """A job made and ended that many days ago (its index score is when it was made)."""
    at = time.time() - ended_days_ago * DAY_S
    queue.redis.hset(queue.job_key(job_id), mapping={"created_at": at - 60, "updated_at": at})
    queue.redis.zadd(queue.index, {job_id: at - 60})


def test_a_final_job_is_deleted_whole_and_a_live_or_locked_one_is_left(queue, tmp_path):
    done = _submit(queue, tmp_path, "done")
    _finish(queue, done)
    live = _submit(queue, tmp_path, "live")
    locked = _submit(queue, tmp_path, "locked")
    queue.redis.hset(queue.job_key(locked), "state", "failed")  # final, but a trainer holds its lock
    assert queue.acquire(locked, "somebody", 30_000)
    assert _records(queue, done) == {"hash": True, "index": True, "stream": True}

    assert queue.delete(done)
    assert _records(queue, done) == {"hash": False, "index": False, "stream": False}
    assert queue.status(done) is None and done not in _stream_ids(queue)
    assert queue.pending() == 0  # no pending reference left to a deleted entry

    assert not queue.delete(live) and not queue.delete(locked)
    assert _records(queue, live) == _records(queue, locked) == {"hash": True, "index": True, "stream": True}
    assert queue.status(live).state == "queued"
    assert queue.delete("clone-never-was")  # nothing there: nothing to keep


def test_a_delivered_but_cancelled_job_leaves_no_pending_entry(queue, tmp_path):
    job = _submit(queue, tmp_path, "cancelled")
    delivery = queue.next("trainer-1", block_ms=100, claim_idle_ms=3_600_000)
    assert delivery.job_id == job and queue.pending() == 1
    queue.cancel(job)  # nobody holds it: cancelled at once, its entry still pending
    assert queue.status(job).state == "cancelled"
    assert queue.delete(job)
    assert queue.pending() == 0 and _records(queue, job) == {"hash": False, "index": False, "stream": False}
    assert queue.redis.xpending(queue.stream, GROUP)["pending"] == 0


def test_trim_deletes_jobs_final_past_the_keep_period_and_nothing_else(queue, tmp_path):
    old_ready, old_failed, recent, old_running = (_submit(queue, tmp_path, n)
                                                  for n in ("old-ready", "old-failed", "recent", "old-running"))
    for job, state in ((old_ready, "ready"), (old_failed, "failed"), (recent, "ready")):
        _finish(queue, job, state)
    _aged(queue, old_ready, ended_days_ago=8)
    _aged(queue, old_failed, ended_days_ago=7.5)
    _aged(queue, recent, ended_days_ago=6)
    queue.redis.hset(queue.job_key(old_running), "state", "training")
    _aged(queue, old_running, ended_days_ago=30)  # not final, however old: left alone

    assert queue.trim(7 * DAY_S) == 2
    assert queue.status(old_ready) is None and queue.status(old_failed) is None
    assert _stream_ids(queue) == {recent, old_running}
    assert {s.job_id for s in queue.list()} == {recent, old_running}
    assert queue.trim(7 * DAY_S) == 0  # once
    assert queue.trim(5 * DAY_S) == 1 and queue.status(recent) is None
    assert queue.status(old_running).state == "training"


def test_a_trainer_trims_old_jobs_as_it_runs(queue, tmp_path, train_settings):
    old = _submit(queue, tmp_path, "old")
    _finish(queue, old)
    _aged(queue, old, ended_days_ago=2)
    settings = train_settings.model_copy(update={"queue_prefix": queue.prefix, "block_ms": 100, "consumer": "t",
                                                 "job_record_keep_s": DAY_S})
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    TrainWorker(settings, queue, console=False).run(stop_event=stop)
    assert queue.status(old) is None and _stream_ids(queue) == set() and queue.list() == []
