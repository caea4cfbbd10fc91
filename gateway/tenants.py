"""Tenants, their API keys and their voices, kept in Redis so every gateway process agrees.

    TenantError           every error of the tenant layer; `.retryable` says whether trying again can help
    ├── Unauthorized      a missing, malformed, unknown or revoked API key (one message for all four)
    ├── Unavailable       Redis is unreachable and the key was not verified recently (retryable: HTTP 503)
    ├── TenantNotFound    an operator named a tenant that does not exist
    ├── TenantExists      a tenant name already taken
    ├── TenantRevoked     an operator asked a revoked tenant for a new key
    ├── InvalidName       a tenant or voice name outside its grammar
    ├── InvalidLimits     a limit that is not a positive whole number, or an unknown limit
    ├── VoiceNotFound     no such voice *of this tenant*: another tenant's voice is simply absent
    ├── VoiceExists       a voice name the tenant already uses
    └── QuotaExceeded     a limit is reached; `.limit` names it, `.retry_after_s` says when to retry

An API key is `vr_` + 32 random bytes (urlsafe base64). Redis holds only sha256(key), mapped to the
tenant id, so a leaked dump grants nothing. `authenticate` always hashes the key and makes one
lookup by digest, whatever the key looks like, so its timing does not tell whether a key exists.
redis-py errors are mapped to these at the Redis boundary (`redis_errors`); messages never contain
a key. Quotas live in `gateway.quotas`, usage counters in `gateway.usage`.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from hashring.records import VOICE_ID, check_voice_id, shown_voice_id

__all__ = [
    "API_KEY",
    "DEFAULT_AUTH_CACHE_S",
    "DEFAULT_PREFIX",
    "TENANT_ID",
    "TENANT_NAME",
    "InvalidLimits",
    "InvalidName",
    "KeyLayout",
    "QuotaExceeded",
    "QuotaName",
    "Tenant",
    "TenantError",
    "TenantExists",
    "TenantLimits",
    "TenantNotFound",
    "TenantRevoked",
    "TenantVoice",
    "Tenants",
    "Unauthorized",
    "Unavailable",
    "VoiceExists",
    "VoiceNotFound",
    "VoiceState",
    "check_job_id",
    "check_tenant_name",
    "connect_redis",
    "key_digest",
    "redis_errors",
]

DEFAULT_PREFIX: Final = "voicering:tenants"
DEFAULT_AUTH_CACHE_S: Final = 30.0
API_KEY: Final = re.compile(r"\Avr_[A-Za-z0-9_-]{43}\Z")  # token_urlsafe(32): 43 characters
TENANT_ID: Final = re.compile(r"\At_[a-z2-7]{10}\Z")  # fits VOICE_ID's first part: "t_x/voice" is a voice id
# Lowercase so "Acme" and "acme" cannot both exist; never "t_...", so a name is never read as an id.
TENANT_NAME: Final = re.compile(r"\A(?!t_)[a-z0-9][a-z0-9._-]{0,62}\Z")
_MAX_CONSENT_CHARS: Final = 4096
_MAX_JOB_ID_CHARS: Final = 128
_AUTH_CACHE_ENTRIES: Final = 10_000

QuotaName = Literal["streams", "requests", "voices", "training_jobs"]


# -- errors -----------------------------------------------------------------------------------------


class TenantError(Exception):
    """Base of every tenant-layer error; `message` is written for the person who has to act on it."""

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable


class Unauthorized(TenantError):
    """The request's API key does not open any tenant; the message never says why (or echoes it)."""

    def __init__(self) -> None:
        super().__init__("invalid API key: send the key you were given as 'Authorization: Bearer vr_...'; "
                         "if it was lost or revoked, ask your operator for a new one")


class Unavailable(TenantError):
    """Redis cannot be reached; keys verified in the last `auth_cache_s` keep working meanwhile."""

    retryable = True


class TenantNotFound(TenantError):
    """No tenant has that name or id."""


class TenantExists(TenantError):
    """The tenant name is taken (names are unique)."""


class TenantRevoked(TenantError):
    """The tenant was revoked; it gets no new keys."""


class InvalidName(TenantError):
    """A tenant or voice name that cannot be used."""


class InvalidLimits(TenantError):
    """A limit that is not a positive whole number, or a name that is no limit."""


class VoiceNotFound(TenantError):
    """The tenant has no voice of that name (the same error whoever else might own one)."""


class VoiceExists(TenantError):
    """The tenant already has a voice of that name."""


class QuotaExceeded(TenantError):
    """A tenant limit is reached. Retryable when `retry_after_s` is known (streams, requests)."""

    def __init__(self, message: str, *, limit: QuotaName, retry_after_s: float | None = None) -> None:
        super().__init__(message, retryable=retry_after_s is not None)
        self.limit: QuotaName = limit
        self.retry_after_s = retry_after_s


@contextmanager
def redis_errors() -> Iterator[None]:
    """Map redis-py errors raised inside the block to tenant errors (the one Redis boundary)."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ReadOnlyError,
            OSError) as exc:
        raise Unavailable(f"the tenant store (Redis) is unreachable ({type(exc).__name__}); "
                          "try again in a few seconds") from exc
    except redis.exceptions.RedisError as exc:
        raise TenantError(f"the tenant store (Redis) refused a command ({type(exc).__name__}: {exc}); "
                          "check Redis memory and that nothing else writes under the tenant prefix") from exc


def connect_redis(url: str, *, timeout_s: float) -> aioredis.Redis:
    """A client as the tenant layer wants it: text replies, short timeouts, one quick reconnect
    (a pooled socket may be stale) and no slow backoff, so a dead Redis is noticed at once."""
    return aioredis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                             socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1))


# -- records ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may use at once (streams, training jobs), per minute, per upload and in total."""

    max_streams: int = 8  # concurrent speech streams
    requests_per_minute: int = 120
    max_upload_bytes: int = 200 * 1024 * 1024  # per upload
    max_voices: int = 20
    max_training_jobs: int = 2  # at once

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidLimits(f"{f.name} must be a positive whole number, not {value!r}")

    def replace(self, **changes: int) -> TenantLimits:
        """A copy with `changes` applied; unknown names are refused with the list of known ones."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise InvalidLimits(f"unknown limit(s) {', '.join(unknown)}; the limits are {', '.join(self.names())}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True, slots=True)
class Tenant:
    """One customer of the platform. `id` is the stable handle (it prefixes the tenant's voice ids)."""

    id: str
    name: str
    limits: TenantLimits
    created_at: float  # unix seconds
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class TenantVoice:
    """A tenant's name for one cloned voice and the global id the workers know it by."""

    name: str
    voice_id: str  # f"{tenant.id}/{name}"
    consent: str  # the speaker's consent record (a statement or a reference to one)
    created_at: float  # unix seconds
    job_id: str | None = None  # the training job that builds it
    note: str | None = None  # free text, e.g. the state of its training
    state: VoiceState = "ready"  # the gateway's lifecycle; while "training", the job's own state says more


VoiceState = Literal["training", "warming", "ready", "failed"]
_VOICE_UPDATABLE: Final = frozenset({"job_id", "note", "state"})


def key_digest(key: str) -> str:
    """sha256 hex of an API key: the only form of a key Redis ever sees."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _new_tenant_id() -> str:
    return "t_" + base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()[:10]


def _new_key() -> str:
    return "vr_" + secrets.token_urlsafe(32)


def check_tenant_name(name: str) -> str:
    """Return `name` if it can name a tenant, else InvalidName saying what is allowed."""
    if not isinstance(name, str) or not TENANT_NAME.match(name):
        raise InvalidName(f"tenant name {shown_voice_id(str(name))} is not usable: use 1-63 lowercase letters, "
                          "digits or '._-', starting with a letter or digit (and not with 't_')")
    return name


def _voice_id(tenant: Tenant, name: str) -> str:
    """The global voice id of `name`, or InvalidName when the name breaks the adapter grammar."""
    voice_id = f"{tenant.id}/{name}"
    if not isinstance(name, str) or "/" in name or not VOICE_ID.match(voice_id):
        raise InvalidName(f"voice name {shown_voice_id(str(name))} is not usable: use 1-128 letters, digits "
                          "or '._-', starting with a letter or digit")
    return check_voice_id(voice_id)


class KeyLayout:
    """Every Redis key of the tenant layer (tenants, quotas, usage), all under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names = f"{prefix}:names"  # HASH name -> tenant id
        self.api_keys = f"{prefix}:apikeys"  # HASH sha256(key) -> tenant id
        self.tenant_base = f"{prefix}:t:"

    def tenant(self, tenant_id: str) -> str:  # HASH id, name, created_at, revoked, one field per limit
        return self.tenant_base + tenant_id

    def tenant_keys(self, tenant_id: str) -> str:  # SET sha256 of the tenant's keys (revoke drops them all)
        return f"{self.tenant_base}{tenant_id}:apikeys"

    def voices(self, tenant_id: str) -> str:  # HASH voice name -> TenantVoice as JSON
        return f"{self.tenant_base}{tenant_id}:voices"

    def streams(self, tenant_id: str) -> str:  # ZSET slot token -> lease expiry (Redis clock)
        return f"{self.tenant_base}{tenant_id}:streams"

    def requests(self, tenant_id: str) -> str:  # ZSET request token -> time (the last minute)
        return f"{self.tenant_base}{tenant_id}:requests"

    def training(self, tenant_id: str) -> str:  # SET job ids holding a training slot
        return f"{self.tenant_base}{tenant_id}:training"

    def usage(self, tenant_id: str) -> str:  # HASH audio_seconds, training_minutes, requests
        return f"{self.tenant_base}{tenant_id}:usage"


def _tenant_fields(tenant: Tenant) -> dict[str, str]:
    limits = {name: str(getattr(tenant.limits, name)) for name in TenantLimits.names()}
    return {"id": tenant.id, "name": tenant.name, "created_at": repr(tenant.created_at),
            "revoked": "1" if tenant.revoked else "0", **limits}


def _tenant_from(fields: Mapping[str, str]) -> Tenant:
    try:
        limits = TenantLimits(**{name: int(fields[name]) for name in TenantLimits.names()})
        return Tenant(fields["id"], fields["name"], limits, float(fields["created_at"]), fields["revoked"] == "1")
    except (KeyError, ValueError, InvalidLimits) as exc:
        raise TenantError(f"the record of tenant {fields.get('id', '?')!r} in Redis is damaged ({exc!r}); "
                          "fix it with `voicering tenant limits` or redis-cli") from None


def _voice_from(raw: str) -> TenantVoice:
    data = json.loads(raw)
    return TenantVoice(**{f.name: data[f.name] for f in dataclasses.fields(TenantVoice) if f.name in data})


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


# -- Lua: each multi-key change is one atomic script ------------------------------------------------

# KEYS: names, tenant, api_keys, tenant_keys. ARGV: name, id, digest, then the tenant's field/value pairs.
_CREATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'name' end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'id' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('HSET', KEYS[3], ARGV[3], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[3])
return 'ok'
"""
# KEYS: api_keys. ARGV: digest, the tenant key base. The whole authentication: one round trip.
_LOOKUP = """
local id = redis.call('HGET', KEYS[1], ARGV[1])
if not id then return false end
return redis.call('HGETALL', ARGV[2] .. id)
"""
# KEYS: tenant, tenant_keys, api_keys. Returns how many keys stopped working, or -1 without a tenant.
_REVOKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HSET', KEYS[1], 'revoked', '1')
local digests = redis.call('SMEMBERS', KEYS[2])
for _, digest in ipairs(digests) do redis.call('HDEL', KEYS[3], digest) end
redis.call('DEL', KEYS[2])
return #digests
"""
# KEYS: tenant, tenant_keys, api_keys. ARGV: digest, id.
_NEW_KEY = """
local revoked = redis.call('HGET', KEYS[1], 'revoked')
if not revoked then return 'missing' end
if revoked == '1' then return 'revoked' end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return 'ok'
"""
# KEYS: tenant. ARGV: field/value pairs. Returns the updated record, or false without a tenant.
_SET_FIELDS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], unpack(ARGV))
return redis.call('HGETALL', KEYS[1])
"""
# KEYS: voices. ARGV: name, record JSON, max_voices. Check and insert in one step: no race past the limit.
_REGISTER_VOICE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'exists' end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 'full' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 'ok'
"""
# KEYS: voices. ARGV: name, changes as a JSON object. Returns the new record JSON, or false.
_UPDATE_VOICE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local record = cjson.decode(raw)
for k, v in pairs(cjson.decode(ARGV[2])) do record[k] = v end
raw = cjson.encode(record)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return raw
"""
# KEYS: voices. ARGV: name. Returns the removed record JSON, or false.
_DELETE_VOICE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then redis.call('HDEL', KEYS[1], ARGV[1]) end
return raw
"""


class _AuthCache:
    """Keys Redis confirmed lately (by digest), served only while Redis cannot be asked; bounded."""

    def __init__(self, ttl_s: float, max_entries: int = _AUTH_CACHE_ENTRIES) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[Tenant, float]] = OrderedDict()

    def put(self, digest: str, tenant: Tenant) -> None:
        self._entries[digest] = (tenant, time.monotonic())
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def get(self, digest: str) -> Tenant | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if time.monotonic() - entry[1] > self._ttl:
            del self._entries[digest]
            return None
        return entry[0]

    def drop(self, digest: str) -> None:
        self._entries.pop(digest, None)


class Tenants:
    """The tenant registry: create, look up, revoke, change limits, issue keys, authenticate, and map
    each tenant's voice names to global voice ids. Safe to share by many tasks; several gateway
    processes may use one Redis at once (every change that spans keys is one Lua script).

    `redis` must decode replies (`connect_redis` makes one). The caller owns it and closes it."""

    def __init__(self, redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX, *,
                 auth_cache_s: float = DEFAULT_AUTH_CACHE_S) -> None:
        if not redis.get_connection_kwargs().get("decode_responses"):
            raise ValueError("Tenants needs a Redis client made with decode_responses=True (see connect_redis)")
        if auth_cache_s < 0:
            raise ValueError("auth_cache_s must be >= 0")
        self.keys = KeyLayout(prefix)
        self._redis = redis
        self._cache = _AuthCache(auth_cache_s)
        script = redis.register_script
        self._create, self._lookup, self._revoke = script(_CREATE), script(_LOOKUP), script(_REVOKE)
        self._new_key, self._set_fields = script(_NEW_KEY), script(_SET_FIELDS)
        self._register_voice, self._update_voice = script(_REGISTER_VOICE), script(_UPDATE_VOICE)
        self._delete_voice = script(_DELETE_VOICE)

    # -- tenants and keys ---------------------------------------------------------------------------

    async def create(self, name: str, limits: TenantLimits | None = None) -> tuple[Tenant, str]:
        """A new tenant and its first API key. The key is returned once and never stored."""
        check_tenant_name(name)
        key = _new_key()
        for _ in range(3):  # 50-bit ids: a collision is a freak, but cheap to survive
            tenant = Tenant(_new_tenant_id(), name, limits or TenantLimits(), time.time())
            k = self.keys
            fields = [x for pair in _tenant_fields(tenant).items() for x in pair]
            with redis_errors():
                outcome = await self._create(
                    keys=[k.names, k.tenant(tenant.id), k.api_keys, k.tenant_keys(tenant.id)],
                    args=[name, tenant.id, key_digest(key), *fields])
            if outcome == "ok":
                return tenant, key
            if outcome == "name":
                raise TenantExists(f"a tenant named {name!r} already exists; pick another name")
        raise TenantError("could not find a free tenant id after 3 tries; try again")

    async def get(self, name_or_id: str) -> Tenant:
        """The tenant with this name or id (ids look like 't_' + 10 characters)."""
        with redis_errors():
            is_id = TENANT_ID.match(name_or_id)
            tenant_id = name_or_id if is_id else await self._redis.hget(self.keys.names, name_or_id)
            fields = await self._redis.hgetall(self.keys.tenant(tenant_id)) if tenant_id else {}
        if not fields:
            raise TenantNotFound(f"no tenant is named (or has the id) {shown_voice_id(name_or_id)}; "
                                 "see `voicering tenant list`")
        return _tenant_from(fields)

    async def list(self) -> list[Tenant]:
        """Every tenant, revoked ones included, by name."""
        with redis_errors():
            ids = await self._redis.hvals(self.keys.names)
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant_id in ids:
                    pipe.hgetall(self.keys.tenant(tenant_id))
                records = await pipe.execute()
        return sorted((_tenant_from(r) for r in records if r), key=lambda t: t.name)

    async def revoke(self, name_or_id: str) -> Tenant:
        """Revoke the tenant: every key of it stops working at once (within `auth_cache_s` on a
        gateway that cannot reach Redis). Its record, voices and usage stay."""
        tenant = await self.get(name_or_id)
        k = self.keys
        with redis_errors():
            removed = await self._revoke(keys=[k.tenant(tenant.id), k.tenant_keys(tenant.id), k.api_keys])
        if removed < 0:
            raise TenantNotFound(f"tenant {tenant.name!r} was deleted meanwhile")
        return dataclasses.replace(tenant, revoked=True)

    async def set_limits(self, name_or_id: str, **changes: int) -> Tenant:
        """Change some limits (others stay); they apply to the tenant's next requests."""
        tenant = await self.get(name_or_id)
        limits = tenant.limits.replace(**changes)
        if not changes:
            return tenant
        args = [x for name in changes for x in (name, str(getattr(limits, name)))]
        with redis_errors():
            record = await self._set_fields(keys=[self.keys.tenant(tenant.id)], args=args)
        if not record:
            raise TenantNotFound(f"tenant {tenant.name!r} was deleted meanwhile")
        return _tenant_from(_pairs(record))

    async def new_key(self, name_or_id: str) -> str:
        """One more API key for the tenant (the others keep working). Returned once, never stored."""
        tenant = await self.get(name_or_id)
        key = _new_key()
        k = self.keys
        with redis_errors():
            outcome = await self._new_key(keys=[k.tenant(tenant.id), k.tenant_keys(tenant.id), k.api_keys],
                                          args=[key_digest(key), tenant.id])
        if outcome == "revoked":
            raise TenantRevoked(f"tenant {tenant.name!r} is revoked and gets no new keys; create a new tenant")
        if outcome != "ok":
            raise TenantNotFound(f"tenant {tenant.name!r} was deleted meanwhile")
        return key

    async def authenticate(self, key: str | None) -> Tenant:
        """The tenant `key` opens, or Unauthorized. With Redis unreachable, a key verified in the last
        `auth_cache_s` still opens its tenant; any other well-formed key gets Unavailable (retry)."""
        if not key:
            raise Unauthorized()
        digest = key_digest(key)  # every key is hashed and looked up, whatever its shape
        try:
            with redis_errors():
                flat = await self._lookup(keys=[self.keys.api_keys], args=[digest, self.keys.tenant_base])
        except Unavailable:
            tenant = self._cache.get(digest)
            if tenant is not None:
                return tenant
            if not API_KEY.match(key):
                raise Unauthorized() from None
            raise
        tenant = _tenant_from(_pairs(flat)) if flat else None
        if tenant is None or tenant.revoked:
            self._cache.drop(digest)
            raise Unauthorized()
        self._cache.put(digest, tenant)
        return tenant

    # -- voices -------------------------------------------------------------------------------------

    async def register_voice(self, tenant: Tenant, name: str, *, consent: str, job_id: str | None = None,
                             note: str | None = None, state: VoiceState = "ready") -> TenantVoice:
        """Give the tenant a voice called `name` (global id f"{tenant.id}/{name}"), within `max_voices`."""
        voice_id = _voice_id(tenant, name)
        if not isinstance(consent, str) or not consent.strip() or len(consent) > _MAX_CONSENT_CHARS:
            raise TenantError(f"a voice needs the speaker's consent record (1-{_MAX_CONSENT_CHARS} characters)")
        if job_id is not None:
            check_job_id(job_id)
        voice = TenantVoice(name, voice_id, consent, time.time(), job_id, note, state)
        with redis_errors():
            outcome = await self._register_voice(
                keys=[self.keys.voices(tenant.id)],
                args=[name, json.dumps(dataclasses.asdict(voice)), tenant.limits.max_voices])
        if outcome == "exists":
            raise VoiceExists(f"you already have a voice named {name!r}; pick another name or delete it first")
        if outcome == "full":
            raise QuotaExceeded(f"you have {tenant.limits.max_voices} voices, your limit; delete one to add "
                                "another, or ask your operator to raise max_voices", limit="voices")
        return voice

    async def voice(self, tenant: Tenant, name: str) -> TenantVoice:
        """The tenant's voice `name`. Looked up by (tenant id, name): another tenant's voice of the same
        name is absent, with the same error and the same Redis work as a name nobody uses."""
        with redis_errors():
            raw = await self._redis.hget(self.keys.voices(tenant.id), name)
        if raw is None:
            raise _voice_not_found(name)
        return _voice_from(raw)

    async def voices(self, tenant: Tenant) -> list[TenantVoice]:
        """The tenant's voices, by name."""
        with redis_errors():
            raws = await self._redis.hvals(self.keys.voices(tenant.id))
        return sorted((_voice_from(raw) for raw in raws), key=lambda v: v.name)

    async def update_voice(self, tenant: Tenant, name: str, **fields: str | None) -> TenantVoice:
        """Change `job_id`, `note` and/or `state` of the tenant's voice `name`."""
        unknown = sorted(set(fields) - _VOICE_UPDATABLE)
        if unknown:
            raise TenantError(f"cannot change {', '.join(unknown)} of a voice; changeable: "
                              f"{', '.join(sorted(_VOICE_UPDATABLE))}")
        if fields.get("job_id") is not None:
            check_job_id(fields["job_id"])
        with redis_errors():
            raw = await self._update_voice(keys=[self.keys.voices(tenant.id)], args=[name, json.dumps(fields)])
        if not raw:
            raise _voice_not_found(name)
        return _voice_from(raw)

    async def delete_voice(self, tenant: Tenant, name: str) -> TenantVoice:
        """Forget the tenant's voice `name`; returns it (its adapter is the caller's to remove)."""
        with redis_errors():
            raw = await self._delete_voice(keys=[self.keys.voices(tenant.id)], args=[name])
        if not raw:
            raise _voice_not_found(name)
        return _voice_from(raw)


def _voice_not_found(name: str) -> VoiceNotFound:
    return VoiceNotFound(f"you have no voice named {shown_voice_id(str(name))}; "
                         "check the name (names are case-sensitive)")


def check_job_id(job_id: str) -> str:
    """Return `job_id` unless it is empty, too long or not text."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > _MAX_JOB_ID_CHARS:
        raise TenantError(f"a job id must be 1-{_MAX_JOB_ID_CHARS} characters")
    return job_id
