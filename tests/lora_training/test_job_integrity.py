"""A job's end is never lost, and a stop is seen soon, on real redis-servers and the real pipeline:

- preprocessing and SNAC encoding see a stop (cancel, lease lost) at the next file or batch, not
  only once they are done;
- a job's outcome and the ack of its stream entry are one fenced step: a cancel that lands after
  the voice was published still ends it `ready`; an outcome Redis refuses to store is not acked,
  so the entry is re-claimed and the job finished then without training again;
- `reconcile` ends a job that stopped without an outcome (acked, unlocked), and only such a job."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from hashring.embedded import EmbeddedRedis
from lora_training import publish as pub
from lora_training.consumer import TrainWorker
from lora_training.errors import JobStopped, LeaseLost
from lora_training.jobs import Delivery, JobQueue, Lease
from lora_training.pipeline import JobSpec, run_job
from lora_training.stop import Stop
from tests.lora_training.conftest import RecordingReporter


class StopsWhen(RecordingReporter):
    """Records reports and sets the job's stop at the first progress message starting with `prefix`:
    what the heartbeat thread does when it sees a cancel request."""

    def __init__(self, stop: Stop, prefix: str) -> None:
        super().__init__()
        self.stop, self.prefix = stop, prefix

    def progress(self, percent: float, message: str = "", **fields: object) -> None:
        super().progress(percent, message, **fields)
        if message.startswith(self.prefix):
            self.stop.set(JobStopped("job was cancelled"))

    def messages(self, prefix: str) -> list[str]:
        return [m for _, m, _ in self.progress_reports if m.startswith(prefix)]


def _fresh(train_settings, tmp_path, **extra):
    """Settings with a work dir of the test's own: nothing cached, every file read and every clip encoded."""
    return train_settings.model_copy(update={"work_dir": tmp_path / "work", "adapter_store": tmp_path / "store",
                                             **extra})


def test_preprocessing_stops_at_the_next_file_once_the_job_is_stopped(uploads, train_settings, tmp_path):
    stop = Stop()
    reporter = StopsWhen(stop, "reading ")
    spec = JobSpec(name="v", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest, data=train_settings.data)
    with pytest.raises(JobStopped):
        run_job(spec, _fresh(train_settings, tmp_path), reporter, stop=stop, console=False)
    assert reporter.messages("reading ") == [f"reading {uploads.audio[0].name}"]  # not the other 8 files
    assert reporter.messages("encoded ") == [] and [s for s, _ in reporter.states] == ["preprocessing"]


def test_encoding_stops_at_the_next_batch_once_the_job_is_stopped(uploads, train_settings, tmp_path):
    stop = Stop()
    reporter = StopsWhen(stop, "encoded ")
    settings = _fresh(train_settings, tmp_path, encode_batch_s=4.0)  # a dozen batches or more
    spec = JobSpec(name="v", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest, data=settings.data)
    with pytest.raises(JobStopped):
        run_job(spec, settings, reporter, stop=stop, console=False)
    assert len(reporter.messages("reading ")) == len(uploads.audio)
    assert len(reporter.messages("encoded ")) == 1  # the first batch, then the stop
    assert [s for s, _ in reporter.states] == ["preprocessing"]


# -- outcomes and acks ------------------------------------------------------------------------------


def _spec(tmp_path, name: str) -> JobSpec:
    return JobSpec(name=name, tenant="acme", audio=[tmp_path / "take.wav"])


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


def test_an_outcome_is_written_and_acked_together_and_only_by_the_holder(queue, tmp_path):
    job = queue.submit(_spec(tmp_path, "v")).job_id
    delivery = queue.next("t", block_ms=100, claim_idle_ms=60_000)
    stale, holder = Lease(queue, job, "trainer-a:1", 10_000), Lease(queue, job, "trainer-b:2", 10_000)
    assert holder.acquire()
    with pytest.raises(LeaseLost):
        stale.finish(delivery, state="ready")
    assert queue.status(job).state == "queued" and queue.pending() == 1  # neither written nor acked
    holder.finish(delivery, state="ready", progress=100.0)
    assert queue.status(job).state == "ready" and queue.pending() == 0


def test_reconcile_ends_a_job_left_without_an_outcome_and_no_other(queue, tmp_path):
    ids = {name: queue.submit(_spec(tmp_path, name)).job_id for name in ("acked", "locked", "pending", "done")}
    deliveries = {}
    for _ in ids:
        d = queue.next("t", block_ms=100, claim_idle_ms=60_000)
        deliveries[d.job_id] = d
    assert set(deliveries) == set(ids.values())
    ids["queued"] = queue.submit(_spec(tmp_path, "queued")).job_id  # not delivered yet
    # what an older trainer left: its outcome write lost, its entry acked, its lock released
    queue.update(ids["acked"], state="validating")
    queue.ack(deliveries[ids["acked"]])
    # each of the others is kept by one thing only: its lock, its pending entry, its undelivered entry
    assert queue.acquire(ids["locked"], "live-trainer", 10_000)
    queue.update(ids["locked"], state="training")
    queue.ack(deliveries[ids["locked"]])
    queue.update(ids["pending"], state="training")  # its trainer died: the entry is re-claimed later
    queue.update(ids["done"], state="ready")
    queue.ack(deliveries[ids["done"]])

    ended = queue.reconcile(ids["acked"], "failed", message="stopped without an outcome", error_code="orphaned")
    assert (ended.state, ended.error_code, ended.message) == ("failed", "orphaned", "stopped without an outcome")
    for name, state in (("locked", "training"), ("pending", "training"), ("queued", "queued"), ("done", "ready")):
        assert queue.reconcile(ids[name], "failed", message="no").state == state, name
    assert queue.reconcile("no-such-job", "failed", message="no") is None
    with pytest.raises(ValueError):
        queue.reconcile(ids["pending"], "training", message="not an outcome")


@pytest.fixture
def own_redis():
    server = EmbeddedRedis().start()
    yield server
    server.stop()


class RecordingWorker(TrainWorker):
    """A TrainWorker that notes how each delivery's processing ended (True, False or an exception)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[tuple[str, object]] = []

    def process(self, delivery: Delivery) -> bool:
        try:
            outcome = super().process(delivery)
        except BaseException as exc:
            self.ended.append((delivery.job_id, exc))
            raise
        self.ended.append((delivery.job_id, outcome))
        return outcome


def _worker_settings(train_settings, prefix: str, tmp_path, **extra):
    # the lease renews from a thread beside training in this (loaded) process: 1.5 s leases were lost
    # mid-run on CI's 2 cores, and the job re-ran until it gave up; 6 s still re-delivers in seconds
    return train_settings.model_copy(update={
        "queue_prefix": prefix, "consumer": "t", "lease_ms": 6000, "claim_idle_ms": 6000, "block_ms": 100,
        "retry_max_s": 0.5, "adapter_store": tmp_path / "store", **extra})


def test_a_cancel_that_lands_after_publishing_still_ends_the_job_ready(queue, uploads, train_settings, tmp_path,
                                                                       monkeypatch):
    settings = _worker_settings(train_settings, queue.prefix, tmp_path)
    worker = TrainWorker(settings, queue, console=False)
    job = queue.submit(JobSpec(name="late", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                               data=train_settings.data, params=train_settings.params)).job_id
    real_publish = pub.publish

    def publish_then_cancel(*args, **kwargs):  # the voice is deleted right as it is published
        path = real_publish(*args, **kwargs)
        queue.cancel(job)
        _wait(lambda: worker._running is not None and worker._running.requested, 10, "the heartbeat to see it")
        return path

    monkeypatch.setattr(pub, "publish", publish_then_cancel)
    assert worker.run(max_jobs=1) == 1
    status = queue.status(job)
    assert status.state == "ready" and status.progress == 100 and status.cancel_requested, status
    assert queue.pending() == 0 and (tmp_path / "store" / "acme" / "late").is_dir()


def test_an_outcome_redis_refuses_is_not_acked_and_the_job_ends_on_redelivery(own_redis, uploads, train_settings,
                                                                             tmp_path, monkeypatch):
    import redis

    prefix = f"oom-{uuid.uuid4().hex[:6]}"
    queue, observer = JobQueue.connect(own_redis.url, prefix), JobQueue.connect(own_redis.url, prefix)
    admin = redis.Redis.from_url(own_redis.url)
    settings = _worker_settings(train_settings, prefix, tmp_path, max_attempts=1)  # a second run would be refused
    worker = RecordingWorker(settings, queue, console=False)
    job = observer.submit(JobSpec(name="full", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                                  data=train_settings.data, params=train_settings.params)).job_id
    real_publish = pub.publish

    def publish_then_fill_redis(*args, **kwargs):  # Redis refuses writes (OOM under noeviction) from here on
        path = real_publish(*args, **kwargs)
        admin.config_set("maxmemory", 1)
        return path

    monkeypatch.setattr(pub, "publish", publish_then_fill_redis)
    finished: list[int] = []
    thread = threading.Thread(target=lambda: finished.append(worker.run(max_jobs=1)), daemon=True)
    thread.start()
    try:
        _wait(lambda: worker.ended, 300, "the job to run")
        assert worker.ended[0] == (job, False)  # no outcome: Redis refused it
        status = observer.status(job)
        assert not status.terminal and observer.pending() == 1, status  # so the entry was not acked either
        assert (tmp_path / "store" / "acme" / "full").is_dir()

        admin.config_set("maxmemory", 0)
        thread.join(timeout=120)
        assert finished == [1]
        status = observer.status(job)
        assert status.state == "ready" and status.attempts == 1, status  # finished on redelivery, not trained again
        assert observer.pending() == 0 and observer.holder(job) is None
    finally:
        admin.config_set("maxmemory", 0)
        worker.shutdown()
        thread.join(timeout=30)
        queue.close()
        observer.close()
        admin.close()
