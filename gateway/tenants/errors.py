"""The tenant layer's errors, and the one place redis-py's errors become them (`redis_errors`).

Redis answers "not now" in several ways besides a dropped socket: memory full under `noeviction`
(OOM), a replica without its master (MASTERDOWN, READONLY, NOREPLICAS), a server still loading
its data (LOADING) or running a long script (BUSY), a cluster mid-failover (TRYAGAIN,
CLUSTERDOWN). Each passes by itself, so each is `Unavailable` (retryable: HTTP 503 with
Retry-After). Anything else Redis refuses is a `StoreError` (the operator's to fix: HTTP 500).
Neither message carries Redis's own text, which can name keys and their sizes: that goes to the
log, where the operator looks.

Every pooled connection in use for longer than the pool waits (redis-py's MaxConnectionsError, a
ConnectionError subclass) is neither: Redis may be fine, this gateway process is busy. That is
`Busy` (retryable, HTTP 503 `gateway_busy`), never "unreachable".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Literal

import redis.exceptions

__all__ = [
    "Busy", "InvalidLimits", "InvalidName", "InvalidPolicy", "InvalidPronunciation", "PronunciationExists",
    "PronunciationInUse", "PronunciationNotFound", "QuotaExceeded", "QuotaName", "StoreError", "TenantError",
    "TenantExists", "TenantNotFound", "TenantRevoked", "Unauthorized", "Unavailable", "VoiceExists", "VoiceNotFound",
    "redis_errors",
]

log = logging.getLogger(__name__)

QuotaName = Literal["streams", "requests", "voices", "training_jobs", "pronunciations"]

# Error codes of replies that mean "Redis cannot take this command now; it will again".
REDIS_REFUSALS: Final = frozenset({"OOM", "MASTERDOWN", "READONLY", "LOADING", "BUSY", "NOREPLICAS", "TRYAGAIN",
                                   "CLUSTERDOWN"})
# Redis 6 reports an error raised inside a script as "ERR Error running script (...): @user_script:3: ... -OOM ...".
_SCRIPT_ERROR_CODE: Final = re.compile(r"-([A-Z]+) ")


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
    """Redis cannot be reached or refuses commands for now; keys verified in the last `auth_cache_s`
    keep working meanwhile."""

    retryable = True


class Busy(TenantError):
    """Every connection this gateway process holds to Redis stayed in use for longer than its pool
    waits (`redis_pool_wait_s`): the process is busier than its pool, Redis itself may be fine.
    Not `Unavailable`: nothing is served from the caches or left uncounted for it; the request is
    refused, to be retried."""

    retryable = True


class StoreError(TenantError):
    """Redis refused a command for a reason that does not pass by itself (a key of the wrong type under
    the tenant prefix, a missing permission): the operator's to fix, never the caller's."""


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


class InvalidPolicy(TenantError):
    """A tenant policy value outside its choices (consent, report gate, retention days)."""


class VoiceNotFound(TenantError):
    """The tenant has no voice of that name (the same error whoever else might own one)."""


class VoiceExists(TenantError):
    """The tenant already has a voice of that name."""


class PronunciationNotFound(TenantError):
    """The tenant has no pronunciation dictionary of that name (the same error whoever else has one)."""


class PronunciationExists(TenantError):
    """The tenant already has a pronunciation dictionary of that name."""


class PronunciationInUse(TenantError):
    """A voice has the dictionary as its default: it cannot be deleted until that voice is set without it."""


class InvalidPronunciation(TenantError):
    """A pronunciation dictionary (name, rules, size) or a request's list of them outside its bounds;
    `param` names the field."""

    def __init__(self, message: str, *, param: str = "rules") -> None:
        super().__init__(message)
        self.param = param


class QuotaExceeded(TenantError):
    """A tenant limit is reached. Retryable when `retry_after_s` is known (streams, requests)."""

    def __init__(self, message: str, *, limit: QuotaName, retry_after_s: float | None = None) -> None:
        super().__init__(message, retryable=retry_after_s is not None)
        self.limit: QuotaName = limit
        self.retry_after_s = retry_after_s


def refusal_code(exc: redis.exceptions.RedisError) -> str | None:
    """The error code of a reply that says "not now" (one of REDIS_REFUSALS), else None."""
    text = str(exc)
    code = getattr(exc, "status_code", None) or text.split(" ", 1)[0]
    if code in REDIS_REFUSALS:
        return code
    inner = _SCRIPT_ERROR_CODE.findall(text) if "script" in text else []
    return inner[-1] if inner and inner[-1] in REDIS_REFUSALS else None


@contextmanager
def redis_errors() -> Iterator[None]:
    """Map redis-py errors raised inside the block to tenant errors (the one Redis boundary)."""
    try:
        yield
    except redis.exceptions.MaxConnectionsError as exc:  # before ConnectionError, its base class
        log.debug("the gateway is busier than its Redis pool: %s", exc)  # per request: its 503s are counted
        raise Busy("the gateway is busy: every one of its connections to the tenant store stayed in use; "
                   "try again in a moment") from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise Unavailable(f"the tenant store (Redis) is unreachable ({type(exc).__name__}); "
                          "try again in a few seconds") from exc
    except redis.exceptions.RedisError as exc:
        code = refusal_code(exc)
        if code is not None:
            log.warning("the tenant store (Redis) refuses commands for now (%s): %s", code, exc)
            raise Unavailable("the tenant store (Redis) is not taking commands for now; "
                              "try again in a few seconds") from exc
        log.error("the tenant store (Redis) refused a command: %r %s", exc, exc)
        raise StoreError(f"the tenant store (Redis) refused a command ({type(exc).__name__}); this is the "
                         "operator's to fix: the gateway's log has Redis's reply") from exc
