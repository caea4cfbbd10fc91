"""The Redis seam: key layout, the calls (every change to membership and placement is one Lua
script of `hashring.scripts`, so it is atomic), and the mapping of redis-py errors to the ring's own (`RingUnavailable` when trying again can help,
`RingError` when it cannot).

Every change (join, leave, drain, undrain, a worker going silent or coming back, a replica count
set by an operator or by the autoscaler) runs as one Lua script that also increments the epoch and
publishes it. Times come from the Redis server clock (`TIME` inside the scripts), so workers and
readers on machines with skewed clocks still agree on who is alive.

Key layout (P = settings.prefix, "voicering:ring" by default):

    P:epoch        string  ring epoch, incremented on every change
    P:events       channel each new epoch is published here
    P:workers      hash    worker id -> WorkerInfo JSON
    P:heartbeats   zset    worker id -> last heartbeat (Redis server time, seconds)
    P:live         set     worker ids that heartbeat within the TTL
    P:draining     set     worker ids that take no new voices
    P:load         hash    worker id -> streams reported in its last heartbeat
    P:replicas     hash    voice id -> operator replica floor
    P:auto         hash    voice id -> automatic replica count (hot voices only)
    P:auto-raised  hash    voice id -> when the cool loop last raised that count (Redis time), until it
                           falls or is cleared: the scale-down hold, shared by every cool-lease holder
    P:heat:<hex>   string  decayed request counters of one voice, "<slow> <server time> <fast>", with a TTL;
                           <hex> is the voice id's UTF-8 bytes in hex, so any voice id is a safe key
    P:fleet        hash    the fleet's decayed request counters (slow, fast, since) and warm_at, the
                           fast counter value from which a voice is flagged warm
    P:warm         set     voices whose fast counter passed warm_at since the cool loop last looked
    P:spills       hash    voice id -> requests that landed past its owners since the cool loop last looked
    P:voices       zset    voice id -> when it was last requested (Redis time): the index `voicering status`
                           ranks voices from; requests older than the heat TTL and the oldest past
                           MAX_INDEXED_VOICES drop out
    P:outcome:<hex> hash   decayed (short window) counts of one voice's starts that were served past its
                           owners (spill) or refused by a worker (refusal), and since; with a TTL
    P:resident     hash    worker id -> JSON list of the voices whose adapters it holds, from its heartbeats
    P:lock:<name>  string  a lease (`acquire_lock`): the holder's random token, with a PX expiry;
                           "cool" is the autoscaler's, so one process of the fleet cools at a time
    P:presence     zset    "<kind>/<id>" of a gateway or agent server -> its last presence beat (Redis
                           server time); P:presence-info hash, the same member -> its JSON (`announce`)
    P:clock        hash    seen: Redis time of the last membership script; paused: seconds of outages
                           so far (gaps with no script longer than the outage gap); incarnation: a
                           random token set once, so a reader can tell Redis lost its data

Heartbeat times are on the ring clock, Redis time minus the outages so far (`paused`): it stands
still while nobody could write a heartbeat (Redis down, hung or refusing writes), so a worker is
reaped only after a TTL of silence during which it could have heartbeated. On Redis time, the
first reader after an outage longer than the TTL reaped the whole fleet and every reader's ring
emptied and refilled; a worker that died during an outage is reaped a TTL (less the silence it had
before the outage) after Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from hashring import scripts
from hashring.errors import RingBusy, RingError, RingUnavailable, UnknownWorker
from hashring.records import Snapshot, WorkerInfo, check_voice_id, check_worker_id
from hashring.redis_client import async_client, redact_url
from hashring.settings import RingSettings

__all__ = ["RingStore", "Subscription", "rate_of"]

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_WARM = 10_000  # voices flagged warm between two cool-loop ticks, at most (bounded memory)
MAX_INDEXED_VOICES = 10_000  # voices in the request index (P:voices), newest kept
MAX_RESIDENT_LISTED = 512  # voices one worker lists as resident (its newest), at most 128 KiB of ids
# A gap with no membership script (heartbeat, register, snapshot) longer than this share of the
# heartbeat TTL counts as an outage and stops the ring clock: live workers heartbeat every interval
# and readers refresh every refresh interval, so only an outage (or a fleet with no process at all)
# leaves such a gap. Shorter than TTL - interval, so an outage the clock ignores reaps nobody.
OUTAGE_GAP_FRACTION = 0.5

# Error replies that mean "not now" rather than "never": out of memory (noeviction), a primary
# turned replica by a failover, loading, a busy script, no quorum. The code is the first word of a
# Redis error reply; a Lua script's error wraps the reply ("Error running script ...: -OOM ..."), so
# it is also looked for after a '-'.
_TRANSIENT = re.compile(r"(?:^|-)(OOM|READONLY|LOADING|BUSY|MASTERDOWN|NOREPLICAS|MISCONF|TRYAGAIN|CLUSTERDOWN)\b")
# Of those, the replies that mean the connection reaches a server that is no longer the primary.
_DEMOTED = re.compile(r"(?:^|-)(READONLY|MASTERDOWN)\b")


class _Keys:
    def __init__(self, prefix: str) -> None:
        self.epoch = f"{prefix}:epoch"
        self.events = f"{prefix}:events"
        self.workers = f"{prefix}:workers"
        self.heartbeats = f"{prefix}:heartbeats"
        self.live = f"{prefix}:live"
        self.draining = f"{prefix}:draining"
        self.self_draining = f"{prefix}:draining-self"  # drains a worker started on its own shutdown
        self.load = f"{prefix}:load"
        self.replicas = f"{prefix}:replicas"
        self.auto = f"{prefix}:auto"
        self.auto_raised = f"{prefix}:auto-raised"
        self._heat = f"{prefix}:heat:"
        self.fleet = f"{prefix}:fleet"
        self.warm = f"{prefix}:warm"
        self.spills = f"{prefix}:spills"
        self.voices = f"{prefix}:voices"
        self._outcome = f"{prefix}:outcome:"
        self.resident = f"{prefix}:resident"
        self._lock = f"{prefix}:lock:"
        self.clock = f"{prefix}:clock"  # when Redis last answered, the outages so far, its incarnation
        self.presence = f"{prefix}:presence"
        self.presence_info = f"{prefix}:presence-info"

    def heat(self, voice: str) -> str:
        return self._heat + voice.encode("utf-8").hex()

    def outcome(self, voice: str) -> str:
        return self._outcome + voice.encode("utf-8").hex()

    def lock(self, name: str) -> str:
        return self._lock + name


class Subscription:
    """A pub/sub subscription to ring epochs. `next()` returns the next published epoch, or None
    when `timeout` passes first; it raises RingUnavailable when the connection is lost."""

    def __init__(self, store: RingStore, pubsub: aioredis.client.PubSub) -> None:
        self._store = store
        self._pubsub = pubsub

    async def next(self, timeout: float) -> int | None:
        msg = await self._store._call(self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout))
        if msg is None or msg.get("type") != "message":
            return None
        try:
            return int(msg["data"])
        except (TypeError, ValueError):  # not ours: anyone can publish on a channel
            log.warning("ignoring a message on %s that is not an epoch: %.60r", self._store.keys.events, msg["data"])
            return None

    async def aclose(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):  # closing a dead link
            await self._pubsub.aclose()


class RingStore:
    """All Redis I/O of hashring. Writers retry with backoff; reads try once (their callers keep
    serving the last ring and try again on the next refresh)."""

    def __init__(self, settings: RingSettings, client: aioredis.Redis | None = None) -> None:
        self._settings = settings
        self._where = redact_url(settings.redis_url)
        self._client = client or async_client(
            settings.redis_url,
            max_connections=settings.redis_max_connections,
            pool_wait_s=settings.redis_pool_wait_s,
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
            retry=Retry(NoBackoff(), 1),  # one quick reconnect (a pooled socket may be stale); the rest is ours
        )
        self._owns_client = client is None
        self.keys = _Keys(settings.prefix)
        script = self._client.register_script
        self._register, self._heartbeat = script(scripts.REGISTER), script(scripts.HEARTBEAT)
        self._deregister, self._drain = script(scripts.DEREGISTER), script(scripts.DRAIN)
        self._set_field, self._heat = script(scripts.SET_FIELD), script(scripts.HEAT)
        self._peek_heat, self._snapshot = script(scripts.PEEK_HEAT), script(scripts.SNAPSHOT)
        self._take_signals, self._add_outcomes = script(scripts.TAKE_SIGNALS), script(scripts.ADD_OUTCOMES)
        self._peek_outcomes = script(scripts.PEEK_OUTCOMES)
        self._swap_auto, self._raised_ages = script(scripts.SWAP_AUTO), script(scripts.RAISED_AGES)
        self._renew_lock, self._release_lock = script(scripts.RENEW_LOCK), script(scripts.RELEASE_LOCK)
        self._announce, self._present = script(scripts.ANNOUNCE), script(scripts.PRESENT)

    @property
    def settings(self) -> RingSettings:
        return self._settings

    @property
    def _outage_gap_s(self) -> float:
        return self._settings.heartbeat_ttl_s * OUTAGE_GAP_FRACTION

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> RingStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- error mapping and retries ----------------------------------------------------------------

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except redis.exceptions.MaxConnectionsError as exc:  # a ConnectionError, but Redis is not at fault
            raise RingBusy(f"this process is busy: {exc} (Redis at {self._where}); readers keep serving the last "
                           "ring they had. Raise redis_max_connections if this persists.") from exc
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise RingUnavailable(
                f"Redis at {self._where} is unreachable ({type(exc).__name__}); readers keep serving "
                f"the last ring they had. Check that Redis runs and that VOICERING_REDIS_URL points at it."
            ) from exc
        except redis.exceptions.RedisError as exc:
            refused = self._refused(exc)
            if _DEMOTED.search(str(exc)):
                await self._reconnect()
            raise refused from exc

    async def _reconnect(self) -> None:
        """Drop every pooled connection: the server that answered READONLY or MASTERDOWN was the
        primary when they were dialled and is a replica now (a failover). redis-py reconnects
        only on connection errors, so without this every call would go on reaching the demoted
        server; a new dial resolves the URL again (a Service, a DNS name, a failover endpoint)."""
        log.warning("Redis at %s is no longer the primary (failover?); reconnecting", self._where)
        with contextlib.suppress(Exception):
            await self._client.connection_pool.disconnect()

    def _refused(self, exc: redis.exceptions.RedisError) -> RingError:
        reply = str(exc)
        code = _TRANSIENT.search(reply)
        if code:
            return RingUnavailable(
                f"Redis at {self._where} refused the command ({code[1]}): {reply}. Readers keep serving the "
                f"last ring they had; check Redis memory (maxmemory) and that the URL names the primary.")
        return RingError(
            f"Redis at {self._where} answered an error: {reply}. Something other than voicering may have "
            f"written keys under {self._settings.prefix!r}; check them with redis-cli.")

    async def _write(self, make: Callable[[], Awaitable[T]]) -> T:
        policy = self._settings.retry
        for attempt in range(policy.attempts):
            try:
                return await self._call(make())
            except RingUnavailable:
                if attempt + 1 >= policy.attempts:
                    raise
                delay = policy.delay(attempt) * random.uniform(0.5, 1.0)
                log.warning("Redis write failed (attempt %d/%d); retrying in %.2fs",
                            attempt + 1, policy.attempts, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _unknown_worker(self, worker_id: str) -> UnknownWorker:
        known = sorted(k.decode() for k in await self._call(self._client.hkeys(self.keys.workers)))
        listing = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "") if known else "none"
        return UnknownWorker(
            f"worker {worker_id!r} is not registered (registered: {listing}); see `voicering ring status`"
        )

    # -- membership writes ------------------------------------------------------------------------

    async def register(self, info: WorkerInfo) -> int:
        """Add or replace a worker record and mark it alive; returns the new epoch. A drain flag
        set earlier by an operator stays in force across re-registration; one the worker set on
        its own shutdown and never cleared (it died while draining) does not: it is back."""
        k = self.keys
        return int(await self._write(lambda: self._register(
            keys=[k.workers, k.heartbeats, k.live, k.load, k.epoch, k.draining, k.self_draining, k.clock,
                  k.resident],
            args=[info.id, info.to_json(), k.events, self._outage_gap_s])))

    async def heartbeat(self, worker_id: str, load: int, resident: Sequence[str] | None = None) -> int:
        """Refresh a worker's heartbeat and load (one attempt), and with ``resident`` the voices whose
        adapters it holds (oldest first; its newest `MAX_RESIDENT_LISTED` are kept; None: unchanged).
        Returns -1 when the worker must register again, the new epoch if it had been reaped, 0 otherwise."""
        k = self.keys
        listed = "" if resident is None else json.dumps(list(resident)[-MAX_RESIDENT_LISTED:], separators=(",", ":"))
        return int(await self._call(self._heartbeat(
            keys=[k.workers, k.heartbeats, k.live, k.load, k.epoch, k.clock, k.resident],
            args=[worker_id, int(load), k.events, self._outage_gap_s, listed])))

    async def deregister(self, worker_id: str) -> int:
        """Remove a worker now (graceful leave); returns the new epoch."""
        k = self.keys
        epoch = int(await self._write(lambda: self._deregister(
            keys=[k.workers, k.heartbeats, k.live, k.load, k.epoch, k.draining, k.self_draining, k.resident],
            args=[worker_id, k.events])))
        if epoch < 0:
            raise await self._unknown_worker(worker_id)
        return epoch

    async def set_draining(self, worker_id: str, draining: bool, *, own: bool = False) -> int:
        """Mark a worker draining (no new voices) or not; returns the new epoch, 0 if unchanged.
        ``own``: the worker drains itself on shutdown (undone if it re-registers without having
        left); otherwise it is an operator's drain, which stays until an operator undrains."""
        check_worker_id(worker_id)
        k = self.keys
        epoch = int(await self._write(lambda: self._drain(
            keys=[k.workers, k.draining, k.epoch, k.self_draining],
            args=[worker_id, "1" if draining else "0", k.events, "1" if own else "0"])))
        if epoch < 0:
            raise await self._unknown_worker(worker_id)
        return epoch

    # -- placement writes -------------------------------------------------------------------------

    async def set_replicas(self, voice: str, replicas: int | None) -> int:
        """Set (or with None clear) the operator replica floor of a voice; returns the epoch or 0."""
        check_voice_id(voice)
        k = self.keys
        value = "" if replicas is None else str(int(replicas))
        return int(await self._write(lambda: self._set_field(
            keys=[k.replicas, k.epoch], args=[voice, value, "*", k.events])))

    async def swap_auto_replicas(self, voice: str, expected: int | None, new: int | None) -> bool:
        """Compare-and-set a voice's automatic replica count (None = not hot); False if another
        process changed it first. A raise stamps the Redis time (`raised_ages`); a fall or a clear
        forgets it."""
        k = self.keys
        args = [voice, "" if new is None else str(new), "" if expected is None else str(expected), k.events]
        return int(await self._write(lambda: self._swap_auto(keys=[k.auto, k.epoch, k.auto_raised], args=args))) >= 0

    async def raised_ages(self, voices: Iterable[str]) -> dict[str, float]:
        """Seconds (Redis clock) since each voice's automatic count was last raised; voices whose
        count fell or was cleared since, or never rose, are absent (one attempt)."""
        voices = list(voices)
        if not voices:
            return {}
        ages = await self._call(self._raised_ages(keys=[self.keys.auto_raised], args=voices))
        return {v: float(a) for v, a in zip(voices, ages) if a}

    async def add_heat(self, voice: str, count: int = 1) -> tuple[float, int | None]:
        """Add requests to a voice's decayed counters and the fleet's (one attempt); returns (slow
        counter value, current automatic replica count or None)."""
        s, k = self._settings, self.keys
        ttl_ms = max(1000, int(s.heat_half_life_s * 20 * 1000))  # gone once decayed below 2**-20
        slow, _fast, auto = await self._call(self._heat(
            keys=[k.heat(voice), k.auto, k.fleet, k.warm, k.voices],
            args=[voice, count, s.heat_half_life_s, ttl_ms, s.heat_fast_half_life_s, MAX_WARM, MAX_INDEXED_VOICES]))
        return float(slow), (int(auto) if auto else None)

    async def peek_heat(self, voices: Iterable[str]) -> dict[str, float]:
        """Slow decayed counter values now, for the given voices."""
        _fleet, counters = await self.peek_counters(voices)
        return {v: slow for v, (slow, _fast) in counters.items()}

    async def peek_counters(self, voices: Iterable[str]) -> tuple[tuple[float, float], dict[str, tuple[float, float]]]:
        """(slow, fast) decayed counters now: the fleet's, and each voice's (one attempt)."""
        voices = list(voices)
        s = self._settings
        values = await self._call(self._peek_heat(
            keys=[self.keys.fleet, *(self.keys.heat(v) for v in voices)],
            args=[s.heat_half_life_s, s.heat_fast_half_life_s]))
        pairs = [(float(values[i]), float(values[i + 1])) for i in range(0, len(values), 2)]
        return pairs[0], dict(zip(voices, pairs[1:]))

    async def add_outcomes(self, signals: Mapping[str, int], spills: Mapping[str, int] | None = None,
                           refusals: Mapping[str, int] | None = None) -> None:
        """One attempt to count, per voice: ``signals`` for the cool loop (a start landed past the
        voice's owners, or an owner refused it for its share: raise its replicas), and in the
        voice's decayed outcome counters ``spills`` (served past its owners) and ``refusals``."""
        spills, refusals = spills or {}, refusals or {}
        voices = sorted(set(signals) | set(spills) | set(refusals))
        if not voices:
            return
        s = self._settings
        args: list[object] = [s.heat_fast_half_life_s, max(1000, int(s.heat_fast_half_life_s * 20 * 1000))]
        for v in voices:
            args += [v, int(signals.get(v, 0)), int(spills.get(v, 0)), int(refusals.get(v, 0))]
        await self._call(self._add_outcomes(keys=[self.keys.spills, *(self.keys.outcome(v) for v in voices)],
                                            args=args))

    async def peek_outcomes(self, voices: Iterable[str]) -> dict[str, tuple[float, float]]:
        """Each voice's (spill, refusal) counters decayed to now, on the short window (one attempt)."""
        voices = list(voices)
        if not voices:
            return {}
        values = await self._call(self._peek_outcomes(keys=[self.keys.outcome(v) for v in voices],
                                                      args=[self._settings.heat_fast_half_life_s]))
        return {v: (float(values[2 * i]), float(values[2 * i + 1])) for i, v in enumerate(voices)}

    async def recent_voices(self, limit: int = MAX_INDEXED_VOICES) -> list[str]:
        """Voices requested within the heat TTL, most recent first (at most ``limit``)."""
        raw = await self._call(self._client.zrevrange(self.keys.voices, 0, max(0, limit - 1)))
        return [_text(v) for v in raw] if limit > 0 else []

    async def resident(self) -> dict[str, tuple[str, ...]]:
        """Worker id -> the voices its latest heartbeat listed as resident (workers that never
        listed any are absent)."""
        raw = await self._call(self._client.hgetall(self.keys.resident))
        out: dict[str, tuple[str, ...]] = {}
        for wid, blob in raw.items():
            try:
                voices = json.loads(blob)
            except ValueError:
                log.warning("skipping unreadable resident list of worker %r in Redis", wid)
                continue
            if isinstance(voices, list):
                out[_text(wid)] = tuple(v for v in voices if isinstance(v, str))
        return out

    async def take_signals(self) -> tuple[set[str], dict[str, int]]:
        """Read and clear the voices flagged warm and the spill counts since the last call."""
        warm, spills = await self._call(self._take_signals(keys=[self.keys.warm, self.keys.spills]))
        return {v.decode() for v in warm}, {v.decode(): int(n) for v, n in _pairs(spills)}

    async def set_warm_at(self, counter: float) -> None:
        """The fast counter value from which a voice is flagged warm for the cool loop."""
        await self._call(self._client.hset(self.keys.fleet, "warm_at", f"{counter:.6f}"))

    # -- leases -----------------------------------------------------------------------------------

    async def acquire_lock(self, name: str, token: str, ttl_s: float) -> bool:
        """Take the lease `name` for `ttl_s` seconds (SET NX PX, Redis clock) unless someone holds
        it; True if `token` holds it now. One attempt: a lease taken on a later tick is just as good."""
        return bool(await self._call(self._client.set(self.keys.lock(name), token, nx=True, px=_ms(ttl_s))))

    async def renew_lock(self, name: str, token: str, ttl_s: float) -> bool:
        """Extend the lease to `ttl_s` from now if `token` still holds it; False if it expired or
        someone else took it (then the caller must stop acting as the holder). One attempt."""
        return bool(await self._call(self._renew_lock(keys=[self.keys.lock(name)], args=[token, _ms(ttl_s)])))

    async def release_lock(self, name: str, token: str) -> bool:
        """Give the lease back if `token` holds it (a lease that expired and was taken by another
        process is left alone); True if it was released. One attempt."""
        return bool(await self._call(self._release_lock(keys=[self.keys.lock(name)], args=[token])))

    async def lock_holder(self, name: str) -> str | None:
        """The token holding lease `name`, or None."""
        raw = await self._call(self._client.get(self.keys.lock(name)))
        return None if raw is None else raw.decode()

    # -- reads ------------------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """Reap silent workers (silence during an outage does not count), then read all ring state
        atomically (one attempt). `server_time` and the heartbeats are on the ring clock."""
        s, k = self._settings, self.keys
        raw = await self._call(self._snapshot(
            keys=[k.workers, k.heartbeats, k.live, k.draining, k.load, k.epoch, k.replicas, k.auto, k.clock,
                  k.resident],
            args=[s.heartbeat_ttl_s, s.forget_after_s, k.events, self._outage_gap_s, secrets.token_hex(8)]))
        epoch, now, workers, beats, live, draining, loads, replicas, auto, incarnation = raw
        infos: dict[str, WorkerInfo] = {}
        for wid, blob in _pairs(workers):
            try:
                infos[wid.decode()] = WorkerInfo.from_json(blob)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("skipping unreadable worker record %r in Redis: %s", wid, exc)
        try:
            return Snapshot(
                epoch=int(epoch),
                server_time=float(now),
                workers=infos,
                heartbeats={w.decode(): float(t) for w, t in _pairs(beats)},
                live=frozenset(w.decode() for w in live),
                draining=frozenset(w.decode() for w in draining),
                loads={w.decode(): int(n) for w, n in _pairs(loads)},
                replicas={v.decode(): int(n) for v, n in _pairs(replicas)},
                auto_replicas={v.decode(): int(n) for v, n in _pairs(auto)},
                incarnation=incarnation.decode(),
            )
        except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
            raise RingError(
                f"Redis holds unreadable ring state under {s.prefix!r} ({exc}); something other than "
                f"voicering may have written there. Check those keys with redis-cli.") from exc

    async def auto_replicas(self) -> dict[str, int]:
        """Automatic replica counts of the voices that have one."""
        raw = await self._call(self._client.hgetall(self.keys.auto))
        return {v.decode(): int(n) for v, n in raw.items()}

    async def subscribe(self) -> Subscription:
        """Subscribe to epoch announcements; raises RingUnavailable if Redis is down."""
        pubsub = self._client.pubsub()
        try:
            await self._call(pubsub.subscribe(self.keys.events))
        except BaseException:
            await Subscription(self, pubsub).aclose()
            raise
        return Subscription(self, pubsub)

    async def announce(self, member: str, info: str, forget_s: float) -> None:
        """One presence beat of a process that is not a ring member (`hashring.presence`): its
        member name and JSON, stamped with Redis time; members silent for ``forget_s`` are dropped.
        Not membership: no epoch, no event."""
        await self._write(lambda: self._announce(keys=[self.keys.presence, self.keys.presence_info],
                                                 args=[member, info, forget_s]))

    async def present(self) -> tuple[float, list[tuple[str, float, str | None]]]:
        """Redis time now, and every announced member with its last beat and its JSON."""
        raw = await self._call(self._present(keys=[self.keys.presence, self.keys.presence_info]))
        now, flat = float(raw[0]), raw[1:]
        rows = [(_text(flat[i]), float(flat[i + 1]), None if flat[i + 2] is None else _text(flat[i + 2]))
                for i in range(0, len(flat), 3)]
        return now, rows

    async def ping(self) -> float:
        """Round-trip time to Redis in seconds."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self._call(self._client.ping())
        return loop.time() - start


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(seconds: float) -> int:
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"a lease needs a positive duration, got {seconds!r}")
    return max(1, round(seconds * 1000))


def _pairs(flat: list) -> Iterable[tuple[bytes, bytes]]:
    return zip(flat[0::2], flat[1::2])


def rate_of(counter: float, half_life_s: float) -> float:
    """Requests per second implied by a decayed counter (steady rate r settles at r × h / ln 2)."""
    return counter * math.log(2) / half_life_s
