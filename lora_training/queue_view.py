"""The training queue as an operator reads it (`voicering status`): queued jobs and how long the
oldest has waited, running jobs with their progress and whether a trainer still holds them, and
the jobs that failed recently. Pure data, read through `JobQueue`'s own API.

    jobs     = JobQueue.list(limit): the newest `limit` jobs (one hash read each)
    queued   = state "queued", oldest first; its age counts from submission (created_at)
    running  = preprocessing / training / validating / publishing, each with its lease holder
    failed   = state "failed", updated within `failed_window_s`
    pending  = stream entries delivered to a trainer and not acked yet (XPENDING)

The listing is newest first and bounded, so on a queue with more than `limit` jobs the oldest
are not read (`complete` is False): a job queued behind that many later ones is not seen.
Job times are the writers' wall clocks (time.time()), so ages are compared to this one's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from lora_training.jobs import JobQueue, JobStatus

__all__ = ["RUNNING", "QueueView", "RunningJob", "read_queue"]

RUNNING: Final = frozenset({"preprocessing", "training", "validating", "publishing"})


@dataclass(frozen=True, slots=True)
class RunningJob:
    status: JobStatus
    leased: bool  # a trainer holds its lease now; False: its trainer stopped, another re-claims it later


@dataclass(frozen=True, slots=True)
class QueueView:
    """One read of the training queue."""

    read_at: float  # wall clock of the read
    queued: tuple[JobStatus, ...]  # oldest first
    running: tuple[RunningJob, ...]  # oldest first
    failed_recent: tuple[JobStatus, ...]  # newest failure first
    failed_window_s: float
    pending_entries: int
    scanned: int  # jobs read
    complete: bool  # every job in the index was read (fewer than the limit)

    @property
    def oldest_queued_age_s(self) -> float | None:
        if not self.queued:
            return None
        return max(0.0, self.read_at - self.queued[0].created_at)


def read_queue(queue: JobQueue, *, limit: int = 500, failed_window_s: float = 3600.0) -> QueueView:
    """Read the queue once (blocking: run it in a thread from async code). Raises
    InfrastructureError when Redis fails."""
    if limit < 1 or failed_window_s <= 0:
        raise ValueError("limit must be >= 1 and failed_window_s > 0")
    jobs = queue.list(limit)
    pending = queue.pending()
    now = time.time()
    queued = sorted((j for j in jobs if j.state == "queued"), key=lambda j: j.created_at)
    running = [RunningJob(j, queue.holder(j.job_id) is not None)
               for j in sorted((j for j in jobs if j.state in RUNNING), key=lambda j: j.created_at)]
    failed = sorted((j for j in jobs if j.state == "failed" and now - j.updated_at <= failed_window_s),
                    key=lambda j: -j.updated_at)
    return QueueView(now, tuple(queued), tuple(running), tuple(failed), failed_window_s, pending, len(jobs),
                     len(jobs) < limit)
