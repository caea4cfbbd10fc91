"""A trainer's Prometheus metrics, in a registry of its own (one per process, nothing global).

Two kinds: what this trainer did (jobs by outcome, training steps, the job it runs, when it last
made progress), heard from `TrainerHealth` as it happens; and the training queue as this trainer
last read it (jobs queued and running, how long the oldest has waited, failures in the last hour),
set by the health server's reader every few seconds. Every trainer exports the queue figures, so
rules aggregate them with `max` across trainers, not `sum`.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lora_training.health import TrainerListener
from lora_training.queue_view import QueueView

__all__ = ["OUTCOMES", "TrainerMetrics"]

PREFIX = "voicering_trainer"
OUTCOMES = ("ready", "failed", "cancelled", "retry", "handed_back", "lease_lost", "unrecorded", "interrupted")
_JOB_BUCKETS = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400)


class TrainerMetrics(TrainerListener):
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.jobs = Counter(f"{PREFIX}_jobs", "Jobs that left this trainer, by outcome: ready, failed, cancelled "
                            "(recorded), retry (back to the queue for another attempt), handed_back (the trainer "
                            "stopped), lease_lost, unrecorded (the outcome write failed), interrupted (the run ended with no "
                            "outcome)", ["outcome"], registry=r)
        self.job_seconds = Histogram(f"{PREFIX}_job_duration_seconds", "Wall time of a job on this trainer, any "
                                     "outcome", buckets=_JOB_BUCKETS, registry=r)
        self.steps = Counter(f"{PREFIX}_steps", "Training steps run on this trainer", registry=r)
        self.running = Gauge(f"{PREFIX}_job_running", "1 while this trainer runs a job", registry=r)
        self.last_progress = Gauge(f"{PREFIX}_last_progress_timestamp_seconds", "Unix time of this trainer's last "
                                   "job start or progress report", registry=r)
        self.redis_up = Gauge(f"{PREFIX}_redis_up", "1 when this trainer's last read of the queue's Redis worked",
                              registry=r)
        self.queue_jobs = Gauge(f"{PREFIX}_queue_jobs", "Jobs of the training queue by state (queued, running, "
                                "failed_last_hour), as this trainer last read it", ["state"], registry=r)
        self.queue_oldest = Gauge(f"{PREFIX}_queue_oldest_queued_age_seconds", "How long the oldest queued job "
                                  "has waited (0 with none queued), as this trainer last read it", registry=r)
        for outcome in OUTCOMES:
            self.jobs.labels(outcome)
        for state in ("queued", "running", "failed_last_hour"):
            self.queue_jobs.labels(state)

    # -- TrainerListener ----------------------------------------------------------------------------

    def job_started(self, job_id: str) -> None:
        self.running.set(1)
        self.last_progress.set(time.time())

    def progressed(self, steps: int) -> None:
        if steps:
            self.steps.inc(steps)
        self.last_progress.set(time.time())

    def job_ended(self, outcome: str, seconds: float) -> None:
        self.running.set(0)
        self.jobs.labels(outcome if outcome in OUTCOMES else "unrecorded").inc()
        self.job_seconds.observe(seconds)

    # -- the health server's reader ---------------------------------------------------------------

    def queue_read(self, view: QueueView) -> None:
        self.redis_up.set(1)
        self.queue_jobs.labels("queued").set(len(view.queued))
        self.queue_jobs.labels("running").set(len(view.running))
        self.queue_jobs.labels("failed_last_hour").set(len(view.failed_recent))
        self.queue_oldest.set(view.oldest_queued_age_s or 0.0)

    def queue_failed(self) -> None:
        self.redis_up.set(0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
