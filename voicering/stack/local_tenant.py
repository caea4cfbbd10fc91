"""The tenant `voicering up` creates for the person at the keyboard, or reuses on the next start.

Reuse: the key kept in the folder still opens the tenant of that name -> the same key. The tenant
exists but the key does not open it (the file was lost, the key revoked) -> a new key for it.
No such tenant (a fresh Redis) -> created. Its limits are a local operator's: generous request
rate and streams (the demo polls training progress once a second).
"""

from __future__ import annotations

from gateway.settings import GatewaySettings
from voicering.stack.folder import LocalKey, StackFolder
from gateway.tenants import TenantLimits, TenantNotFound, Tenants, Unauthorized, connect_redis

__all__ = ["LOCAL_LIMITS", "ensure_local_tenant"]

LOCAL_LIMITS = TenantLimits(max_streams=32, requests_per_minute=6000, max_voices=50, max_training_jobs=2)


async def ensure_local_tenant(redis_url: str, name: str, folder: StackFolder) -> tuple[LocalKey, bool]:
    """(the tenant's key, whether it was created now)."""
    settings = GatewaySettings(redis_url=redis_url)  # the tenant prefix the gateway child reads too
    redis = connect_redis(redis_url, timeout_s=settings.redis_timeout_s)
    try:
        tenants = Tenants(redis, settings.tenant_prefix, auth_cache_s=0)
        kept = folder.read_key()
        if kept is not None and kept.tenant == name:
            try:
                if (await tenants.authenticate(kept.api_key)).id == kept.tenant_id:
                    return kept, False
            except Unauthorized:
                pass
        try:
            tenant = await tenants.get(name)
            key = LocalKey(tenant.id, name, await tenants.new_key(tenant.id))
            created = False
        except TenantNotFound:
            tenant, api_key = await tenants.create(name, LOCAL_LIMITS)
            key, created = LocalKey(tenant.id, name, api_key), True
        folder.write_key(key)
        return key, created
    finally:
        await redis.aclose()
