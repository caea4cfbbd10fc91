"""Durable training jobs on Redis: a stream with a consumer group, a hash per job, a lease per job.

Keys (``P`` = settings.queue_prefix)::

    P:stream          stream of {job_id}; consumer group "trainers" delivers each entry to one trainer
    P:jobs            sorted set job_id -> created_at (listing)
    P:job:<id>        hash: spec (JSON), state, progress, message, error, step, total_steps, attempts...
    P:lock:<id>       lease lock: SET NX PX by the running trainer, renewed every lease_ms / 3

Delivery and crash recovery: a trainer reads new entries with XREADGROUP; an entry stays pending
until the job ends (XACK). While it runs, the trainer renews its lock and re-claims its own entry
(XCLAIM JUSTID), which keeps the entry's idle time near zero. A trainer that dies stops doing
both: after `lease_ms` its lock expires, after `claim_idle_ms` (>= lease_ms) any trainer's
XAUTOCLAIM takes the entry over, takes the lock, and runs the job again, which resumes from the
caches and the last checkpoint. The lock, not the stream, is what guarantees a job never runs
twice at once: a trainer that cannot take it leaves the entry alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from lora_training.errors import InfrastructureError
from lora_training.pipeline import TERMINAL, JobSpec

if TYPE_CHECKING:
    import redis

GROUP = "trainers"

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class JobStatus:
    """A job as other processes see it (the hash, parsed)."""

    job_id: str
    voice_id: str
    state: str
    progress: float
    message: str
    error: str
    error_code: str
    attempts: int
    step: int
    total_steps: int
    loss: str
    resumed_from_step: int
    consumer: str
    cancel_requested: bool
    created_at: float
    updated_at: float

    @classmethod
    def from_hash(cls, job_id: str, h: dict[str, str]) -> JobStatus:
        def num(key: str, kind=int):
            try:
                return kind(h.get(key) or 0)
            except ValueError:
                return kind(0)

        return cls(job_id, h.get("voice_id", ""), h.get("state", ""), num("progress", float), h.get("message", ""),
                   h.get("error", ""), h.get("error_code", ""), num("attempts"), num("step"), num("total_steps"),
                   h.get("loss", ""), num("resumed_from_step"), h.get("consumer", ""), h.get("cancel_requested") == "1",
                   num("created_at", float), num("updated_at", float))

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Delivery:
    """One stream entry handed to this trainer: fresh (XREADGROUP) or re-claimed (XAUTOCLAIM)."""

    entry_id: str
    job_id: str
    reclaimed: bool


class JobQueue:
    """The Redis side of training jobs. Redis errors surface as InfrastructureError (retryable)."""

    def __init__(self, client: redis.Redis, prefix: str = "voicering:train") -> None:
        self.redis = client
        self.prefix = prefix
        self.stream = f"{prefix}:stream"
        self.index = f"{prefix}:jobs"
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._group_ready = False

    @classmethod
    def connect(cls, url: str, prefix: str = "voicering:train") -> JobQueue:
        import redis

        return cls(redis.Redis.from_url(url, decode_responses=True, socket_timeout=30), prefix)

    def close(self) -> None:
        self.redis.close()

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def lock_key(self, job_id: str) -> str:
        return f"{self.prefix}:lock:{job_id}"

    # -- producers and readers ------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobStatus:
        now = time.time()
        with _mapped("submitting a job"):
            self._ensure_group()
            created = self.redis.hsetnx(self.job_key(spec.job_id), "spec", spec.model_dump_json())
            if not created:
                raise InfrastructureError(f"job {spec.job_id} already exists")
            self.redis.hset(self.job_key(spec.job_id), mapping={
                "voice_id": spec.voice_id, "state": "queued", "progress": 0, "message": "waiting for a trainer",
                "attempts": 0, "created_at": now, "updated_at": now,
            })
            self.redis.zadd(self.index, {spec.job_id: now})
            self.redis.xadd(self.stream, {"job_id": spec.job_id})
        return self.status(spec.job_id)

    def status(self, job_id: str) -> JobStatus | None:
        with _mapped("reading a job"):
            h = self.redis.hgetall(self.job_key(job_id))
        return JobStatus.from_hash(job_id, h) if h else None

    def spec(self, job_id: str) -> JobSpec | None:
        with _mapped("reading a job"):
            raw = self.redis.hget(self.job_key(job_id), "spec")
        return JobSpec.model_validate_json(raw) if raw else None

    def list(self, limit: int = 50) -> list[JobStatus]:
        with _mapped("listing jobs"):
            ids = self.redis.zrevrange(self.index, 0, limit - 1)
        return [s for s in (self.status(i) for i in ids) if s is not None]

    def update(self, job_id: str, **fields: object) -> None:
        values = {k: ("" if v is None else v) for k, v in fields.items()}
        values["updated_at"] = time.time()
        with _mapped("updating a job"):
            self.redis.hset(self.job_key(job_id), mapping=values)

    def cancel(self, job_id: str) -> JobStatus | None:
        """Ask a job to stop: a queued job is cancelled at once, a running one at its next step."""
        status = self.status(job_id)
        if status is None or status.terminal:
            return status
        self.update(job_id, cancel_requested=1)
        if status.state == "queued" and self.acquire(job_id, "canceller", 5_000):
            try:
                self.update(job_id, state="cancelled", message="cancelled before it started")
            finally:
                self.release(job_id, "canceller")
        return self.status(job_id)

    # -- consumers ------------------------------------------------------------------------------

    def _ensure_group(self) -> None:
        import redis

        if self._group_ready:
            return
        try:
            self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        self._group_ready = True

    def next(self, consumer: str, *, block_ms: int, claim_idle_ms: int) -> Delivery | None:
        """An abandoned entry (idle past claim_idle_ms) if any, else a new one (waits up to block_ms)."""
        with _mapped("reading the job stream"):
            self._ensure_group()
            reply = self.redis.xautoclaim(self.stream, GROUP, consumer, claim_idle_ms, start_id="0-0", count=1)
            for entry_id, fields in reply[1]:
                if fields and fields.get("job_id"):
                    return Delivery(entry_id, fields["job_id"], reclaimed=True)
                self.redis.xack(self.stream, GROUP, entry_id)  # entry deleted from the stream
            read = self.redis.xreadgroup(GROUP, consumer, {self.stream: ">"}, count=1, block=block_ms)
        for _, entries in read or []:
            for entry_id, fields in entries:
                return Delivery(entry_id, fields.get("job_id", ""), reclaimed=False)
        return None

    def touch(self, delivery: Delivery, consumer: str) -> None:
        """Reset the entry's idle time (this trainer is alive and still owns it)."""
        with _mapped("renewing a job"):
            self.redis.xclaim(self.stream, GROUP, consumer, 0, [delivery.entry_id], justid=True)

    def ack(self, delivery: Delivery) -> None:
        with _mapped("acknowledging a job"):
            self.redis.xack(self.stream, GROUP, delivery.entry_id)

    def pending(self) -> int:
        with _mapped("reading the job stream"):
            self._ensure_group()
            return int(self.redis.xpending(self.stream, GROUP)["pending"])

    # -- per-job lease lock ---------------------------------------------------------------------

    def acquire(self, job_id: str, token: str, lease_ms: int) -> bool:
        with _mapped("locking a job"):
            return bool(self.redis.set(self.lock_key(job_id), token, nx=True, px=lease_ms))

    def renew(self, job_id: str, token: str, lease_ms: int) -> bool:
        with _mapped("renewing a job lock"):
            return bool(self._renew(keys=[self.lock_key(job_id)], args=[token, lease_ms]))

    def release(self, job_id: str, token: str) -> None:
        with _mapped("unlocking a job"):
            self._release(keys=[self.lock_key(job_id)], args=[token])

    def holder(self, job_id: str) -> str | None:
        with _mapped("reading a job lock"):
            return self.redis.get(self.lock_key(job_id))


@contextmanager
def _mapped(doing: str) -> Iterator[None]:
    """Map redis-py errors to InfrastructureError at this boundary."""
    import redis

    try:
        yield
    except redis.RedisError as error:
        raise InfrastructureError(f"Redis failed while {doing}: {error}") from None


__all__ = ["GROUP", "Delivery", "JobQueue", "JobStatus"]
