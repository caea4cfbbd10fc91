"""`resolve_and_admit` against a real Redis (issue 19, M1): however a context's admission ends
without handing its slot over (the caller cancelled, the voice lookup failed), the stream slot
taken meanwhile is freed at once and its renewer stopped; before, a cancel landing while the
voice was still being resolved left the slot held, renewed forever.

The voice lookup is a stand-in that waits for the test to let it go (the one way to land a
cancel between "slot taken" and "voice resolved" every time); the slots are the real `Quotas`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from gateway.api.auth import resolve_and_admit
from gateway.api.errors import ApiError
from gateway.quotas import Quotas
from gateway.tenants import TenantLimits, VoiceNotFound

pytestmark = pytest.mark.timeout(60)


@dataclass
class HeldLookup:
    """A voice lookup that answers when released (or fails when told to)."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    fail: bool = False

    async def resolve(self, tenant, name: str) -> str:
        self.started.set()
        await self.release.wait()
        if self.fail:
            raise VoiceNotFound(f"no voice {name!r}")
        return f"global-{name}"


def renewers() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("stream-slot-renew:")]


@pytest.fixture
def quotas(client, prefix) -> Quotas:
    return Quotas(client, prefix, stream_lease_s=30.0)


async def slot_taken(quotas: Quotas, tenant) -> None:
    for _ in range(500):
        if await quotas.streams_in_use(tenant) == 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the stream slot was never taken")


async def test_a_cancel_while_the_voice_resolves_frees_the_slot(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=1))
    lookup = HeldLookup()
    gateway = SimpleNamespace(catalog=lookup, quotas=quotas)
    admitting = asyncio.create_task(resolve_and_admit(gateway, tenant, "tara"))
    await lookup.started.wait()
    await slot_taken(quotas, tenant)  # the slot is held in Redis; the voice is not resolved yet
    admitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitting
    assert await quotas.streams_in_use(tenant) == 0 and renewers() == []
    # and the tenant's one slot is free for its next stream
    lookup.release.set()
    voice_id, slot = await resolve_and_admit(gateway, tenant, "tara")
    assert voice_id == "global-tara" and await quotas.streams_in_use(tenant) == 1
    await slot.__aexit__(None, None, None)
    assert await quotas.streams_in_use(tenant) == 0 and renewers() == []


async def test_a_cancel_before_the_slot_is_taken_leaves_nothing(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=1))
    lookup = HeldLookup()
    gateway = SimpleNamespace(catalog=lookup, quotas=quotas)
    for _ in range(20):  # cancels landing at every point of the slot's take, as the loop schedules them
        admitting = asyncio.create_task(resolve_and_admit(gateway, tenant, "tara"))
        await asyncio.sleep(0)
        admitting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admitting
        assert await quotas.streams_in_use(tenant) == 0 and renewers() == []


async def test_a_failed_lookup_frees_the_slot_and_says_why(tenants, quotas):
    tenant, _ = await tenants.create("acme", TenantLimits(max_streams=1))
    lookup = HeldLookup(fail=True)
    gateway = SimpleNamespace(catalog=lookup, quotas=quotas)
    admitting = asyncio.create_task(resolve_and_admit(gateway, tenant, "nobody"))
    await slot_taken(quotas, tenant)
    lookup.release.set()
    with pytest.raises(ApiError) as refused:
        await admitting
    assert refused.value.status == 404 and refused.value.code == "voice_not_found"
    assert await quotas.streams_in_use(tenant) == 0 and renewers() == []
