"""Where the tenant layer keeps things in Redis: every key of tenants, quotas and usage under one prefix."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_PREFIX", "KeyLayout"]

DEFAULT_PREFIX: Final = "voicering:tenants"


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

    def pronunciations(self, tenant_id: str) -> str:  # HASH name -> {"name", "version", "rules"} (workers read it)
        return f"{self.tenant_base}{tenant_id}:pronunciations"

    def pronunciation_index(self, tenant_id: str) -> str:  # HASH name -> {"name", "version", "rules": count, ...}
        return f"{self.tenant_base}{tenant_id}:pronunciation_index"

    def voice_pronunciations(self, tenant_id: str) -> str:  # HASH voice name -> JSON list of dictionary names
        return f"{self.tenant_base}{tenant_id}:voice_pronunciations"

    def streams(self, tenant_id: str) -> str:  # ZSET slot token -> lease expiry (Redis clock)
        return f"{self.tenant_base}{tenant_id}:streams"

    def requests(self, tenant_id: str) -> str:  # ZSET request token -> time (the last minute)
        return f"{self.tenant_base}{tenant_id}:requests"

    def training(self, tenant_id: str) -> str:  # SET job ids holding a training slot
        return f"{self.tenant_base}{tenant_id}:training"

    def usage(self, tenant_id: str) -> str:  # HASH audio_seconds, training_minutes, requests
        return f"{self.tenant_base}{tenant_id}:usage"
