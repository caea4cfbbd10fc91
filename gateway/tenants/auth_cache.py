"""Keys Redis confirmed lately, so authentication survives a short Redis outage, and only that."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Final

from gateway.tenants.records import Tenant

__all__ = ["DEFAULT_AUTH_CACHE_S", "AuthCache"]

DEFAULT_AUTH_CACHE_S: Final = 30.0
_AUTH_CACHE_ENTRIES: Final = 10_000


class AuthCache:
    """Tenants by key digest, served only while Redis cannot be asked; bounded, oldest out first."""

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
