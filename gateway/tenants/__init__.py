"""Tenants, their API keys and their voices, kept in Redis so every gateway process agrees.

    errors.py       the error tree below, and `redis_errors`: redis-py's errors mapped at the Redis boundary
    records.py      TenantLimits, TenantPolicy, Tenant, TenantVoice; the grammars of names, ids and keys;
                    their Redis form
    keys.py         KeyLayout: every Redis key of tenants, quotas and usage, under one prefix
    scripts.py      the registry's multi-key changes, each one atomic Lua script
    registry.py     Tenants: create, look up, revoke, limits, keys, authenticate, tenant voices
    pronunciations.py  Pronunciations: the tenant's pronunciation dictionaries (bounded, versioned), and the
                    references workers read them by
    auth_cache.py   keys verified lately, served only while Redis cannot be asked

    TenantError           every error of the tenant layer; `.retryable` says whether trying again can help
    ├── Unauthorized      a missing, malformed, unknown or revoked API key (one message for all four)
    ├── Unavailable       Redis is unreachable or refuses commands for now (memory full, no master,
    │                     loading...) and the key was not verified recently (retryable: HTTP 503)
    ├── Busy              every pooled Redis connection of this gateway process stayed in use past the
    │                     pool's wait: the process is busy, not Redis (retryable: HTTP 503 gateway_busy)
    ├── StoreError        Redis refused a command for good, or holds a damaged record (the operator's: HTTP 500)
    ├── TenantNotFound    an operator named a tenant that does not exist
    ├── TenantExists      a tenant name already taken
    ├── TenantRevoked     an operator asked a revoked tenant for a new key
    ├── InvalidName       a tenant or voice name outside its grammar
    ├── InvalidLimits     a limit that is not a positive whole number, or an unknown limit
    ├── InvalidPolicy     a policy value outside its choices (consent, report gate, retention days)
    ├── VoiceNotFound     no such voice *of this tenant*: another tenant's voice is simply absent
    ├── VoiceExists       a voice name the tenant already uses
    ├── PronunciationNotFound  no such pronunciation dictionary *of this tenant*
    ├── PronunciationExists    a dictionary name the tenant already uses
    ├── PronunciationInUse     a dictionary a voice has as its default (not deleted)
    ├── InvalidPronunciation   a dictionary (name, rules, size) or a request's list of them out of bounds
    └── QuotaExceeded     a limit is reached; `.limit` names it, `.retry_after_s` says when to retry

An API key is `vr_` + 32 random bytes (urlsafe base64). Redis holds only sha256(key), mapped to the
tenant id, so a leaked dump grants nothing. `authenticate` always hashes the key and makes one
lookup by digest, whatever the key looks like, so its timing does not tell whether a key exists.
Messages never contain a key, nor Redis's own replies. Quotas live in `gateway.quotas`, usage
counters in `gateway.usage`.
"""

from __future__ import annotations

from gateway.tenants.auth_cache import DEFAULT_AUTH_CACHE_S
from gateway.tenants.errors import (
    Busy,
    InvalidLimits,
    InvalidName,
    InvalidPolicy,
    InvalidPronunciation,
    PronunciationExists,
    PronunciationInUse,
    PronunciationNotFound,
    QuotaExceeded,
    QuotaName,
    StoreError,
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
    TENANT_ID,
    TENANT_NAME,
    ConsentMode,
    ReportGate,
    Tenant,
    TenantLimits,
    TenantPolicy,
    TenantVoice,
    VoiceState,
    check_job_id,
    check_tenant_name,
    key_digest,
)
from gateway.tenants.registry import Tenants, connect_redis

__all__ = [
    "API_KEY",
    "DEFAULT_AUTH_CACHE_S",
    "DEFAULT_PREFIX",
    "TENANT_ID",
    "TENANT_NAME",
    "Busy",
    "ConsentMode",
    "InvalidLimits",
    "InvalidName",
    "InvalidPolicy",
    "InvalidPronunciation",
    "KeyLayout",
    "PronunciationExists",
    "PronunciationInUse",
    "PronunciationNotFound",
    "QuotaExceeded",
    "QuotaName",
    "ReportGate",
    "StoreError",
    "Tenant",
    "TenantError",
    "TenantExists",
    "TenantLimits",
    "TenantNotFound",
    "TenantPolicy",
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
