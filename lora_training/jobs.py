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

A trainer's writes are fenced by its lock token (a Lua script writes only while the lock holds
that token), and so is publishing: `Lease.fence_publish` checks the token, extends the lock and
records the token in the job hash in one script, right before the voice is renamed into place.
Each trainer also keeps its own monotonic clock on the lease (`Lease.expired`), so a trainer cut
off from Redis knows when its lock may have passed to another trainer.

Records do not outlive their use: a final job's hash, index entry and stream entry are deleted
together (`delete`, one script that leaves a job alone while it is not final or its lock is
held): by the gateway with the voice, and by the trainers for every job final longer than
`TrainSettings.job_record_keep_s` (`trim`, oldest first, a bounded batch per call). The hash holds
the job's spec (file names, the consent phrase), so keeping it is keeping creator data.

Submitting (hash + index + stream entry) and cancelling (state check + write) are one script each,
and so is finishing: the outcome (ready, cancelled, failed) is written and the entry acked together
(`finish`), so an entry is never acked without its outcome; a job left without one anyway (an
older trainer, a trimmed stream) is an orphan that `reconcile` ends, once nobody holds or owes it.
XAUTOCLAIM scans at most 10 pending entries per call, so `next` follows its cursor across calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from lora_training.errors import InfrastructureError, JobExistsError, LeaseLost
from lora_training.pipeline import TERMINAL, JobSpec

if TYPE_CHECKING:
    import redis

GROUP = "trainers"
TRIM_SCAN = 500  # jobs one `trim` call looks at (oldest first); a trainer trims every JOB_TRIM_EVERY_S

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# KEYS: job hash, lock. ARGV: token, field, value, ... Writes only while the lock holds the token.
_FENCED_HSET = """
if redis.call('get', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('hset', KEYS[1], unpack(ARGV, 2))
return 1
"""
# KEYS: lock, job hash. ARGV: token, lease_ms, now. The last check before the publishing rename.
_FENCE_PUBLISH = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('pexpire', KEYS[1], ARGV[2])
redis.call('hset', KEYS[2], 'publish_token', ARGV[1], 'publish_at', ARGV[3], 'updated_at', ARGV[3])
return 1
"""
# owed(job hash, stream, group): whether the job's stream entry still has to reach a trainer or
# be acked by one (not yet delivered to the group, or pending). A job that is not terminal, whose
# lock nobody holds and whose entry is not owed will never be run by anyone: an orphan.
_OWED = """
local function later(a, b)
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local function undelivered(stream, group, entry)
  if redis.call('exists', stream) == 0 then return false end
  for _, g in ipairs(redis.call('xinfo', 'groups', stream)) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then return later(entry, info['last-delivered-id']) end
  end
  return true
end
local function owed(job, stream, group)
  local entry = redis.call('hget', job, 'entry_id')
  if not entry or redis.call('exists', stream) == 0 or #redis.call('xrange', stream, entry, entry) == 0 then
    return false
  end
  return undelivered(stream, group, entry) or #redis.call('xpending', stream, group, entry, entry, 1) > 0
end
"""
# KEYS: job hash, stream, index. ARGV: job id, spec, voice id, now, group, terminal states...
# An existing job blocks a resubmission only if it ended or its stream entry is still owed
# (pending, or not yet delivered); otherwise it is an orphan and is replaced.
_SUBMIT = _OWED + """
local state = redis.call('hget', KEYS[1], 'state')
if state then
  for i = 6, #ARGV do if state == ARGV[i] then return {'ended', state} end end
  if owed(KEYS[1], KEYS[2], ARGV[5]) then return {'owed', state} end
end
redis.call('del', KEYS[1])
local entry = redis.call('xadd', KEYS[2], '*', 'job_id', ARGV[1])
redis.call('hset', KEYS[1], 'spec', ARGV[2], 'voice_id', ARGV[3], 'state', 'queued', 'progress', 0,
           'message', 'waiting for a trainer', 'attempts', 0, 'created_at', ARGV[4], 'updated_at', ARGV[4],
           'entry_id', entry)
redis.call('zadd', KEYS[3], ARGV[4], ARGV[1])
return {'queued', entry}
"""
# KEYS: job hash, lock. ARGV: now, terminal states... A queued job nobody holds is cancelled here;
# a held one gets the request, which its trainer sees under the lock or on its next heartbeat.
_CANCEL = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
local state = redis.call('hget', KEYS[1], 'state') or ''
for i = 2, #ARGV do if state == ARGV[i] then return 1 end end
redis.call('hset', KEYS[1], 'cancel_requested', 1, 'updated_at', ARGV[1])
if (state == 'queued' or state == '') and redis.call('exists', KEYS[2]) == 0 then
  redis.call('hset', KEYS[1], 'state', 'cancelled', 'message', 'cancelled before it started')
end
return 1
"""
# KEYS: job hash, lock, stream. ARGV: token, group, entry id, field, value, ... A job's outcome and
# the ack of its stream entry in one step, only while the lock holds the token: an outcome that was
# not written is never acked, so the entry is re-claimed and the job finished by the next trainer.
_FINISH = """
if redis.call('get', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('hset', KEYS[1], unpack(ARGV, 4))
redis.call('xack', KEYS[3], ARGV[2], ARGV[3])
return 1
"""
# KEYS: job hash, lock, stream. ARGV: group, now, state, message, error code, error, terminal states...
# Ends an orphaned job (not terminal, unlocked, its entry not owed: nobody will ever run it) with
# the given outcome; any other job is left as it is. Returns the job's state after, or false.
_RECONCILE = _OWED + """
local state = redis.call('hget', KEYS[1], 'state')
if not state then return false end
for i = 7, #ARGV do if state == ARGV[i] then return state end end
if redis.call('exists', KEYS[2]) == 1 or owed(KEYS[1], KEYS[3], ARGV[1]) then return state end
redis.call('hset', KEYS[1], 'state', ARGV[3], 'message', ARGV[4], 'error_code', ARGV[5], 'error', ARGV[6],
           'updated_at', ARGV[2])
return ARGV[3]
"""
# KEYS: job hash, lock, stream, index. ARGV: job id, group, cutoff (unix s: the job must have ended
# before it; 0: any time), terminal states... Deletes a final job's hash, index entry and stream
# entry (acked first, so no pending reference is left), or an index entry whose hash is gone.
# A job not final, without a state, ended after the cutoff, or locked is left alone: returns 0.
_DELETE = """
if redis.call('exists', KEYS[2]) == 1 then return 0 end
if redis.call('exists', KEYS[1]) == 1 then
  local f = redis.call('hmget', KEYS[1], 'state', 'updated_at', 'entry_id')
  if not f[1] then return 0 end
  local final = false
  for i = 4, #ARGV do if f[1] == ARGV[i] then final = true end end
  if not final then return 0 end
  if tonumber(ARGV[3]) > 0 and (tonumber(f[2]) or 0) >= tonumber(ARGV[3]) then return 0 end
  if f[3] and redis.call('type', KEYS[3])['ok'] == 'stream' then
    redis.pcall('xack', KEYS[3], ARGV[2], f[3])
    redis.call('xdel', KEYS[3], f[3])
  end
  redis.call('del', KEYS[1])
end
redis.call('zrem', KEYS[4], ARGV[1])
return 1
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
        self._fenced_hset = client.register_script(_FENCED_HSET)
        self._fence_publish = client.register_script(_FENCE_PUBLISH)
        self._submit = client.register_script(_SUBMIT)
        self._cancel = client.register_script(_CANCEL)
        self._finish = client.register_script(_FINISH)
        self._reconcile = client.register_script(_RECONCILE)
        self._delete = client.register_script(_DELETE)
        self._group_ready = False
        self._claim_cursor = "0-0"  # where the next XAUTOCLAIM scan of the pending list starts

    @classmethod
    def connect(cls, url: str, prefix: str = "voicering:train", *, timeout_s: float = 30.0) -> JobQueue:
        """A queue on its own client; ``timeout_s``: the clock on one answer (a call whose answer does
        not come in it fails with InfrastructureError, and redis-py does not send it again)."""
        from hashring.redis_client import sync_client

        return cls(sync_client(url, decode_responses=True, socket_timeout=timeout_s), prefix)

    def close(self) -> None:
        self.redis.close()

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def lock_key(self, job_id: str) -> str:
        return f"{self.prefix}:lock:{job_id}"

    # -- producers and readers ------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobStatus:
        """Queue a job (hash, index and stream entry in one script). An orphaned hash is replaced."""
        with _mapped("submitting a job"):
            self._ensure_group()
            outcome, detail = self._submit(
                keys=[self.job_key(spec.job_id), self.stream, self.index],
                args=[spec.job_id, spec.model_dump_json(), spec.voice_id, time.time(), GROUP, *sorted(TERMINAL)])
        if outcome == "ended":
            raise JobExistsError(f"job {spec.job_id} already ended ({detail}): submit it with another job id")
        if outcome == "owed":
            raise JobExistsError(f"job {spec.job_id} is already queued or running ({detail}): "
                                 f"wait for it, or cancel it with `voicering jobs --cancel {spec.job_id}`")
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

    def update(self, job_id: str, *, token: str | None = None, **fields: object) -> None:
        """Write fields of a job's hash; with `token`, only while the job's lock holds it (else LeaseLost)."""
        values = {k: ("" if v is None else v) for k, v in fields.items()}
        values["updated_at"] = time.time()
        with _mapped("updating a job"):
            if token is None:
                self.redis.hset(self.job_key(job_id), mapping=values)
                return
            pairs = [x for kv in values.items() for x in kv]
            written = self._fenced_hset(keys=[self.job_key(job_id), self.lock_key(job_id)], args=[token, *pairs])
        if not written:
            raise LeaseLost(f"job {job_id}: lease lost; another trainer may own it now")

    def cancel(self, job_id: str) -> JobStatus | None:
        """Ask a job to stop: a queued job is cancelled at once, a running one at its next step."""
        with _mapped("cancelling a job"):
            self._cancel(keys=[self.job_key(job_id), self.lock_key(job_id)], args=[time.time(), *sorted(TERMINAL)])
        return self.status(job_id)

    def withdraw(self, job_id: str) -> bool:
        """Take back a submission its caller gave up on (its answer lost: the job may be queued all
        the same): a queued job is cancelled and its records deleted; one a trainer holds is asked to
        stop, and its records go with the trim once it has. True when nothing of the job is left."""
        self.cancel(job_id)
        return self.delete(job_id)

    def reconcile(self, job_id: str, state: str, *, message: str, error_code: str = "",
                  error: str = "") -> JobStatus | None:
        """End the job with `state` if it is an orphan: not terminal, its lock free, its stream entry
        neither undelivered nor pending, so no trainer will ever run or finish it (a trainer that
        acked without its outcome, an entry trimmed away). Any other job is left untouched."""
        if state not in TERMINAL:
            raise ValueError(f"reconcile needs a terminal state, not {state!r}")
        with _mapped("reconciling a job"):
            self._ensure_group()
            self._reconcile(keys=[self.job_key(job_id), self.lock_key(job_id), self.stream],
                            args=[GROUP, time.time(), state, message, error_code, error, *sorted(TERMINAL)])
        return self.status(job_id)

    def delete(self, job_id: str) -> bool:
        """Delete a final job's records (hash, index entry, stream entry); True when they are gone
        (or never were). A job still queued or running, or locked, is left as it is: False."""
        with _mapped("deleting a job"):
            return bool(self._delete(keys=self._record_keys(job_id), args=[job_id, GROUP, 0, *sorted(TERMINAL)]))

    def trim(self, keep_s: float, *, now: float | None = None, scan: int = TRIM_SCAN) -> int:
        """Delete the records of jobs that ended more than `keep_s` ago, looking at most at the `scan`
        oldest jobs created before then (older jobs first; call again for more). Returns how many
        were deleted. Jobs not final are left alone, however old."""
        cutoff = (time.time() if now is None else now) - keep_s
        deleted = 0
        with _mapped("trimming old jobs"):
            ids = self.redis.zrangebyscore(self.index, "-inf", f"({cutoff}", start=0, num=scan)
            for job_id in ids:
                deleted += self._delete(keys=self._record_keys(job_id), args=[job_id, GROUP, cutoff, *sorted(TERMINAL)])
        return deleted

    def _record_keys(self, job_id: str) -> list[str]:
        return [self.job_key(job_id), self.lock_key(job_id), self.stream, self.index]

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
        """An abandoned entry (idle past claim_idle_ms) if any, else a new one (waits up to block_ms).

        Each XAUTOCLAIM scans at most 10 pending entries from the saved cursor, so live jobs ahead
        of an abandoned one delay it by a few calls, never forever; the cursor wraps at 0-0.
        """
        import redis

        with _mapped("reading the job stream"):
            self._ensure_group()
            try:
                return self._claim(consumer, claim_idle_ms) or self._read(consumer, block_ms)
            except redis.ResponseError as err:
                if "NOGROUP" not in str(err):
                    raise
                self._group_ready, self._claim_cursor = False, "0-0"  # Redis restarted empty
                self._ensure_group()
                return self._read(consumer, block_ms)

    def _claim(self, consumer: str, claim_idle_ms: int) -> Delivery | None:
        reply = self.redis.xautoclaim(self.stream, GROUP, consumer, claim_idle_ms, start_id=self._claim_cursor, count=1)
        self._claim_cursor = reply[0]  # "0-0" once the scan reached the end: start over next time
        for entry_id, fields in reply[1]:
            if fields and fields.get("job_id"):
                return Delivery(entry_id, fields["job_id"], reclaimed=True)
            self.redis.xack(self.stream, GROUP, entry_id)  # entry deleted from the stream (Redis 6.2)
        return None

    def _read(self, consumer: str, block_ms: int) -> Delivery | None:
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

    def finish(self, delivery: Delivery, token: str, **fields: object) -> None:
        """Write the job's outcome and ack its entry in one step, only while the lock holds `token`
        (else LeaseLost, nothing written or acked). A Redis failure (InfrastructureError) leaves
        both undone: the entry stays pending and is re-claimed."""
        values = {k: ("" if v is None else v) for k, v in fields.items()}
        values["updated_at"] = time.time()
        pairs = [x for kv in values.items() for x in kv]
        with _mapped("recording a job's outcome"):
            done = self._finish(keys=[self.job_key(delivery.job_id), self.lock_key(delivery.job_id), self.stream],
                                args=[token, GROUP, delivery.entry_id, *pairs])
        if not done:
            raise LeaseLost(f"job {delivery.job_id}: lease lost before its outcome was recorded; "
                            "another trainer may own it now")

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

    def fence_publish(self, job_id: str, token: str, lease_ms: int) -> bool:
        """True (lock extended, token recorded as the publisher) only while the lock holds `token`."""
        with _mapped("fencing a publish"):
            return bool(self._fence_publish(keys=[self.lock_key(job_id), self.job_key(job_id)],
                                            args=[token, lease_ms, time.time()]))


class Lease:
    """This trainer's hold on one job's lock, with its own monotonic clock on the expiry.

    Redis starts the PX countdown no earlier than a request is sent, so the lease is counted from
    the send time of the last acquire, renewal or publish fence that succeeded: after `lease_ms`
    without one, another trainer may hold the lock, whatever this trainer could not hear.
    """

    def __init__(self, queue: JobQueue, job_id: str, token: str, lease_ms: int) -> None:
        self.queue, self.job_id, self.token, self.lease_ms = queue, job_id, token, lease_ms
        self._valid_until = 0.0  # time.monotonic()

    def acquire(self) -> bool:
        return self._held_since(time.monotonic(), self.queue.acquire(self.job_id, self.token, self.lease_ms))

    def renew(self) -> bool:
        return self._held_since(time.monotonic(), self.queue.renew(self.job_id, self.token, self.lease_ms))

    def release(self) -> None:
        self._valid_until = 0.0
        self.queue.release(self.job_id, self.token)

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._valid_until

    def update(self, **fields: object) -> None:
        """A fenced write to the job's hash (LeaseLost once another trainer holds the lock)."""
        self.queue.update(self.job_id, token=self.token, **fields)

    def finish(self, delivery: Delivery, **fields: object) -> None:
        """The job's outcome written and its entry acked in one fenced step (`JobQueue.finish`)."""
        self.queue.finish(delivery, self.token, **fields)

    def fence_publish(self) -> None:
        """Raise LeaseLost unless this trainer still holds the job; called right before publishing."""
        sent = time.monotonic()
        if self.expired or not self._held_since(sent, self.queue.fence_publish(self.job_id, self.token, self.lease_ms)):
            raise LeaseLost(f"job {self.job_id}: lease lost before publishing; another trainer may own it now")

    def _held_since(self, sent: float, held: bool) -> bool:
        if held:
            self._valid_until = sent + self.lease_ms / 1000.0
        return held


@contextmanager
def _mapped(doing: str) -> Iterator[None]:
    """Map redis-py errors to InfrastructureError at this boundary."""
    import redis

    try:
        yield
    except redis.RedisError as error:
        raise InfrastructureError(f"Redis failed while {doing}: {error}") from None


__all__ = ["GROUP", "TRIM_SCAN", "Delivery", "JobQueue", "JobStatus", "Lease"]
