"""The record of a clone in flight and the one Redis hash that lists them, so every gateway's
watcher finds them without walking every tenant; updates never re-create a finished record."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from gateway.tenants import redis_errors

__all__ = ["CloneIndex", "CloneRecord"]


@dataclass
class CloneRecord:
    """A clone whose job has not been seen to its end yet (one field of the clones hash)."""

    job_id: str
    tenant_id: str
    name: str
    voice_id: str
    submitted_at: float
    started_at: float | None = None  # when a watcher first saw the job running (ETA, training minutes)
    deleted: bool = False  # the voice was deleted: wait for the job to stop, then clean up

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> CloneRecord:
        data = json.loads(raw)
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


# KEYS: the clones hash. ARGV: job id, record. Never brings back a record another process dropped.
_UPDATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class CloneIndex:
    """The clones hash, through the training queue's Redis client (sync: call it in a thread)."""

    def __init__(self, redis, key: str) -> None:
        self._redis = redis
        self.key = key
        self._update = redis.register_script(_UPDATE)

    def put(self, record: CloneRecord) -> None:
        """Add a new clone."""
        with redis_errors():
            self._redis.hset(self.key, record.job_id, record.to_json())

    def update(self, record: CloneRecord) -> bool:
        """Replace a clone's record if it is still there (False: it was finished meanwhile)."""
        with redis_errors():
            return bool(self._update(keys=[self.key], args=[record.job_id, record.to_json()]))

    def get(self, job_id: str) -> CloneRecord | None:
        with redis_errors():
            raw = self._redis.hget(self.key, job_id)
        return CloneRecord.from_json(raw) if raw else None

    def all(self) -> list[CloneRecord]:
        with redis_errors():
            raws = self._redis.hvals(self.key)
        return [CloneRecord.from_json(raw) for raw in raws]

    def drop(self, job_id: str) -> bool:
        """Remove the record; True for the one caller that removed it."""
        with redis_errors():
            return bool(self._redis.hdel(self.key, job_id))
