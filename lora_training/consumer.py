"""A trainer process: takes jobs from the queue, one at a time, and runs them under a lease.

For each delivery: skip it if the job is finished or cancelled; take the job's lock (or leave
the entry to whoever holds it); run `pipeline.run_job` while a heartbeat thread renews the lock,
keeps the stream entry fresh and watches for a cancel request; then record the outcome:

- ready / cancelled / failed (not retryable, or out of attempts): state written, entry acked;
- retryable failure with attempts left: state back to queued, entry left pending, so any
  trainer re-claims it after `claim_idle_ms`;
- lease lost: nothing written (another trainer may own the job now).

A SIGKILLed trainer writes nothing at all; its entry goes idle and its lock expires, which is
the same path as a retryable failure.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from lora_training.errors import JobStopped, LeaseLost, TrainingError
from lora_training.jobs import Delivery, JobQueue
from lora_training.pipeline import JobState, phase_percent, run_job
from lora_training.publish import Sampler
from lora_training.settings import TrainSettings
from lora_training.stop import Stop

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5


class RedisReporter:
    """Writes a job's state and progress into its hash (progress throttled); silent once stopped."""

    def __init__(self, queue: JobQueue, job_id: str, stop: Stop) -> None:
        self.queue, self.job_id, self.stop = queue, job_id, stop
        self._last = 0.0

    def state(self, state: JobState, message: str = "") -> None:
        if self.stop.requested:
            return
        fields: dict[str, object] = {"state": state, "message": message}
        if state in ("preprocessing", "training", "validating", "publishing"):
            fields["progress"] = phase_percent(state, 0.0)
        if state == "ready":
            fields["progress"] = 100.0
        self.queue.update(self.job_id, **fields)

    def progress(self, percent: float, message: str = "", **fields: object) -> None:
        now = time.monotonic()
        if self.stop.requested or (now - self._last < PROGRESS_EVERY_S and percent < 100.0):
            return
        self._last = now
        self.queue.update(self.job_id, progress=percent, message=message, **fields)


class Heartbeat:
    """Renews the lock and the stream entry every lease_ms / 3; turns cancel requests into a stop."""

    def __init__(self, queue: JobQueue, delivery: Delivery, consumer: str, token: str, lease_ms: int, stop: Stop) -> None:
        self.queue, self.delivery, self.consumer, self.token = queue, delivery, consumer, token
        self.lease_ms, self.stop = lease_ms, stop
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{delivery.job_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        job_id = self.delivery.job_id
        while not self._done.wait(self.lease_ms / 3000.0):
            try:
                if not self.queue.renew(job_id, self.token, self.lease_ms):
                    self.stop.set(LeaseLost(f"job {job_id}: lease lost; another trainer may own it now"))
                    return
                self.queue.touch(self.delivery, self.consumer)
                status = self.queue.status(job_id)
                if status is not None and status.cancel_requested:
                    self.stop.set(JobStopped(f"job {job_id} was cancelled"))
            except TrainingError as err:  # Redis unreachable: keep trying until the lease is gone
                log.warning("heartbeat for job %s failed: %s", job_id, err)


class TrainWorker:
    """Consumes the training queue. One job at a time per process."""

    def __init__(self, settings: TrainSettings, queue: JobQueue, *, sampler: Sampler | None = None,
                 console: bool = True) -> None:
        self.settings = settings
        self.queue = queue
        self.sampler = sampler
        self.console = console
        self.consumer = settings.consumer or f"{socket.gethostname()}:{os.getpid()}"

    def run(self, *, max_jobs: int | None = None, stop_event: threading.Event | None = None) -> int:
        """Process deliveries until max_jobs jobs ran to an outcome (or stop_event is set)."""
        finished = 0
        while (max_jobs is None or finished < max_jobs) and not (stop_event and stop_event.is_set()):
            try:
                delivery = self.queue.next(self.consumer, block_ms=self.settings.block_ms,
                                           claim_idle_ms=self.settings.claim_idle_ms)
            except TrainingError as err:
                log.warning("cannot read the queue: %s", err)
                time.sleep(self.settings.block_ms / 1000.0)
                continue
            if delivery is not None and self.process(delivery):
                finished += 1
        return finished

    def process(self, delivery: Delivery) -> bool:
        """Run one delivery; True when the job reached an outcome here (ran, failed or was skipped as done)."""
        queue, job_id = self.queue, delivery.job_id
        status = queue.status(job_id)
        spec = queue.spec(job_id)
        if status is None or spec is None or status.terminal:
            queue.ack(delivery)
            return False
        token = f"{self.consumer}:{uuid.uuid4().hex[:8]}"
        if not queue.acquire(job_id, token, self.settings.lease_ms):
            log.info("job %s is locked by %s; leaving it", job_id, queue.holder(job_id))
            return False
        try:
            status = queue.status(job_id)  # re-read under the lock
            if status is None or status.terminal:
                queue.ack(delivery)
                return False
            if status.cancel_requested:
                queue.update(job_id, state="cancelled", message="cancelled before it started")
                queue.ack(delivery)
                return True
            attempts = status.attempts + 1
            if attempts > self.settings.max_attempts:
                queue.update(job_id, state="failed", error_code="attempts",
                             error=f"gave up after {self.settings.max_attempts} attempts; last: {status.error or status.message}")
                queue.ack(delivery)
                return True
            queue.update(job_id, attempts=attempts, consumer=self.consumer,
                         message="re-claimed from a stopped trainer" if delivery.reclaimed else "started")
            return self._run(delivery, spec, token, attempts)
        finally:
            queue.release(job_id, token)

    def _run(self, delivery: Delivery, spec, token: str, attempts: int) -> bool:
        queue, job_id = self.queue, delivery.job_id
        stop = Stop()
        reporter = RedisReporter(queue, job_id, stop)
        try:
            with Heartbeat(queue, delivery, self.consumer, token, self.settings.lease_ms, stop):
                run_job(spec, self.settings, reporter, stop=stop, sampler=self.sampler, console=self.console,
                        on_resume=lambda step: queue.update(job_id, resumed_from_step=step))
        except LeaseLost as err:
            log.warning("%s", err)
            return False
        except JobStopped as err:
            queue.update(job_id, state="cancelled", message=err.message)
            queue.ack(delivery)
            return True
        except TrainingError as err:
            if err.retryable and attempts < self.settings.max_attempts:
                queue.update(job_id, state="queued", error=err.message, error_code=err.code,
                             message=f"attempt {attempts} failed ({err.message}); will retry")
                return False
            queue.update(job_id, state="failed", error=err.message, error_code=err.code, message=err.message)
            queue.ack(delivery)
            return True
        except Exception as err:  # a bug or a library failure: record it, retry like an infrastructure error
            log.exception("job %s failed unexpectedly", job_id)
            message = f"internal error: {type(err).__name__}: {err}"
            if attempts < self.settings.max_attempts:
                queue.update(job_id, state="queued", error=message, error_code="internal",
                             message=f"attempt {attempts} failed; will retry")
                return False
            queue.update(job_id, state="failed", error=message, error_code="internal", message=message)
            queue.ack(delivery)
            return True
        queue.ack(delivery)
        return True
