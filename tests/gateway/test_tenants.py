"""gateway.tenants against a real Redis: tenants, API keys, authentication, tenant voices, Redis down."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import sys

import pytest
import redis

from gateway.tenants import (
    API_KEY,
    InvalidLimits,
    InvalidName,
    QuotaExceeded,
    Tenant,
    TenantExists,
    TenantLimits,
    TenantNotFound,
    TenantRevoked,
    Tenants,
    Unauthorized,
    Unavailable,
    VoiceExists,
    VoiceNotFound,
    connect_redis,
    key_digest,
)
from hashring.records import VOICE_ID, check_voice_id

pytestmark = pytest.mark.timeout(120)





def command_calls(url: str) -> dict[str, int]:
    """Calls per Redis command so far (scripts' inner commands included), leaving out this probe's own
    (the INFO and a new connection's HELLO / CLIENT SETINFO)."""
    stats = redis.Redis.from_url(url).info("commandstats")
    probe = {"cmdstat_info", "cmdstat_hello", "cmdstat_client"}
    return {name: s["calls"] for name, s in stats.items() if name not in probe}


@pytest.fixture
async def alone():
    """(Tenants, url) on a Redis of this test's own: command counts are server-wide, and the
    session Redis also serves the session worker's heartbeats and every gateway's ring refreshes."""
    from hashring.embedded import EmbeddedRedis

    async with EmbeddedRedis() as server:
        client = connect_redis(server.url, timeout_s=2.0)
        yield Tenants(client, "test:alone"), server.url
        await client.aclose()


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def dump(url: str, prefix: str) -> str:
    """Every key name and value under `prefix`, as one string."""
    r = redis.Redis.from_url(url, decode_responses=True)
    parts = []
    for name in r.scan_iter(match=f"{prefix}*"):
        parts.append(name)
        kind = r.type(name)
        if kind == "hash":
            parts += [x for pair in r.hgetall(name).items() for x in pair]
        elif kind == "set":
            parts += r.smembers(name)
        elif kind == "zset":
            parts += [m for m, _ in r.zrange(name, 0, -1, withscores=True)]
        elif kind == "string":
            parts.append(r.get(name))
        else:
            raise AssertionError(f"unexpected key type {kind} at {name}")
    return "\n".join(parts)


# -- tenants and keys ---------------------------------------------------------------------------------


async def test_create_authenticate_and_look_up(tenants):
    tenant, key = await tenants.create("acme", TenantLimits(max_streams=3))
    assert API_KEY.match(key) and tenant.name == "acme" and not tenant.revoked
    assert tenant.limits == TenantLimits(max_streams=3)
    assert await tenants.authenticate(key) == tenant
    assert await tenants.get("acme") == tenant == await tenants.get(tenant.id)
    other, _ = await tenants.create("beta")
    assert other.limits == TenantLimits()
    assert [t.name for t in await tenants.list()] == ["acme", "beta"]
    with pytest.raises(TenantNotFound, match="voicering tenant list"):
        await tenants.get("nobody")
    with pytest.raises(TenantNotFound):
        await tenants.get("t_aaaaaaaaaa")


async def test_tenant_ids_fit_in_voice_ids(tenants):
    ids = {(await tenants.create(f"id-{i}"))[0].id for i in range(20)}
    assert len(ids) == 20
    for tenant_id in ids:
        assert VOICE_ID.match(f"{tenant_id}/tara") and len(tenant_id) == 12


@pytest.mark.parametrize("name", ["", "Acme", "t_mine", "-acme", "a b", "a/b", "x" * 64, "é", "acme\n"])
async def test_unusable_tenant_names_are_refused(tenants, name):
    with pytest.raises(InvalidName, match="lowercase letters"):
        await tenants.create(name)


async def test_names_are_unique_even_under_concurrent_creates(tenants):
    results = await asyncio.gather(*(tenants.create("rush") for _ in range(25)), return_exceptions=True)
    winners = [r for r in results if isinstance(r, tuple)]
    assert len(winners) == 1
    assert all(isinstance(r, TenantExists) for r in results if not isinstance(r, tuple))
    assert [t.id for t in await tenants.list()] == [winners[0][0].id]
    with pytest.raises(TenantExists, match="pick another name"):
        await tenants.create("rush")


async def test_new_key_and_revoke(tenants):
    tenant, first = await tenants.create("acme")
    second = await tenants.new_key("acme")
    assert second != first
    assert await tenants.authenticate(first) == await tenants.authenticate(second) == tenant
    survivor, survivor_key = await tenants.create("other")

    revoked = await tenants.revoke(tenant.id)
    assert revoked.revoked and (await tenants.get("acme")).revoked
    for key in (first, second):
        with pytest.raises(Unauthorized):
            await tenants.authenticate(key)
    with pytest.raises(TenantRevoked, match="create a new tenant"):
        await tenants.new_key("acme")
    assert await tenants.authenticate(survivor_key) == survivor
    with pytest.raises(TenantNotFound):
        await tenants.revoke("nobody")


async def test_set_limits(tenants):
    tenant, key = await tenants.create("acme")
    changed = await tenants.set_limits("acme", max_streams=2, max_voices=5)
    assert changed.limits == dataclasses.replace(tenant.limits, max_streams=2, max_voices=5)
    assert (await tenants.authenticate(key)).limits == changed.limits
    assert await tenants.set_limits("acme") == changed  # no change: just shows them
    with pytest.raises(InvalidLimits, match="unknown limit"):
        await tenants.set_limits("acme", max_streamz=2)
    with pytest.raises(InvalidLimits, match="positive whole number"):
        await tenants.set_limits("acme", max_streams=0)
    with pytest.raises(InvalidLimits):
        TenantLimits(max_voices=True)
    assert (await tenants.get("acme")).limits == changed.limits


async def test_keys_are_stored_only_as_hashes(tenants, redis_url, prefix):
    _, first = await tenants.create("acme")
    second = await tenants.new_key("acme")
    stored = dump(redis_url, prefix)
    for key in (first, second):
        assert key not in stored and key[3:] not in stored and key[3:20] not in stored
        assert key_digest(key) in stored
    await tenants.revoke("acme")
    assert key_digest(first) not in dump(redis_url, prefix)


async def test_unauthorized_is_one_message_that_never_echoes_the_key(tenants):
    tenant, key = await tenants.create("acme")
    revoked_key = await tenants.new_key("acme")
    await tenants.revoke("acme")
    _, live = await tenants.create("live")
    messages = set()
    for bad in (None, "", "hello", "vr_short", "vr_" + "A" * 43, live[:-1] + ("A" if live[-1] != "A" else "B"),
                revoked_key, key, "Bearer " + live):
        with pytest.raises(Unauthorized) as err:
            await tenants.authenticate(bad)
        assert not bad or bad not in err.value.message
        messages.add(err.value.message)
    assert len(messages) == 1 and "Authorization: Bearer" in messages.pop()


async def test_authentication_is_one_round_trip_whatever_the_key(alone):
    tenants, redis_url = alone
    _, key = await tenants.create("acme")
    await tenants.authenticate(key)  # the script is loaded now
    for candidate in (key, "vr_" + "A" * 43, "garbage"):
        before = command_calls(redis_url)
        with pytest.raises(Unauthorized) if candidate != key else contextlib.nullcontext():
            await tenants.authenticate(candidate)
        assert delta(before, command_calls(redis_url)).get("cmdstat_evalsha") == 1, candidate


# -- voices -------------------------------------------------------------------------------------------


async def test_register_look_up_update_and_delete_voices(tenants):
    tenant, _ = await tenants.create("acme")
    voice = await tenants.register_voice(tenant, "narrator.v1", consent="recorded statement #12", job_id="job-1")
    assert voice.voice_id == f"{tenant.id}/narrator.v1" == check_voice_id(voice.voice_id)
    assert VOICE_ID.match(voice.voice_id)
    assert await tenants.voice(tenant, "narrator.v1") == voice
    await tenants.register_voice(tenant, "alt", consent="form 7", job_id=None)
    assert [v.name for v in await tenants.voices(tenant)] == ["alt", "narrator.v1"]

    updated = await tenants.update_voice(tenant, "narrator.v1", job_id="job-2", note="training 40% done")
    assert (updated.job_id, updated.note, updated.consent) == ("job-2", "training 40% done", voice.consent)
    assert updated.created_at == pytest.approx(voice.created_at, abs=1e-3)
    assert (await tenants.update_voice(tenant, "narrator.v1", note=None)).note is None
    assert await tenants.voice(tenant, "narrator.v1") == dataclasses.replace(updated, note=None)
    with pytest.raises(Exception, match="cannot change voice_id"):
        await tenants.update_voice(tenant, "narrator.v1", voice_id="t_other/x")

    with pytest.raises(VoiceExists, match="delete it first"):
        await tenants.register_voice(tenant, "alt", consent="again", job_id=None)
    assert (await tenants.delete_voice(tenant, "alt")).name == "alt"
    for call in (tenants.voice(tenant, "alt"), tenants.delete_voice(tenant, "alt"),
                 tenants.update_voice(tenant, "alt", note="x")):
        with pytest.raises(VoiceNotFound):
            await call


@pytest.mark.parametrize("name", ["", "a/b", "../up", ".hidden", "-x", "sp ace", "x" * 129, "tab\t", "ok\n"])
async def test_unusable_voice_names_are_refused(tenants, name):
    tenant, _ = await tenants.create("acme")
    with pytest.raises(InvalidName, match="voice name"):
        await tenants.register_voice(tenant, name, consent="ok", job_id=None)


async def test_a_voice_needs_consent(tenants):
    tenant, _ = await tenants.create("acme")
    with pytest.raises(Exception, match="consent"):
        await tenants.register_voice(tenant, "v", consent="  ", job_id=None)


async def test_another_tenants_voice_looks_exactly_like_a_missing_one(alone):
    tenants, redis_url = alone
    owner, _ = await tenants.create("owner")
    snoop, _ = await tenants.create("snoop")
    await tenants.register_voice(owner, "secret", consent="ok", job_id=None)
    await tenants.voice(owner, "secret")

    def attempt(name: str) -> tuple[type, str, dict[str, int]]:
        async def run():
            before = command_calls(redis_url)
            with pytest.raises(VoiceNotFound) as err:
                await tenants.voice(snoop, name)
            return type(err.value), err.value.message.replace(name, "NAME"), delta(before, command_calls(redis_url))
        return run()

    theirs = await attempt("secret")
    missing = await attempt("nosuch")
    assert theirs == missing
    assert theirs[2] == {"cmdstat_hget": 1}
    with pytest.raises(VoiceNotFound):  # nor can the global id be used as a name
        await tenants.voice(snoop, f"{owner.id}/secret")


async def test_max_voices_holds_under_concurrent_registrations(tenants, client, prefix):
    tenant, _ = await tenants.create("acme", TenantLimits(max_voices=5))
    results = await asyncio.gather(
        *(tenants.register_voice(tenant, f"v{i}", consent="ok", job_id=None) for i in range(40)),
        return_exceptions=True)
    ok = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(ok) == 5 and len(await tenants.voices(tenant)) == 5
    assert all(isinstance(r, QuotaExceeded) and r.limit == "voices" and not r.retryable for r in refused)
    await tenants.delete_voice(tenant, ok[0].name)
    await tenants.register_voice(tenant, "late", consent="ok", job_id=None)


# -- Redis down ---------------------------------------------------------------------------------------


async def test_redis_down_recent_keys_still_work_unknown_keys_are_unavailable(redis_server, redis_url, prefix):
    client = connect_redis(redis_url, timeout_s=0.5)
    tenants = Tenants(client, prefix, auth_cache_s=1.0)
    tenant, key = await tenants.create("acme")
    _, never_used = await tenants.create("quiet")
    assert await tenants.authenticate(key) == tenant
    redis_server.stop()
    try:
        assert await tenants.authenticate(key) == tenant  # verified moments ago
        with pytest.raises(Unavailable) as err:
            await tenants.authenticate(never_used)
        assert err.value.retryable and never_used not in err.value.message
        with pytest.raises(Unavailable):
            await tenants.authenticate("vr_" + "B" * 43)
        with pytest.raises(Unauthorized):  # malformed: no need to ask Redis to refuse it
            await tenants.authenticate("not-a-key")
        with pytest.raises(Unavailable):
            await tenants.get("acme")
        await asyncio.sleep(1.2)  # past auth_cache_s: a revocation could have happened meanwhile
        with pytest.raises(Unavailable):
            await tenants.authenticate(key)
    finally:
        redis_server.start()
        await client.aclose()


async def test_a_revocation_is_honoured_at_once_while_redis_is_up(tenants):
    _, key = await tenants.create("acme")
    await tenants.authenticate(key)
    await tenants.revoke("acme")
    with pytest.raises(Unauthorized):
        await tenants.authenticate(key)


async def test_a_client_without_text_replies_is_refused(redis_url):
    raw = redis.asyncio.Redis.from_url(redis_url)
    with pytest.raises(ValueError, match="decode_responses"):
        Tenants(raw, "x")
    await raw.aclose()


# -- package boundary ---------------------------------------------------------------------------------

LIGHT = ["gateway", "gateway.settings", "gateway.tenants", "gateway.quotas", "gateway.usage", "gateway.cli"]


def test_gateway_modules_pull_in_no_torch_or_vllm():
    code = (f"import sys\nimport {', '.join(LIGHT)}\n"
            "print([m for m in ('torch', 'vllm', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", LIGHT)
def test_public_names_exist(module):
    mod = __import__(module, fromlist=["__all__"])
    assert sorted(mod.__all__) == sorted(set(mod.__all__))
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_tenant_record_is_frozen():
    tenant = Tenant("t_aaaaaaaaaa", "acme", TenantLimits(), 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tenant.name = "other"  # type: ignore[misc]
