"""Who is calling, and may they: the API key -> tenant, the request window, a stream slot.

Limits are enforced here, where requests enter, once. While Redis is away, keys verified in the
last `auth_cache_s` keep working (the tenant layer's cache), and the request window and stream
slots, which live in Redis, are not counted: serving goes on for known keys rather than failing
every request; each such pass is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from fastapi import Request

from gateway.api.errors import from_tenant_error
from gateway.api.state import Gateway
from gateway.quotas import StreamSlot
from gateway.tenants import Tenant, TenantError, Unavailable
from gpu_worker.protocol import PronunciationRef

__all__ = ["authenticate", "bearer_key", "caller", "count_request", "gateway_of", "identify", "resolve_and_admit",
           "resolve_speech", "take_stream_slot"]

log = logging.getLogger(__name__)


def gateway_of(request) -> Gateway:  # Request or WebSocket
    return request.app.state.gateway


def bearer_key(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" else None


async def authenticate(gateway: Gateway, headers: Mapping[str, str]) -> Tenant:
    """The tenant of the request's key, its request counted (ApiError 401/429/503 otherwise)."""
    tenant = await identify(gateway, bearer_key(headers))
    await count_request(gateway, tenant)
    return tenant


async def identify(gateway: Gateway, key: str | None) -> Tenant:
    """The tenant `key` opens, as Redis holds it now (its current limits); ApiError 401/503 otherwise."""
    try:
        return await gateway.tenants.authenticate(key)
    except TenantError as exc:
        raise from_tenant_error(exc) from None


async def count_request(gateway: Gateway, tenant: Tenant) -> None:
    """Count one request against the tenant's rate limit (ApiError 429 past it; uncounted while Redis is away)."""
    try:
        await gateway.quotas.count_request(tenant)
    except Unavailable as exc:
        log.warning("request of tenant %s not counted against its rate limit: %s", tenant.id, exc.message)
    except TenantError as exc:
        raise from_tenant_error(exc) from None


async def caller(request: Request) -> Tenant:
    """FastAPI dependency: the authenticated tenant of this HTTP request."""
    return await authenticate(gateway_of(request), request.headers)


async def take_stream_slot(gateway: Gateway, tenant: Tenant) -> StreamSlot | None:
    """One of the tenant's concurrent stream slots, entered (the caller exits it), or None when
    Redis is away (the stream goes on uncounted). ApiError 429 when the tenant is at its limit."""
    slot = gateway.quotas.stream_slot(tenant)
    try:
        await slot.__aenter__()
    except asyncio.CancelledError:  # Redis may have taken it already: free it now, not when its lease lapses
        await asyncio.shield(slot.__aexit__(None, None, None))
        raise
    except Unavailable as exc:
        log.warning("stream of tenant %s not counted against its stream limit: %s", tenant.id, exc.message)
        return None
    except TenantError as exc:
        raise from_tenant_error(exc) from None
    return slot


async def resolve_and_admit(gateway: Gateway, tenant: Tenant, name: str) -> tuple[str, StreamSlot | None]:
    """The voice id and a stream slot, looked up together (two Redis round trips in parallel,
    not in a row: both sit before the first audio). However it ends without returning (an error,
    or the caller cancelled at any point), a slot taken meanwhile is freed: its renewer would
    otherwise keep it forever."""
    admit = asyncio.create_task(take_stream_slot(gateway, tenant), name=f"stream-admit:{tenant.id}")
    try:
        try:
            voice_id = await gateway.catalog.resolve(tenant, name)
        except TenantError as exc:
            raise from_tenant_error(exc, param="voice") from None
        return voice_id, await admit
    except BaseException:
        await asyncio.shield(_free_taken(admit))
        raise


async def _free_taken(admit: asyncio.Task[StreamSlot | None]) -> None:
    """Stop a slot request; free the slot if it got one."""
    admit.cancel()
    await asyncio.wait([admit])
    if not admit.cancelled() and admit.exception() is None and (slot := admit.result()) is not None:
        await slot.__aexit__(None, None, None)


async def resolve_speech(gateway: Gateway, tenant: Tenant, name: str, pronunciations: Sequence[str] | None
                         ) -> tuple[str, StreamSlot | None, tuple[PronunciationRef, ...]]:
    """`resolve_and_admit`, and the references the worker reads the request's dictionaries by
    (`pronunciations`; None: the voice's default ones), looked up beside it, not after it. ApiError
    404 for a name the tenant does not have (another tenant's is as absent as one nobody has), 400
    for a bad list, 503 while Redis is away (a dictionary is never skipped silently); a slot taken
    meanwhile is freed."""
    lookup = asyncio.create_task(_pronunciations(gateway, tenant, name, pronunciations), name=f"pronunciations:{tenant.id}")
    try:
        voice_id, slot = await resolve_and_admit(gateway, tenant, name)
    except BaseException:
        lookup.cancel()
        await asyncio.wait([lookup])
        raise
    try:
        return voice_id, slot, await lookup
    except BaseException:
        if slot is not None:
            await asyncio.shield(slot.__aexit__(None, None, None))
        raise


async def _pronunciations(gateway: Gateway, tenant: Tenant, voice: str,
                          names: Sequence[str] | None) -> tuple[PronunciationRef, ...]:
    if names is not None and len(names) == 0:
        return ()  # the request asked for none: not even the voice's default (no Redis call)
    try:
        return await gateway.pronunciations.resolve_for(tenant, voice, names)
    except TenantError as exc:
        raise from_tenant_error(exc, param="pronunciations") from None
