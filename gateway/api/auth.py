"""Who is calling, and may they: the API key -> tenant, the request window, a stream slot.

Limits are enforced here, where requests enter, once. While Redis is away, keys verified in the
last `auth_cache_s` keep working (the tenant layer's cache), and the request window and stream
slots, which live in Redis, are not counted: serving goes on for known keys rather than failing
every request; each such pass is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from fastapi import Request

from gateway.api.errors import from_tenant_error
from gateway.api.state import Gateway
from gateway.quotas import StreamSlot
from gateway.tenants import Tenant, TenantError, Unavailable

__all__ = ["authenticate", "bearer_key", "caller", "gateway_of", "resolve_and_admit", "take_stream_slot"]

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
    try:
        tenant = await gateway.tenants.authenticate(bearer_key(headers))
    except TenantError as exc:
        raise from_tenant_error(exc) from None
    try:
        await gateway.quotas.count_request(tenant)
    except Unavailable as exc:
        log.warning("request of tenant %s not counted against its rate limit: %s", tenant.id, exc.message)
    except TenantError as exc:
        raise from_tenant_error(exc) from None
    return tenant


async def caller(request: Request) -> Tenant:
    """FastAPI dependency: the authenticated tenant of this HTTP request."""
    return await authenticate(gateway_of(request), request.headers)


async def take_stream_slot(gateway: Gateway, tenant: Tenant) -> StreamSlot | None:
    """One of the tenant's concurrent stream slots, entered (the caller exits it), or None when
    Redis is away (the stream goes on uncounted). ApiError 429 when the tenant is at its limit."""
    slot = gateway.quotas.stream_slot(tenant)
    try:
        await slot.__aenter__()
    except Unavailable as exc:
        log.warning("stream of tenant %s not counted against its stream limit: %s", tenant.id, exc.message)
        return None
    except TenantError as exc:
        raise from_tenant_error(exc) from None
    return slot


async def resolve_and_admit(gateway: Gateway, tenant: Tenant, name: str):
    """The voice id and a stream slot, looked up together (two Redis round trips in parallel,
    not in a row: both sit before the first audio)."""
    resolved, admitted = await asyncio.gather(gateway.catalog.resolve(tenant, name), take_stream_slot(gateway, tenant),
                                              return_exceptions=True)
    if isinstance(resolved, BaseException) or isinstance(admitted, BaseException):
        if not isinstance(admitted, BaseException) and admitted is not None:
            await admitted.__aexit__(None, None, None)
        error = resolved if isinstance(resolved, BaseException) else admitted
        if isinstance(error, TenantError):
            raise from_tenant_error(error, param="voice") from None
        raise error
    return resolved, admitted
