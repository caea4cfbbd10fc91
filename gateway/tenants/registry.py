"""The tenant registry: tenants, their API keys and their voices, kept in Redis so every gateway
process agrees. Every change that spans keys is one Lua script (`scripts`)."""

from __future__ import annotations

import dataclasses
import json
import time

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.tenants import scripts
from gateway.tenants.auth_cache import DEFAULT_AUTH_CACHE_S, AuthCache
from gateway.tenants.errors import (
    QuotaExceeded,
    TenantError,
    TenantExists,
    TenantNotFound,
    TenantRevoked,
    Unauthorized,
    Unavailable,
    VoiceExists,
    VoiceNotFound,
    redis_errors,
)
from gateway.tenants.keys import DEFAULT_PREFIX, KeyLayout
from gateway.tenants.records import (
    API_KEY,
    MAX_CONSENT_CHARS,
    TENANT_ID,
    VOICE_UPDATABLE,
    Tenant,
    TenantLimits,
    TenantPolicy,
    TenantVoice,
    VoiceState,
    check_job_id,
    check_tenant_name,
    key_digest,
    new_key,
    new_tenant_id,
    pairs,
    tenant_fields,
    tenant_from,
    voice_from,
    voice_id_of,
)
from hashring.records import shown_voice_id
from hashring.redis_client import async_client

__all__ = ["Tenants", "connect_redis"]


def connect_redis(url: str, *, timeout_s: float, max_connections: int | None = None,
                  pool_wait_s: float | None = None) -> aioredis.Redis:
    """A client as the tenant layer wants it: text replies, short timeouts, one quick reconnect
    (a pooled socket may be stale) and no slow backoff, so a dead Redis is noticed at once. With
    `max_connections`, a call that finds them all in use waits up to `pool_wait_s` for one, then
    raises `Busy` (through `redis_errors`); a serving gateway sizes it from its settings."""
    return async_client(url, max_connections=max_connections, pool_wait_s=pool_wait_s, decode_responses=True,
                        socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1))


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
        self._cache = AuthCache(auth_cache_s)
        script = redis.register_script
        self._create, self._lookup, self._revoke = script(scripts.CREATE), script(scripts.LOOKUP), script(scripts.REVOKE)
        self._new_key, self._set_fields = script(scripts.NEW_KEY), script(scripts.SET_FIELDS)
        self._register_voice, self._update_voice = script(scripts.REGISTER_VOICE), script(scripts.UPDATE_VOICE)
        self._delete_voice = script(scripts.DELETE_VOICE)

    # -- tenants and keys ---------------------------------------------------------------------------

    async def create(self, name: str, limits: TenantLimits | None = None,
                     policy: TenantPolicy | None = None) -> tuple[Tenant, str]:
        """A new tenant and its first API key. The key is returned once and never stored."""
        check_tenant_name(name)
        key = new_key()
        for _ in range(3):  # 50-bit ids: a collision is a freak, but cheap to survive
            tenant = Tenant(new_tenant_id(), name, limits or TenantLimits(), time.time(), False,
                            policy or TenantPolicy())
            k = self.keys
            fields = [x for pair in tenant_fields(tenant).items() for x in pair]
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
        return tenant_from(fields)

    async def list(self) -> list[Tenant]:
        """Every tenant, revoked ones included, by name."""
        with redis_errors():
            ids = await self._redis.hvals(self.keys.names)
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant_id in ids:
                    pipe.hgetall(self.keys.tenant(tenant_id))
                records = await pipe.execute()
        return sorted((tenant_from(r) for r in records if r), key=lambda t: t.name)

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
        return tenant_from(pairs(record))

    async def set_policy(self, name_or_id: str, **changes: object) -> Tenant:
        """Change some policy fields (others stay); they apply to the tenant's next clones, and a new
        retention period to its existing voices' recordings at the next sweep."""
        tenant = await self.get(name_or_id)
        policy = tenant.policy.replace(**changes)
        if not changes:
            return tenant
        fields = policy.fields()
        args = [x for name in changes for x in (name, fields[name])]
        with redis_errors():
            record = await self._set_fields(keys=[self.keys.tenant(tenant.id)], args=args)
        if not record:
            raise TenantNotFound(f"tenant {tenant.name!r} was deleted meanwhile")
        return tenant_from(pairs(record))

    async def new_key(self, name_or_id: str) -> str:
        """One more API key for the tenant (the others keep working). Returned once, never stored."""
        tenant = await self.get(name_or_id)
        key = new_key()
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
        tenant = tenant_from(pairs(flat)) if flat else None
        if tenant is None or tenant.revoked:
            self._cache.drop(digest)
            raise Unauthorized()
        self._cache.put(digest, tenant)
        return tenant

    # -- voices -------------------------------------------------------------------------------------

    async def register_voice(self, tenant: Tenant, name: str, *, consent: str, job_id: str | None = None,
                             note: str | None = None, state: VoiceState = "ready") -> TenantVoice:
        """Give the tenant a voice called `name` (global id f"{tenant.id}/{name}"), within `max_voices`."""
        voice_id = voice_id_of(tenant, name)
        if not isinstance(consent, str) or not consent.strip() or len(consent) > MAX_CONSENT_CHARS:
            raise TenantError(f"a voice needs the speaker's consent record (1-{MAX_CONSENT_CHARS} characters)")
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
        return voice_from(raw)

    async def voices(self, tenant: Tenant) -> list[TenantVoice]:
        """The tenant's voices, by name."""
        with redis_errors():
            raws = await self._redis.hvals(self.keys.voices(tenant.id))
        return sorted((voice_from(raw) for raw in raws), key=lambda v: v.name)

    async def update_voice(self, tenant: Tenant, name: str, **fields: str | float | None) -> TenantVoice:
        """Change `job_id`, `note`, `state`, `settled_at` and/or `recordings_deleted_at` of the voice `name`."""
        unknown = sorted(set(fields) - VOICE_UPDATABLE)
        if unknown:
            raise TenantError(f"cannot change {', '.join(unknown)} of a voice; changeable: "
                              f"{', '.join(sorted(VOICE_UPDATABLE))}")
        if fields.get("job_id") is not None:
            check_job_id(fields["job_id"])
        with redis_errors():
            raw = await self._update_voice(keys=[self.keys.voices(tenant.id)], args=[name, json.dumps(fields)])
        if not raw:
            raise _voice_not_found(name)
        return voice_from(raw)

    async def delete_voice(self, tenant: Tenant, name: str) -> TenantVoice:
        """Forget the tenant's voice `name`; returns it (its adapter is the caller's to remove)."""
        with redis_errors():
            raw = await self._delete_voice(keys=[self.keys.voices(tenant.id), self.keys.voice_pronunciations(tenant.id)],
                                           args=[name])
        if not raw:
            raise _voice_not_found(name)
        return voice_from(raw)


def _voice_not_found(name: str) -> VoiceNotFound:
    return VoiceNotFound(f"you have no voice named {shown_voice_id(str(name))}; "
                         "check the name (names are case-sensitive)")
