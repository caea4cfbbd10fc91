"""Queue recovery on real redis-servers: abandoned entries behind many live ones are re-claimed
(XAUTOCLAIM's cursor is followed), submit replaces an orphaned job hash in one script and refuses
a live or ended one clearly, cancel decides under one script, and a train-worker lives through
Redis being killed and restarted under it and finishes the next job (its /health failing while
Redis is gone, its metrics counting the job that was lost and the one that ran)."""

import json
import threading
import time
import uuid

import pytest

from hashring.embedded import EmbeddedRedis
from lora_training.consumer import TrainWorker
from lora_training.errors import JobExistsError
from lora_training.health import TrainerHealth
from lora_training.health_server import HealthServer
from lora_training.jobs import GROUP, Delivery, JobQueue, Lease
from lora_training.metrics import TrainerMetrics
from lora_training.pipeline import JobSpec
from tests.fixtures.probes import http_get, metric_samples

OWN_WORKERS = 1  # a trainer's validation worker, if a job gets that far (tests/fixtures/fleet.py)

CLAIM_IDLE_MS = 300


def _spec(tmp_path, name: str, **extra) -> JobSpec:
    return JobSpec(name=name, tenant="acme", audio=[tmp_path / "take.wav"], **extra)


def _next_reclaimed(queue: JobQueue, calls: int) -> list[Delivery]:
    got = [queue.next("trainer-b", block_ms=10, claim_idle_ms=CLAIM_IDLE_MS) for _ in range(calls)]
    return [d for d in got if d is not None]


def test_an_abandoned_entry_behind_many_live_ones_is_reclaimed(queue, tmp_path):
    jobs = [queue.submit(_spec(tmp_path, f"v{i}")).job_id for i in range(16)]
    read = queue.redis.xreadgroup(GROUP, "live", {queue.stream: ">"}, count=100)
    deliveries = [Delivery(entry_id, fields["job_id"], False) for entry_id, fields in read[0][1]]
    assert [d.job_id for d in deliveries] == jobs
    time.sleep(CLAIM_IDLE_MS / 1000 + 0.1)
    for d in deliveries[:15]:  # 15 live trainers keep their entries fresh; the 16th trainer died
        queue.touch(d, "live")

    found = _next_reclaimed(queue, calls=3)  # each call scans at most 10 pending entries
    assert [(d.job_id, d.reclaimed) for d in found] == [(jobs[15], True)]

    time.sleep(CLAIM_IDLE_MS / 1000 + 0.1)  # now the first trainer dies too; the others stay alive
    for d in deliveries[1:15]:
        queue.touch(d, "live")
    queue.touch(found[0], "trainer-b")
    again = _next_reclaimed(queue, calls=4)  # the scan wraps round to the front of the pending list
    assert [d.job_id for d in again] == [jobs[0]]


def test_submit_replaces_an_orphaned_job_hash(queue, tmp_path):
    spec = _spec(tmp_path, "orphan")
    # what a submitter that died half-way left behind: the hash without a stream entry
    queue.redis.hset(queue.job_key(spec.job_id), mapping={"spec": spec.model_dump_json()})
    status = queue.submit(spec)
    assert status.state == "queued" and status.attempts == 0 and status.voice_id == "acme/orphan"
    delivery = queue.next("t", block_ms=100, claim_idle_ms=60_000)
    assert delivery.job_id == spec.job_id and queue.pending() == 1

    half = _spec(tmp_path, "half")  # hash written, XADD never happened
    queue.redis.hset(queue.job_key(half.job_id), mapping={"spec": half.model_dump_json(), "state": "queued"})
    assert queue.submit(half).state == "queued"
    assert queue.next("t", block_ms=100, claim_idle_ms=60_000).job_id == half.job_id
    assert [s.job_id for s in queue.list()] == [half.job_id, spec.job_id]


def test_submit_refuses_a_job_that_is_still_owed_or_already_ended(queue, tmp_path):
    spec = _spec(tmp_path, "twice")
    queue.submit(spec)
    with pytest.raises(JobExistsError, match="already queued or running"):
        queue.submit(spec)  # not yet delivered
    delivery = queue.next("t", block_ms=100, claim_idle_ms=60_000)
    with pytest.raises(JobExistsError, match="already queued or running"):
        queue.submit(spec)  # pending with a trainer
    queue.update(spec.job_id, state="ready")
    queue.ack(delivery)
    with pytest.raises(JobExistsError, match="already ended"):
        queue.submit(spec)
    assert queue.pending() == 0 and queue.redis.xlen(queue.stream) == 1


def test_cancel_never_overwrites_a_job_that_a_trainer_finishes_meanwhile(queue, tmp_path, monkeypatch):
    job = queue.submit(_spec(tmp_path, "race")).job_id
    trainer = JobQueue(queue.redis.__class__(connection_pool=queue.redis.connection_pool), prefix=queue.prefix)
    ran = []

    def a_trainer_takes_and_finishes_the_job() -> None:  # what process() does, start to end
        lease = Lease(trainer, job, "trainer:1", 10_000)
        if lease.acquire():
            status = trainer.status(job)
            if not status.terminal and not status.cancel_requested:
                lease.update(state="ready", message="voice is ready")
                ran.append(job)
            lease.release()

    real = queue.redis.execute_command
    first = []

    def interleaved(*args, **options):  # the trainer runs right after cancel's first read or write
        reply = real(*args, **options)
        if not first and args[0] != "SCRIPT LOAD":
            first.append(args[0])
            a_trainer_takes_and_finishes_the_job()
        return reply

    monkeypatch.setattr(queue.redis, "execute_command", interleaved)
    status = queue.cancel(job)
    monkeypatch.undo()
    assert status.state == ("ready" if ran else "cancelled")
    assert not ran  # the cancel was decided in one step: the trainer found it cancelled


@pytest.fixture
def own_redis():
    server = EmbeddedRedis().start()
    yield server
    server.stop()


class RecordingWorker(TrainWorker):
    """A TrainWorker that notes when each delivery's processing ended and how."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[tuple[str, bool, float]] = []

    def process(self, delivery: Delivery) -> bool:
        try:
            outcome = super().process(delivery)
        except BaseException:
            self.ended.append((delivery.job_id, False, time.monotonic()))
            raise
        self.ended.append((delivery.job_id, outcome, time.monotonic()))
        return outcome


def test_a_train_worker_lives_through_a_redis_restart_and_finishes_the_next_job(
        own_redis, uploads, train_settings, tmp_path):
    lease_ms = 1500
    prefix = f"restart-{uuid.uuid4().hex[:6]}"
    queue, observer = JobQueue.connect(own_redis.url, prefix), JobQueue.connect(own_redis.url, prefix)
    settings = train_settings.model_copy(update={
        "queue_prefix": prefix, "consumer": "t", "lease_ms": lease_ms, "claim_idle_ms": lease_ms, "block_ms": 200,
        "retry_max_s": 1.0, "adapter_store": tmp_path / "store"})
    long = train_settings.params.model_copy(update={"max_steps": 500, "save_steps": 500})
    first = observer.submit(JobSpec(name="long", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest,
                                    data=train_settings.data, params=long)).job_id
    # its health record and internal port, as `train-worker --health-port` has them (1 s of grace here)
    health, metrics = TrainerHealth(stall_s=600, redis_grace_s=1.0), TrainerMetrics()
    health.listen(metrics)
    server = HealthServer(health, metrics, JobQueue.connect(own_redis.url, prefix), host="127.0.0.1", port=0,
                          refresh_s=0.2).start()
    probe = f"http://127.0.0.1:{server.port}"
    worker = RecordingWorker(settings, queue, console=False, health=health)
    finished: list[int] = []
    thread = threading.Thread(target=lambda: finished.append(worker.run(max_jobs=1)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while not ((s := observer.status(first)).state == "training" and s.step >= 1):
            assert time.monotonic() < deadline and thread.is_alive(), "training never started"
            time.sleep(0.1)
        own_redis.kill()
        cut = time.monotonic()
        while not worker.ended:
            assert time.monotonic() - cut < lease_ms / 1000 + 10, "the job kept running without Redis"
            time.sleep(0.05)
        job_id, outcome, at = worker.ended[0]
        assert job_id == first and outcome is False and at - cut < lease_ms / 1000 + 10
        deadline = time.monotonic() + 30
        while (answer := http_get(f"{probe}/health"))[0] != 503:  # once past the grace the probe says why
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        assert thread.is_alive() and not finished  # the worker kept failing to reach Redis meanwhile
        body = answer[1]
        assert json.loads(body)["redis"] == "unreachable", body
        assert "the queue's Redis has been unreachable" in json.loads(body)["problems"][0]
        lost = metric_samples(http_get(f"{probe}/metrics")[1])
        assert lost[("voicering_trainer_redis_up", ())] == 0 and lost[("voicering_trainer_job_running", ())] == 0
        assert lost[("voicering_trainer_steps_total", ())] >= 1
        assert sum(v for (name, labels), v in lost.items() if name == "voicering_trainer_jobs_total") == 1

        own_redis.start()  # empty, like a Redis without persistence after a crash
        second = observer.submit(JobSpec(name="short", tenant="acme", audio=uploads.audio,
                                         transcripts=uploads.manifest, data=train_settings.data,
                                         params=train_settings.params)).job_id
        thread.join(timeout=300)
        assert finished == [1]
        status = observer.status(second)
        assert status.state == "ready" and status.attempts == 1 and status.consumer == "t"
        assert (tmp_path / "store" / "acme" / "short").is_dir()
        assert not (tmp_path / "store" / "acme" / "long").exists()
        deadline = time.monotonic() + 10
        while http_get(f"{probe}/health")[0] != 200:  # the reader's next read clears it
            assert time.monotonic() < deadline, http_get(f"{probe}/health")
            time.sleep(0.1)
        after = metric_samples(http_get(f"{probe}/metrics")[1])
        assert after[("voicering_trainer_jobs_total", (("outcome", "ready"),))] == 1
        assert after[("voicering_trainer_redis_up", ())] == 1
    finally:
        server.close()
        queue.close()
        observer.close()

