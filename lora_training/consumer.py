"""A trainer process: takes jobs from the queue, one at a time, and runs them under a lease.

For each delivery: skip it if the job is finished or cancelled; take the job's lock (or leave
the entry to whoever holds it); run `pipeline.run_job` while a heartbeat thread renews the lock,
keeps the stream entry fresh and watches for a cancel request; then record the outcome:

- ready / cancelled / failed (not retryable, or out of attempts): state written and entry acked
  in one fenced step (`Lease.finish`). If that step fails (Redis unreachable), neither happened:
  the entry stays pending, is re-claimed after `claim_idle_ms`, and the job is finished then
  without running again (a voice this job already published is `ready` at once; a cancel
  requested meanwhile is `cancelled` at once);
- a non-retryable failure of a job whose cancel was requested (its uploads deleted with its
  voice, say) is recorded as `cancelled`;
- retryable failure with attempts left: state back to queued, entry left pending, so any
  trainer re-claims it after `claim_idle_ms`;
- lease lost: nothing written (another trainer may own the job now);
- the trainer itself stopping (`shutdown`, on SIGTERM): state back to queued, that attempt not
  counted, lock released, entry left pending; the next trainer resumes from the checkpoints.

Once an outcome is recorded (the job is final), its trainer removes what the job left on disk:
checkpoints, its caches, staged copies, empty staging folders (`cleanup.clean_job`); never while
the job can still be retried.

Every JOB_TRIM_EVERY_S, between jobs, a trainer deletes the records of jobs that ended more than
`job_record_keep_s` ago (`JobQueue.trim`): Redis runs without eviction, and a job's spec holds
creator data.

Every write while a job runs is fenced by the lock token, and so is publishing. A trainer that
cannot renew for `lease_ms` by its own clock stops the job itself (LeaseLost), since by then the
lock may have passed to another trainer. Redis failures outside a job (reading the queue,
recording an outcome) are logged and retried with capped exponential backoff: the process lives
through a Redis restart. A SIGKILLed trainer writes nothing at all; its entry goes idle and its
lock expires, which is the same path as a retryable failure.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid

from lora_training.cleanup import clean_job, clip_cache_keys
from lora_training.errors import InfrastructureError, JobStopped, LeaseLost, TrainerStopping, TrainingError
from lora_training.health import TrainerHealth
from lora_training.jobs import Delivery, JobQueue, Lease
from lora_training.pipeline import TERMINAL, JobSpec, JobState, phase_percent, published_by, run_job
from lora_training.publish import Sampler
from lora_training.settings import TrainSettings
from lora_training.stop import Stop

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5
CANCEL_POLL_S = 1.0  # a running job's cancel request is read this often (the lease renews every lease_ms / 3)
BACKOFF_FIRST_S = 0.5  # first wait after a Redis failure; doubles up to TrainSettings.retry_max_s
LIVE_JOBS_SCANNED = 200  # newest jobs checked for sharing a final job's clip cache (an older live one re-preprocesses)
JOB_TRIM_EVERY_S = 600.0  # how often a trainer deletes the records of jobs final past job_record_keep_s


class RedisReporter:
    """Fenced writes of a job's running state and progress (progress throttled); silent once stopped.

    A failed write is logged and dropped: the next one carries the news, and whether this trainer
    still owns the job is the heartbeat's call, by the lease. A refused write (the lock holds
    another token) stops the job with LeaseLost. Terminal states are not written here: the
    trainer records the outcome together with the ack (`TrainWorker._finish`).
    """

    def __init__(self, lease: Lease, stop: Stop, health: TrainerHealth | None = None) -> None:
        self.lease, self.stop, self.health = lease, stop, health
        self._last = 0.0

    def state(self, state: JobState, message: str = "") -> None:
        if state in TERMINAL:
            return
        fields: dict[str, object] = {"state": state, "message": message}
        if state in ("preprocessing", "training", "validating", "publishing"):
            fields["progress"] = phase_percent(state, 0.0)
        self._write(fields)

    def progress(self, percent: float, message: str = "", **fields: object) -> None:
        if self.health is not None:  # every report, before the throttle: the stall clock and the step count
            step = fields.get("step")
            self.health.progressed(step if isinstance(step, int) else None)
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S and percent < 100.0:
            return
        self._last = now
        self._write({"progress": percent, "message": message, **fields})

    def _write(self, fields: dict[str, object]) -> None:
        if self.stop.requested:
            return
        try:
            self.lease.update(**fields)
        except LeaseLost as err:
            self.stop.set(err)
            raise
        except InfrastructureError as err:
            log.warning("job %s: progress not recorded: %s", self.lease.job_id, err.message)


class Heartbeat:
    """Renews the lease every lease_ms / 3 and re-claims the entry; turns cancel or loss into a stop.

    The cancel request is read every CANCEL_POLL_S, apart from the renewals: with the default 30 s
    lease a creator would otherwise wait up to 10 s before the job even looked.

    A second thread watches the lease by this trainer's clock, because a renewal can hang on a
    cut connection for longer than the lease itself.
    """

    def __init__(self, queue: JobQueue, lease: Lease, delivery: Delivery, consumer: str, stop: Stop) -> None:
        self.queue, self.lease, self.delivery, self.consumer, self.stop = queue, lease, delivery, consumer, stop
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._renew, name=f"heartbeat-{delivery.job_id}", daemon=True),
                         threading.Thread(target=self._watch, name=f"lease-watch-{delivery.job_id}", daemon=True)]

    def __enter__(self) -> Heartbeat:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for thread in self._threads:  # a renewal hung on a cut connection is left to time out (daemon)
            thread.join(timeout=self.lease.lease_ms / 1000.0)

    def _renew(self) -> None:
        job_id = self.delivery.job_id
        renew_every_s = self.lease.lease_ms / 3000.0
        renew_at = time.monotonic() + renew_every_s
        while not self._done.wait(min(CANCEL_POLL_S, renew_every_s)):
            try:
                if time.monotonic() >= renew_at:
                    if not self.lease.renew():
                        self.stop.set(LeaseLost(f"job {job_id}: lease lost; another trainer may own it now"))
                        return
                    self.queue.touch(self.delivery, self.consumer)
                    renew_at = time.monotonic() + renew_every_s
                status = self.queue.status(job_id)
                if status is not None and status.cancel_requested:
                    self.stop.set(JobStopped(f"job {job_id} was cancelled"))
            except TrainingError as err:  # Redis unreachable: the watch thread ends the job when the lease is gone
                log.warning("heartbeat for job %s failed: %s", job_id, err.message)

    def _watch(self) -> None:
        period_s = min(self.lease.lease_ms / 10_000.0, 0.25)
        while not self._done.wait(period_s):
            if self.lease.expired:
                self.stop.set(LeaseLost(f"job {self.delivery.job_id}: no lease renewal for {self.lease.lease_ms} ms "
                                        "(Redis unreachable?); another trainer may own it now"))
                return


class TrainWorker:
    """Consumes the training queue. One job at a time per process."""

    def __init__(self, settings: TrainSettings, queue: JobQueue, *, sampler: Sampler | None = None,
                 console: bool = True, health: TrainerHealth | None = None) -> None:
        self.settings = settings
        self.health = health  # told each job's start, progress and outcome (`/health`, the metrics)
        self.queue = queue
        self.sampler = sampler
        self.console = console
        self.consumer = settings.consumer or f"{socket.gethostname()}:{os.getpid()}"
        self._stop_event = threading.Event()
        self._running: Stop | None = None  # the job in progress

    def shutdown(self) -> None:
        """Stop soon (a signal handler may call it): take no new job, and hand the running one back
        to the queue at its next step, unfinished attempts not counted, its checkpoints kept."""
        self._stop_event.set()
        running = self._running
        if running is not None:
            running.set(TrainerStopping("its trainer stopped (SIGTERM); it resumes from its last checkpoint on the "
                                        "next trainer"))

    def run(self, *, max_jobs: int | None = None, stop_event: threading.Event | None = None) -> int:
        """Process deliveries until max_jobs jobs ran to an outcome (or stop_event is set, or `shutdown`)."""
        if stop_event is not None:
            self._stop_event = stop_event
        stop_event = self._stop_event
        finished = failures = 0
        trimmed_at = -math.inf  # monotonic time of the last trim: the first round trims
        while (max_jobs is None or finished < max_jobs) and not stop_event.is_set():
            try:
                if time.monotonic() - trimmed_at >= JOB_TRIM_EVERY_S:
                    self._trim()
                    trimmed_at = time.monotonic()
                delivery = self.queue.next(self.consumer, block_ms=self.settings.block_ms,
                                           claim_idle_ms=self.settings.claim_idle_ms)
                if delivery is not None and self.process(delivery):
                    finished += 1
                failures = 0
            except TrainingError as err:  # Redis down or restarting: wait, then carry on
                failures += 1
                delay = min(BACKOFF_FIRST_S * 2 ** (failures - 1), self.settings.retry_max_s)
                log.warning("training queue failed (%s); retrying in %.1f s", err.message, delay)
                stop_event.wait(delay)
        return finished

    def _trim(self) -> None:
        """Delete the records of jobs final for longer than job_record_keep_s (Redis errors propagate:
        the loop's backoff)."""
        deleted = self.queue.trim(self.settings.job_record_keep_s)
        if deleted:
            log.info("deleted the records of %d jobs final for over %.0f h", deleted,
                     self.settings.job_record_keep_s / 3600)

    def process(self, delivery: Delivery) -> bool:
        """Run one delivery; True when the job reached an outcome here (ran, failed or was skipped as done)."""
        queue, job_id = self.queue, delivery.job_id
        status = queue.status(job_id)
        spec = queue.spec(job_id)
        if status is None or spec is None or status.terminal:
            queue.ack(delivery)
            if spec is not None and status is not None:  # redelivered after its trainer stopped before cleaning
                self._clean(spec)
            return False
        lease = Lease(queue, job_id, f"{self.consumer}:{uuid.uuid4().hex[:8]}", self.settings.lease_ms)
        if not lease.acquire():
            log.info("job %s is locked by %s; leaving it", job_id, queue.holder(job_id))
            return False
        try:
            status = queue.status(job_id)  # re-read under the lock
            if status is None or status.terminal:
                queue.ack(delivery)
                return False
            if published_by(self.settings.adapter_store, spec.voice_id, job_id) is not None:
                # an earlier attempt published the voice but its outcome was not recorded
                return self._finish(delivery, lease, spec, state="ready", progress=100.0,
                                    message=f"voice '{spec.voice_id}' is ready")
            if status.cancel_requested:
                return self._finish(delivery, lease, spec, state="cancelled", message="cancelled before it started")
            attempts = status.attempts + 1
            if attempts > self.settings.max_attempts:
                return self._finish(delivery, lease, spec, state="failed", error_code="attempts",
                                    error=f"gave up after {self.settings.max_attempts} attempts; last: "
                                          f"{status.error or status.message}")
            lease.update(attempts=attempts, consumer=self.consumer,
                         message="re-claimed from a stopped trainer" if delivery.reclaimed else "started")
            return self._run(delivery, spec, lease, attempts)
        except LeaseLost as err:  # an outcome write was refused: the job is another trainer's now
            log.warning("%s", err.message)
            return False
        finally:
            try:
                lease.release()
            except TrainingError as err:  # the lock expires by itself
                log.warning("cannot release job %s: %s", job_id, err.message)

    def _finish(self, delivery: Delivery, lease: Lease, spec: JobSpec, *, keys: frozenset[str] | None = None,
                **outcome: object) -> bool:
        """Record a terminal outcome and ack the entry in one step; True once both happened, and then
        the job's files are removed (`_clean`; `keys`: its clip-cache keys, read while its uploads existed).

        When Redis fails here neither happened: the entry stays pending and is re-claimed (by
        any trainer, this one included) after claim_idle_ms, and `process` finishes the job then.
        LeaseLost (the lock passed to another trainer) propagates: that trainer finishes it."""
        try:
            lease.finish(delivery, **outcome)
        except InfrastructureError as err:
            log.warning("job %s: outcome %s not recorded (%s); its entry stays pending and the job is "
                        "finished when it is re-claimed", delivery.job_id, outcome.get("state"), err.message)
            self._ended("unrecorded")
            return False
        self._ended(str(outcome["state"]))
        self._clean(spec, keys)
        return True

    def _ended(self, outcome: str) -> None:
        """Tell the health record how the running job left; outside a run (a job found done) nothing ran."""
        if self.health is not None and self._running is not None:
            self.health.job_ended(outcome)

    def _clean(self, spec: JobSpec, keys: frozenset[str] | None = None) -> None:
        """Remove a final job's checkpoints, caches and staged copies; a failure here is logged, never
        the job's (its outcome is recorded already)."""
        try:
            live = [s for s in (self.queue.spec(st.job_id) for st in self.queue.list(LIVE_JOBS_SCANNED)
                                if not st.terminal and st.job_id != spec.job_id) if s is not None]
        except TrainingError as err:  # Redis down: keep every clip set whose key is in doubt
            log.warning("job %s: cannot list live jobs (%s); its clip cache is kept", spec.job_id, err.message)
            live, keys = [], frozenset()
        try:
            done = clean_job(spec, self.settings, keys=keys, live=live)
        except Exception:  # cleanup must never cost the trainer its loop
            log.exception("job %s: cleaning its files failed", spec.job_id)
            return
        if done.removed or done.kept:
            log.info("job %s is final: removed %d paths and %d cached frames%s", spec.job_id, len(done.removed),
                     done.frames, f"; kept {', '.join(done.kept)} (another job needs it)" if done.kept else "")

    def _run(self, delivery: Delivery, spec: JobSpec, lease: Lease, attempts: int) -> bool:
        stop = Stop()
        self._running = stop
        if self.health is not None:
            self.health.job_started(delivery.job_id)
        if self._stop_event.is_set():  # shutdown came between the claim and here
            self.shutdown()
        try:
            return self._outcome(delivery, spec, lease, attempts, stop)
        finally:
            self._ended("interrupted")  # no outcome was told (a refused outcome write, an error outside the job)
            self._running = None

    def _cancel_requested(self, job_id: str) -> bool:
        try:
            status = self.queue.status(job_id)
        except TrainingError:
            return False
        return status is not None and status.cancel_requested

    def _outcome(self, delivery: Delivery, spec: JobSpec, lease: Lease, attempts: int, stop: Stop) -> bool:
        queue, job_id = self.queue, delivery.job_id
        keys = clip_cache_keys(spec, self.settings)  # now, while its uploads exist (a deleted voice takes them)
        try:
            with Heartbeat(queue, lease, delivery, self.consumer, stop):
                run_job(spec, self.settings, RedisReporter(lease, stop, self.health), stop=stop, sampler=self.sampler,
                        console=self.console, fence=lease.fence_publish,
                        on_resume=lambda step: lease.update(resumed_from_step=step))
        except LeaseLost as err:
            log.warning("%s", err.message)
            self._ended("lease_lost")
            return False
        except TrainerStopping as err:  # back to the queue; the entry stays pending for the next trainer
            self._ended("handed_back")
            lease.update(state="queued", attempts=attempts - 1, error=None, message=err.message)
            log.info("job %s handed back to the queue: %s", job_id, err.message)
            return False
        except JobStopped as err:
            return self._finish(delivery, lease, spec, keys=keys, state="cancelled", message=err.message)
        except TrainingError as err:
            if err.detail:  # the library's own words stay here: the job record and the API get `message`
                log.info("job %s: %s (%s)", job_id, err.message, err.detail)
            if not err.retryable and self._cancel_requested(job_id):  # e.g. its uploads went with its voice
                log.info("job %s was cancelled while it failed: %s", job_id, err.message)
                return self._finish(delivery, lease, spec, keys=keys, state="cancelled",
                                    message="cancelled while it ran", error=err.message, error_code=err.code)
            if err.retryable and attempts < self.settings.max_attempts:
                self._ended("retry")
                lease.update(state="queued", error=err.message, error_code=err.code,
                             message=f"attempt {attempts} failed ({err.message}); will retry")
                return False
            return self._finish(delivery, lease, spec, keys=keys, state="failed", error=err.message,
                                error_code=err.code, message=err.message)
        except Exception as err:  # a bug or a library failure: record it, retry like an infrastructure error
            log.exception("job %s failed unexpectedly", job_id)
            message = f"internal error: {type(err).__name__}: {err}"
            if attempts < self.settings.max_attempts:
                self._ended("retry")
                lease.update(state="queued", error=message, error_code="internal",
                             message=f"attempt {attempts} failed; will retry")
                return False
            return self._finish(delivery, lease, spec, keys=keys, state="failed", error=message,
                                error_code="internal", message=message)
        return self._finish(delivery, lease, spec, keys=keys, state="ready", progress=100.0,
                            message=f"voice '{spec.voice_id}' is ready")
