"""The tenant layer's pronunciation dictionaries against the session's real Redis: create, list,
read, replace (a new version), delete; the bounds a hostile client meets (count, size, rules,
names), each refused with a clear error and nothing stored; tenants isolated; `resolve`."""

from __future__ import annotations

import json

import pytest

from gateway.tenants import (InvalidPronunciation, PronunciationExists, PronunciationInUse, PronunciationNotFound,
                             QuotaExceeded, TenantLimits)
from gateway.tenants.pronunciations import MAX_DICTIONARIES, MAX_DICTIONARY_BYTES, Pronunciations
from gpu_worker.protocol import MAX_PRONUNCIATIONS, PronunciationRef
from gpu_worker.text.dictionary import MAX_RULES, Dictionary

WHO = [{"written": "Who", "spoken": "Hoo"}]


@pytest.fixture
def store(client, prefix) -> Pronunciations:
    return Pronunciations(client, prefix)


@pytest.fixture
async def two(tenants):
    a, _ = await tenants.create("acme", TenantLimits())
    b, _ = await tenants.create("globex", TenantLimits())
    return a, b


async def stored_names(client, store, tenant) -> tuple[set[str], set[str]]:
    records = set(await client.hkeys(store.keys.pronunciations(tenant.id)))
    index = set(await client.hkeys(store.keys.pronunciation_index(tenant.id)))
    return records, index


async def test_create_list_get_replace_delete(store, two, client):
    a, _ = two
    made = await store.create(a, "names", WHO + [{"written": "SQL", "spoken": "sequel", "case_sensitive": True}])
    assert made.rules == 2 and made.version == Dictionary.from_json({"name": "names", "rules": WHO + [
        {"written": "SQL", "spoken": "sequel", "case_sensitive": True}]}).version
    assert [i.name for i in await store.list(a)] == ["names"]
    info, dictionary = await store.get(a, "names")
    assert info == made and dictionary.rules[1].case_sensitive and dictionary.rules[0].spoken == "Hoo"
    replaced = await store.replace(a, "names", [{"written": "Who", "spoken": "Whom"}])
    assert replaced.version != made.version and replaced.rules == 1
    assert replaced.created_at == pytest.approx(made.created_at) and replaced.updated_at >= made.updated_at
    _, dictionary = await store.get(a, "names")
    assert dictionary.rules[0].spoken == "Whom"
    # what a worker reads: the stored form, its version the rules' hash
    raw = json.loads(await client.hget(store.keys.pronunciations(a.id), "names"))
    assert raw["version"] == replaced.version == Dictionary.from_json(raw).version
    same = await store.replace(a, "names", [{"written": "Who", "spoken": "Whom"}])
    assert same.version == replaced.version  # the version is the rules': equal rules, equal version
    assert (await store.delete(a, "names")).name == "names"
    assert await store.list(a) == [] and await stored_names(client, store, a) == (set(), set())
    with pytest.raises(PronunciationNotFound):
        await store.get(a, "names")
    with pytest.raises(PronunciationNotFound):
        await store.replace(a, "names", WHO)
    with pytest.raises(PronunciationNotFound):
        await store.delete(a, "names")


async def test_tenants_are_isolated(store, two):
    a, b = two
    await store.create(a, "private", WHO)
    await store.create(b, "private", [{"written": "Who", "spoken": "Hu"}])  # the same name, another tenant: its own
    _, mine = await store.get(a, "private")
    _, theirs = await store.get(b, "private")
    assert mine.rules[0].spoken == "Hoo" and theirs.rules[0].spoken == "Hu"
    await store.create(a, "only-a", WHO)
    with pytest.raises(PronunciationNotFound) as missing:
        await store.get(b, "only-a")
    with pytest.raises(PronunciationNotFound) as nobody:
        await store.get(b, "nobody-has-this")
    assert str(missing.value).replace("only-a", "X") == str(nobody.value).replace("nobody-has-this", "X")
    with pytest.raises(PronunciationNotFound):
        await store.resolve(b, ["only-a"])
    with pytest.raises(PronunciationNotFound):
        await store.delete(b, "only-a")
    assert [i.name for i in await store.list(b)] == ["private"]
    refs = await store.resolve(a, ["only-a", "private"])
    assert all(r.key == store.keys.pronunciations(a.id) for r in refs) and [r.name for r in refs] == ["only-a", "private"]


async def test_count_per_tenant_is_bounded_and_nothing_more_is_stored(store, two, client):
    a, b = two
    for i in range(MAX_DICTIONARIES):
        await store.create(a, f"d{i}", WHO)
    with pytest.raises(QuotaExceeded) as full:
        await store.create(a, "one-more", WHO)
    assert full.value.limit == "pronunciations" and f"{MAX_DICTIONARIES}" in full.value.message
    records, index = await stored_names(client, store, a)
    assert len(records) == len(index) == MAX_DICTIONARIES and "one-more" not in records
    await store.create(b, "d0", WHO)  # another tenant's count is its own
    with pytest.raises(PronunciationExists):
        await store.create(b, "d0", WHO)


HOSTILE = [
    ("bad name", WHO, "name"),
    ("../x", WHO, "name"),
    ("x" * 65, WHO, "name"),
    ("", WHO, "name"),
    (7, WHO, "name"),
    ("ok", "not a list", "rules"),
    ("ok", [{"written": "a", "spoken": "b"}] * 2, "rules"),  # the same written form twice
    ("ok", [{"written": "a" * 101, "spoken": "b"}], "rules"),
    ("ok", [{"written": "one two three four five six seven", "spoken": "b"}], "rules"),
    ("ok", [{"written": "a", "spoken": "b" * 201}], "rules"),
    ("ok", [{"written": "a", "spoken": "<laugh>"}], "rules"),
    ("ok", [{"written": "a\x00", "spoken": "b"}], "rules"),
    ("ok", [{"written": "a", "spoken": "b", "ipa": "x"}], "rules"),
    ("ok", [{"written": "a"}], "rules"),
    ("ok", [{"written": "a", "spoken": "b", "case_sensitive": "yes"}], "rules"),
    ("ok", [["a", "b"]], "rules"),
    ("ok", [{"written": 5, "spoken": "b"}], "rules"),
    ("ok", [{"written": f"w{i}", "spoken": "b"} for i in range(MAX_RULES + 1)], "rules"),
    ("ok", [{"written": "a\ud800", "spoken": "b"}], "rules"),
]


@pytest.mark.parametrize(("name", "rules", "param"), HOSTILE)
async def test_hostile_dictionaries_are_refused_whole(store, two, client, name, rules, param):
    a, _ = two
    with pytest.raises(InvalidPronunciation) as refused:
        await store.create(a, name, rules)
    assert refused.value.param == param and len(refused.value.message) < 400
    assert await stored_names(client, store, a) == (set(), set())


async def test_stored_size_is_bounded(store, two, client):
    a, _ = two
    # 1,000 legal rules of 100 + 200 characters: ~370 KB stored, over the 256 KiB bound
    big = [{"written": f"{i:04d}" + "w" * 96, "spoken": "s" * 200} for i in range(MAX_RULES)]
    with pytest.raises(InvalidPronunciation, match="bytes stored"):
        await store.create(a, "big", big)
    assert await stored_names(client, store, a) == (set(), set())
    fits = big[: MAX_DICTIONARY_BYTES // 400]
    assert (await store.create(a, "fits", fits)).bytes <= MAX_DICTIONARY_BYTES


async def test_resolve_checks_the_list_and_the_rules_together(store, two):
    a, _ = two
    half = [{"written": f"w{i}", "spoken": "x"} for i in range(MAX_RULES // 2 + 1)]
    await store.create(a, "h1", half)
    await store.create(a, "h2", [{"written": f"v{i}", "spoken": "x"} for i in range(MAX_RULES // 2 + 1)])
    await store.create(a, "small", WHO)
    refs = await store.resolve(a, ["small", "h1"])
    assert refs == (PronunciationRef(store.keys.pronunciations(a.id), "small", refs[0].version),
                    PronunciationRef(store.keys.pronunciations(a.id), "h1", refs[1].version))
    with pytest.raises(InvalidPronunciation, match="together"):
        await store.resolve(a, ["h1", "h2"])
    for bad in (["small"] * 2, ["x"] * (MAX_PRONUNCIATIONS + 1), [5], ["bad name"], "small"):
        with pytest.raises(InvalidPronunciation) as refused:
            await store.resolve(a, bad)
        assert refused.value.param == "pronunciations"
    assert await store.resolve(a, []) == ()


def test_voicering_normalize_reads_a_tenant_s_dictionary(redis_url, prefix):
    """`voicering normalize TEXT --dictionary NAME --tenant T`: what a request naming it is read as."""
    import asyncio

    from typer.testing import CliRunner

    from gateway.tenants import Tenants, connect_redis
    from voicering.cli import app

    async def seed() -> None:
        client = connect_redis(redis_url, timeout_s=2.0)
        try:
            tenant, _ = await Tenants(client, prefix).create("cli-tenant")
            await Pronunciations(client, prefix).create(tenant, "names", WHO + [{"written": "SQL", "spoken": "sequel"}])
        finally:
            await client.aclose()

    asyncio.run(seed())
    runner = CliRunner()
    args = ["--tenant", "cli-tenant", "--redis", redis_url, "--tenant-prefix", prefix]
    result = runner.invoke(app, ["normalize", "Dr. Who wrote SQL in 1984.", "--dictionary", "names", *args])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Doctor Hoo wrote sequel in nineteen eighty-four.\n"
    result = runner.invoke(app, ["normalize", "-", "--dictionary", "names", *args], input="Who?\n\nSQL\n")
    assert result.exit_code == 0 and result.stdout.splitlines() == ["Hoo?", "", "sequel"]
    result = runner.invoke(app, ["normalize", "Who", "--dictionary", "nope", *args])
    assert result.exit_code == 2 and "no pronunciation dictionary named 'nope'" in result.output
    result = runner.invoke(app, ["normalize", "Who", "--dictionary", "names", "--tenant", "nobody", "--redis",
                                 redis_url, "--tenant-prefix", prefix])
    assert result.exit_code == 2 and "no tenant" in result.output
    result = runner.invoke(app, ["normalize", "Who", "--dictionary", "names"])
    assert result.exit_code == 2 and "go together" in result.output


async def test_a_voice_default_is_used_when_a_request_names_none(store, two, client):
    a, b = two
    await store.create(a, "names", WHO)
    await store.create(a, "tech", [{"written": "SQL", "spoken": "sequel"}])
    assert await store.resolve_for(a, "tara", None) == ()  # no default: none, and no error
    assert await store.set_voice_default(a, "tara", ["tech", "names"]) == ("tech", "names")
    assert await store.voice_default(a, "tara") == ("tech", "names")
    refs = await store.resolve_for(a, "tara", None)
    assert [r.name for r in refs] == ["tech", "names"]  # in the default's order
    assert [r.name for r in await store.resolve_for(a, "tara", ["names"])] == ["names"]  # the request's own list wins
    assert await store.resolve_for(a, "leo", None) == ()  # another voice has no default
    assert await store.resolve_for(b, "tara", None) == ()  # another tenant's voice of the same name neither
    # a default is checked like a request's list, and names only dictionaries that exist
    with pytest.raises(PronunciationNotFound):
        await store.set_voice_default(a, "leo", ["nope"])
    with pytest.raises(InvalidPronunciation):
        await store.set_voice_default(a, "leo", ["names", "names"])
    assert await store.voice_default(a, "leo") == ()
    # a dictionary a voice has as its default is not deleted: the default would name a missing one
    with pytest.raises(PronunciationInUse) as refused:
        await store.delete(a, "tech")
    assert "'tara'" in refused.value.message and "PUT /v1/voices/tara/pronunciations" in refused.value.message
    assert [i.name for i in await store.list(a)] == ["names", "tech"]
    # a replaced rule set is what the default resolves to next (the version moves)
    before = (await store.resolve_for(a, "tara", None))[0].version
    await store.replace(a, "tech", [{"written": "SQL", "spoken": "ess queue ell"}])
    assert (await store.resolve_for(a, "tara", None))[0].version != before
    assert await store.set_voice_default(a, "tara", []) == ()  # removed
    assert await client.hget(store.keys.voice_pronunciations(a.id), "tara") is None
    await store.delete(a, "tech")  # no longer anyone's default
    assert [i.name for i in await store.list(a)] == ["names"]


async def test_deleting_a_voice_forgets_its_default(store, two, tenants, client):
    a, _ = two
    await store.create(a, "names", WHO)
    await tenants.register_voice(a, "mine", consent="the creator's own recording")
    await store.set_voice_default(a, "mine", ["names"])
    await tenants.delete_voice(a, "mine")
    assert await store.voice_default(a, "mine") == ()
    await store.delete(a, "names")  # the deleted voice's default does not hold it
