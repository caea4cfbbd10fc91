"""A trainer's /health and /metrics: the verdict (Redis gone past its grace, a job that stopped
reporting progress), what the metrics count, and a real `voicering train-worker` process serving
both on its internal port against the session's real Redis (tests/fixtures/trainer.py).

(The Redis outage during a real training job is in test_jobs_recovery.py, which runs one anyway.)
"""

from __future__ import annotations

import json
import time

import pytest

from lora_training.health import TrainerHealth
from lora_training.jobs import JobQueue
from lora_training.metrics import TrainerMetrics
from lora_training.pipeline import JobSpec
from tests.fixtures.probes import http_get, metric_samples

OWN_WORKERS = 1  # a trainer's validation worker, if a job gets that far (tests/fixtures/fleet.py)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_job_without_progress_past_the_stall_limit_fails_the_verdict():
    clock = Clock()
    health = TrainerHealth(stall_s=60, redis_grace_s=30, clock=clock)
    assert health.verdict().ok  # idle, nothing known to be wrong
    health.job_started("j1")
    clock.now += 59
    assert health.verdict().ok
    health.progressed(step=3)
    clock.now += 59
    assert health.verdict().ok, "progress restarts the stall clock"
    clock.now += 2
    verdict = health.verdict()
    assert not verdict.ok and verdict.job.job_id == "j1" and verdict.job.step == 3
    assert verdict.problems == ("job j1 has reported no progress for 61 s (stall limit 60 s)",)
    assert verdict.to_dict()["job"] == {"id": "j1", "running_s": 120.0, "since_progress_s": 61.0, "step": 3}
    health.job_ended("ready")
    assert health.verdict().ok and health.verdict().job is None


def test_redis_failing_past_its_grace_fails_the_verdict_and_a_success_clears_it():
    clock = Clock()
    health = TrainerHealth(stall_s=60, redis_grace_s=30, clock=clock)
    health.redis_failed("Connection refused")
    clock.now += 29
    first = health.verdict()
    assert first.ok and not first.redis_ok, "an outage shorter than the grace is lived through"
    health.redis_failed("Connection refused")  # failing again does not restart the outage's clock
    clock.now += 1
    verdict = health.verdict()
    assert not verdict.ok
    assert verdict.problems == ("the queue's Redis has been unreachable for 30 s (Connection refused)",)
    assert verdict.to_dict()["redis"] == "unreachable"
    health.redis_ok()
    assert health.verdict().ok and health.verdict().redis_ok


def test_the_metrics_count_steps_and_outcomes_once_each():
    clock = Clock()
    health, metrics = TrainerHealth(stall_s=60, redis_grace_s=30, clock=clock), TrainerMetrics()
    health.listen(metrics)
    health.job_started("j1")
    for step in (5, 6, 7, 7, 9):  # a resumed job reports from step 5; a repeated report adds nothing
        health.progressed(step=step)
    health.progressed()  # a report outside training (no step)
    clock.now += 42
    health.job_ended("retry")
    health.job_ended("interrupted")  # only the first word about a job counts
    values = metric_samples(metrics.render())
    assert values[("voicering_trainer_steps_total", ())] == 4
    assert values[("voicering_trainer_jobs_total", (("outcome", "retry"),))] == 1
    assert values[("voicering_trainer_jobs_total", (("outcome", "interrupted"),))] == 0
    assert values[("voicering_trainer_job_running", ())] == 0
    assert values[("voicering_trainer_job_duration_seconds_sum", ())] == 42
    assert values[("voicering_trainer_last_progress_timestamp_seconds", ())] > time.time() - 60


def test_settings_refuse_limits_that_cannot_work():
    with pytest.raises(ValueError):
        TrainerHealth(stall_s=0, redis_grace_s=30)


def test_a_train_worker_serves_health_and_counts_the_job_it_ran(trainer, redis_url, tmp_path):
    url, prefix, proc = trainer.url, trainer.prefix, trainer.proc
    status, body = http_get(f"{url}/health")
    assert status == 200, body
    assert json.loads(body) == {"ok": True, "problems": [], "redis": "ok", "job": None}
    queue = JobQueue.connect(redis_url, prefix)
    try:  # a job whose upload is not there: the trainer takes it and it fails at once, for good
        job_id = queue.submit(JobSpec(name="missing", tenant="acme", audio=[str(tmp_path / "gone.wav")])).job_id
        deadline = time.monotonic() + 120
        while True:  # the reader refreshes every 0.2 s here
            values = metric_samples(http_get(f"{url}/metrics")[1])
            if values.get(("voicering_trainer_queue_jobs", (("state", "failed_last_hour"),))) == 1:
                break
            assert time.monotonic() < deadline, trainer.log_tail()
            time.sleep(0.2)
        assert queue.status(job_id).state == "failed"
    finally:
        queue.close()
    assert values[("voicering_trainer_jobs_total", (("outcome", "failed"),))] == 1
    assert values[("voicering_trainer_job_running", ())] == 0
    assert values[("voicering_trainer_redis_up", ())] == 1
    assert values[("voicering_trainer_queue_jobs", (("state", "queued"),))] == 0
    assert values[("voicering_trainer_queue_oldest_queued_age_seconds", ())] == 0
    assert http_get(f"{url}/health")[0] == 200
    assert http_get(f"{url}/anything")[0] == 404
    assert proc.poll() is None
