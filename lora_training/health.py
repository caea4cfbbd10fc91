"""Whether a trainer process is doing its work: it can reach the queue's Redis, and the job it runs
still makes progress. What `/health` answers (lora_training.health_server) and the trainer's
Prometheus metrics (lora_training.metrics) both read from one `TrainerHealth`.

A trainer's job loop is synchronous and may sit in one step for a long time, so it cannot answer
a probe itself: it tells `TrainerHealth` what happens (a job started, progressed, ended; the queue
read or failed), and the health server's own thread asks for the verdict. A process that is
alive but stuck (a hung step, Redis gone for good) then fails its liveness probe and is
restarted; its job goes back to the queue by its lease, as if the trainer had crashed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HealthVerdict", "RunningJob", "TrainerHealth", "TrainerListener"]


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: str
    started_at: float  # monotonic
    last_progress_at: float  # monotonic: the job's start, then its last progress report
    step: int | None  # the last training step reported (None before training)


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    ok: bool
    problems: tuple[str, ...]  # each a sentence an operator reads in the probe's answer
    redis_ok: bool  # False while the queue's Redis is failing, within the grace too
    job: RunningJob | None
    at: float  # monotonic: when it was judged

    def to_dict(self) -> dict:
        job, now = self.job, self.at
        return {"ok": self.ok, "problems": list(self.problems), "redis": "ok" if self.redis_ok else "unreachable",
                "job": None if job is None else {"id": job.job_id, "running_s": round(now - job.started_at, 1),
                                                 "since_progress_s": round(now - job.last_progress_at, 1),
                                                 "step": job.step}}


class TrainerHealth:
    """Thread-safe record of what the trainer did; `verdict` judges it.

    ``stall_s``: a running job with no progress report for this long is a stalled trainer.
    ``redis_grace_s``: the queue's Redis failing for this long (no success since) is unhealthy;
    a shorter outage is what the trainer lives through by itself (it retries with backoff).
    Listeners (the metrics) hear each event as it is recorded.
    """

    def __init__(self, *, stall_s: float, redis_grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if stall_s <= 0 or redis_grace_s <= 0:
            raise ValueError("stall_s and redis_grace_s must be > 0")
        self.stall_s, self.redis_grace_s, self._clock = stall_s, redis_grace_s, clock
        self._lock = threading.Lock()
        self._job: RunningJob | None = None
        self._redis_failing_since: float | None = None
        self._redis_error = ""
        self._listeners: list[TrainerListener] = []

    def listen(self, listener: TrainerListener) -> None:
        self._listeners.append(listener)

    # -- what the trainer tells -------------------------------------------------------------------

    def job_started(self, job_id: str) -> None:
        now = self._clock()
        with self._lock:
            self._job = RunningJob(job_id, now, now, None)
        for listener in self._listeners:
            listener.job_started(job_id)

    def progressed(self, step: int | None = None) -> None:
        """A progress report of the running job (`step`: the training step, when training)."""
        with self._lock:
            job = self._job
            if job is None:
                return
            previous = job.step
            self._job = RunningJob(job.job_id, job.started_at, self._clock(), step if step is not None else job.step)
        # steps since the last report; the first one reported counts from there (a resumed job starts
        # past its checkpoint)
        steps = step - previous if step is not None and previous is not None and step > previous else 0
        for listener in self._listeners:
            listener.progressed(steps)

    def job_ended(self, outcome: str) -> None:
        """The running job left this trainer: ready, failed, cancelled (recorded), retry, handed_back,
        lease_lost, unrecorded (its outcome write failed; it is finished when re-claimed) or
        interrupted (the run ended with no outcome told). Only the first word of a job counts."""
        with self._lock:
            job, self._job = self._job, None
        if job is None:  # told already
            return
        for listener in self._listeners:
            listener.job_ended(outcome, self._clock() - job.started_at)

    def redis_ok(self) -> None:
        with self._lock:
            self._redis_failing_since, self._redis_error = None, ""

    def redis_failed(self, error: str) -> None:
        with self._lock:
            if self._redis_failing_since is None:
                self._redis_failing_since = self._clock()
            self._redis_error = error

    # -- what the probe asks ------------------------------------------------------------------------

    def verdict(self) -> HealthVerdict:
        now = self._clock()
        with self._lock:
            job, failing_since, error = self._job, self._redis_failing_since, self._redis_error
        problems = []
        redis_ok = failing_since is None or now - failing_since < self.redis_grace_s
        if not redis_ok:
            problems.append(f"the queue's Redis has been unreachable for {now - failing_since:.0f} s ({error})")
        if job is not None and now - job.last_progress_at >= self.stall_s:
            problems.append(f"job {job.job_id} has reported no progress for {now - job.last_progress_at:.0f} s "
                            f"(stall limit {self.stall_s:.0f} s)")
        return HealthVerdict(not problems, tuple(problems), failing_since is None, job, now)


class TrainerListener:
    """What hears a trainer's events as they happen (the metrics); every method may be left as is."""

    def job_started(self, job_id: str) -> None:
        """A job started on this trainer."""

    def progressed(self, steps: int) -> None:
        """A progress report; `steps`: training steps run since the last one."""

    def job_ended(self, outcome: str, seconds: float) -> None:
        """The running job left this trainer (`TrainerHealth.job_ended`'s outcomes), after `seconds`."""
