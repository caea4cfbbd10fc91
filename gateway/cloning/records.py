"""The record of a clone in flight and the one Redis hash that lists them, so every gateway's
watcher finds them without walking every tenant; updates never re-create a finished record.
A record that does not parse is logged (once per index) and skipped, never fatal to a reader."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.tenants import redis_errors

if TYPE_CHECKING:
    from lora_training.jobs import JobStatus

__all__ = ["BadRecord", "CloneIndex", "CloneRecord", "training_minutes"]

log = logging.getLogger(__name__)


class BadRecord(ValueError):
    """A clones-hash value that is not a CloneRecord (hand-edited, written by another version)."""


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
    warming_since: float | None = None  # when a watcher moved the voice to warming (the warming deadline)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> CloneRecord:
        """Parse one clones-hash value; BadRecord unless it is a record with fields of the right types."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, absurd nesting
            raise BadRecord(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise BadRecord("not a JSON object")
        for name, kinds in _FIELD_TYPES.items():
            value = data.get(name)
            if name in _REQUIRED and value is None:
                raise BadRecord(f"no {name}")
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) != (kinds is bool)):
                raise BadRecord(f"{name} is a {type(value).__name__}")
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if data.get(f.name) is not None})


_REQUIRED = frozenset({"job_id", "tenant_id", "name", "voice_id", "submitted_at"})
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "job_id": str, "tenant_id": str, "name": str, "voice_id": str, "submitted_at": (int, float),
    "started_at": (int, float), "deleted": bool, "warming_since": (int, float),
}


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
        self._reported: set[str] = set()  # malformed records already logged

    def put(self, record: CloneRecord) -> None:
        """Add a new clone."""
        with redis_errors():
            self._redis.hset(self.key, record.job_id, record.to_json())

    def update(self, record: CloneRecord) -> bool:
        """Replace a clone's record if it is still there (False: it was finished meanwhile)."""
        with redis_errors():
            return bool(self._update(keys=[self.key], args=[record.job_id, record.to_json()]))

    def get(self, job_id: str) -> CloneRecord | None:
        """The job's record; None when there is none, or when it is malformed (logged)."""
        with redis_errors():
            raw = self._redis.hget(self.key, job_id)
        return self._parsed(job_id, raw) if raw else None

    def all(self) -> list[CloneRecord]:
        """Every well-formed record; a malformed one is logged once and left for an operator."""
        with redis_errors():
            raws = self._redis.hgetall(self.key)
        parsed = (self._parsed(job_id, raw) for job_id, raw in raws.items())
        return [record for record in parsed if record is not None]

    def _parsed(self, job_id: str | bytes, raw: str | bytes) -> CloneRecord | None:
        try:
            return CloneRecord.from_json(raw)
        except BadRecord as exc:
            shown = job_id.decode(errors="replace") if isinstance(job_id, bytes) else job_id
            if shown not in self._reported:
                self._reported.add(shown)
                log.warning("clone record %r in %s is malformed (%s): skipped; remove it with `HDEL %s %s` once "
                            "its voice is settled", shown[:80], self.key, exc, self.key, shown[:80])
            return None

    def drop(self, job_id: str) -> bool:
        """Remove the record; True for the one caller that removed it."""
        with redis_errors():
            return bool(self._redis.hdel(self.key, job_id))


def training_minutes(record: CloneRecord, status: JobStatus | None) -> float:
    """Wall-clock minutes a job ran on trainers: from when it was first seen running (else its
    submission) to its last update; nothing for a job no trainer ever took."""
    if status is None or status.attempts == 0:
        return 0.0
    started = record.started_at or status.created_at or record.submitted_at
    ended = status.updated_at or time.time()
    minutes = max(0.0, ended - started) / 60.0
    return minutes if math.isfinite(minutes) else 0.0
