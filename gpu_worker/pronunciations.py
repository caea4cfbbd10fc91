"""The worker's view of tenants' pronunciation dictionaries: read from Redis by reference, kept in a
bounded cache keyed by version.

The gateway resolves a request's dictionary names to references (`protocol.PronunciationRef`: the
tenant's dictionaries hash, the name, the version it saw) and the worker fetches each one it does
not hold at that version: `HGET key name`, the stored form `{"name", "version", "rules"}` that the
gateway's tenant layer writes (`gateway.tenants.pronunciations`). A replaced dictionary has a new
version (a hash of its rules), so the next request names a version the cache does not hold and
reads the new rules: no invalidation message to lose. A dictionary replaced between the gateway's
look-up and the worker's read is read as it is now (the newer rules), and cached under the version
it carries. One deleted meanwhile ends the context with `pronunciation_not_found`.

Bounded: at most `capacity` dictionaries (least recently used dropped first), each at most
`MAX_RULES` rules; one fetch per (key, name, version) at a time, however many contexts ask.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import redis.asyncio as aioredis
import redis.exceptions

from gpu_worker.errors import PronunciationNotFound, PronunciationsUnavailable
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.protocol import PronunciationRef
from gpu_worker.text.dictionary import Dictionary, InvalidDictionary, merge

__all__ = ["DEFAULT_CAPACITY", "PronunciationCache"]

log = logging.getLogger(__name__)

DEFAULT_CAPACITY: Final = 64  # dictionaries held; ~256 KiB stored form at most each (the gateway's bound)

_Key = tuple[str, str, str]  # (redis key, name, version)


class PronunciationCache:
    """Dictionaries by (key, name, version), fetched from Redis on a miss. Owns its client (`aclose`)."""

    def __init__(self, redis: aioredis.Redis, capacity: int = DEFAULT_CAPACITY,
                 metrics: WorkerMetrics | None = None) -> None:
        if capacity < 1:
            raise ValueError("the pronunciation cache holds at least one dictionary")
        self._redis = redis
        self.capacity = capacity
        self._held: OrderedDict[_Key, Dictionary] = OrderedDict()
        self._fetching: dict[_Key, asyncio.Future[Dictionary]] = {}
        self.hits = 0
        self.misses = 0
        self._metrics = metrics

    def __len__(self) -> int:
        return len(self._held)

    async def dictionary(self, refs: Sequence[PronunciationRef]) -> Dictionary | None:
        """The rules of `refs` as one dictionary (the first named wins), None for none."""
        found = [await self.get(ref) for ref in refs]
        try:
            return merge(found)
        except InvalidDictionary as exc:  # the gateway checks the sum too: only a race gets here
            raise PronunciationsUnavailable(str(exc)) from None

    async def get(self, ref: PronunciationRef) -> Dictionary:
        key = (ref.key, ref.name, ref.version)
        held = self._held.get(key)
        if held is not None:
            self._held.move_to_end(key)
            self.hits += 1
            if self._metrics is not None:
                self._metrics.pronunciation_lookups.labels("hit").inc()
            return held
        pending = self._fetching.get(key)
        if pending is not None:  # another context's read brings it: not a read of its own
            if self._metrics is not None:
                self._metrics.pronunciation_lookups.labels("hit").inc()
            return await asyncio.shield(pending)
        self.misses += 1
        if self._metrics is not None:
            self._metrics.pronunciation_lookups.labels("miss").inc()
        future: asyncio.Future[Dictionary] = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            dictionary, version = await self._fetch(ref)
            self._put((ref.key, ref.name, version), dictionary)
            if version != ref.version:  # replaced since the gateway looked: the newer rules
                log.info("pronunciation dictionary %r changed after the request was routed (version %s, asked %s); "
                         "using the newer rules", ref.name, version, ref.version)
            future.set_result(dictionary)
            return dictionary
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        except BaseException:  # cancelled: whoever waits on it asks again
            future.cancel()
            raise
        finally:
            del self._fetching[key]

    def _put(self, key: _Key, dictionary: Dictionary) -> None:
        self._held[key] = dictionary
        self._held.move_to_end(key)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)
        if self._metrics is not None:
            self._metrics.pronunciations_held.set(len(self._held))

    async def _fetch(self, ref: PronunciationRef) -> tuple[Dictionary, str]:
        try:
            raw = await self._redis.hget(ref.key, ref.name)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise PronunciationsUnavailable(f"pronunciation dictionary {ref.name!r} could not be read: Redis is "
                                            f"unreachable ({type(exc).__name__}); try again", retryable=True) from None
        except redis.exceptions.RedisError as exc:
            log.error("reading pronunciation dictionary %r failed: %r", ref.name, exc)
            raise PronunciationsUnavailable(f"pronunciation dictionary {ref.name!r} could not be read "
                                            "(the worker's log has Redis's reply)", retryable=False) from None
        if raw is None:
            raise PronunciationNotFound(f"pronunciation dictionary {ref.name!r} was deleted; "
                                        "list yours with GET /v1/pronunciations")
        try:
            record = json.loads(raw)
            dictionary = Dictionary.from_json(record)
        except (ValueError, TypeError, InvalidDictionary, RecursionError) as exc:
            log.error("pronunciation dictionary %r in Redis is damaged: %s", ref.name, exc)
            raise PronunciationsUnavailable(f"pronunciation dictionary {ref.name!r} is damaged in the store; "
                                            "replace it (PUT /v1/pronunciations/{name})") from None
        return dictionary, dictionary.version

    async def aclose(self) -> None:
        await self._redis.aclose()
