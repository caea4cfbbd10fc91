"""A tenant's voice names -> the global voice ids the workers serve.

A name resolves to the tenant's own voice when it has one by that name (it must be `ready`), else
to a platform base voice of that name. The tenant lookup is keyed by (tenant id, name), so another
tenant's voice is simply absent: the same `VoiceNotFound`, after the same one Redis read, as a name
nobody uses.

While Redis is unreachable, names this gateway resolved in the last `cache_s` still resolve
(from memory, per tenant), and base voices always do: serving goes on for known callers.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from gateway.tenants import Tenant, TenantError, Tenants, TenantVoice, Unavailable, VoiceNotFound

__all__ = ["Catalog", "VoiceNotReady"]


class VoiceNotReady(TenantError):
    """The tenant's voice exists but cannot speak yet (training, warming up, or failed)."""

    def __init__(self, voice: TenantVoice) -> None:
        if voice.state == "failed":
            what = f"voice {voice.name!r} failed to train ({voice.note or 'see GET /v1/voices/' + voice.name}); " \
                   "delete it and upload again"
        else:
            what = f"voice {voice.name!r} is not ready yet ({voice.state}); GET /v1/voices/{voice.name} shows its progress"
        super().__init__(what, retryable=voice.state != "failed")
        self.voice = voice


class Catalog:
    def __init__(self, tenants: Tenants, base_voices: Collection[str], *, cache_s: float = 30.0,
                 max_entries: int = 10_000) -> None:
        self.tenants = tenants
        self.base_voices = tuple(base_voices)
        self.cache_s = cache_s
        self._max_entries = max_entries
        self._resolved: dict[tuple[str, str], tuple[str, float]] = {}  # (tenant id, name) -> (voice id, when)

    async def resolve(self, tenant: Tenant, name: str) -> str:
        """The voice id to send to the workers for `name`, as `tenant` says it."""
        try:
            voice = await self.tenants.voice(tenant, name)
        except VoiceNotFound:
            if name in self.base_voices:
                return name
            raise
        except Unavailable:
            return self._remembered(tenant, name)
        if voice.state != "ready":
            raise VoiceNotReady(voice)
        self._remember(tenant, name, voice.voice_id)
        return voice.voice_id

    def _remember(self, tenant: Tenant, name: str, voice_id: str) -> None:
        if len(self._resolved) >= self._max_entries:
            self._resolved.pop(next(iter(self._resolved)))
        self._resolved[(tenant.id, name)] = (voice_id, time.monotonic())

    def _remembered(self, tenant: Tenant, name: str) -> str:
        hit = self._resolved.get((tenant.id, name))
        if hit is not None and time.monotonic() - hit[1] <= self.cache_s:
            return hit[0]
        if name in self.base_voices:
            return name
        raise Unavailable("the voice directory (Redis) is unreachable and this voice was not used recently; "
                          "try again in a few seconds")
