"""The worker's side of pronunciation dictionaries: references on the wire, the bounded cache that
reads them from the session's real Redis by version, and a context's refusals."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import redis.asyncio as aioredis

from gpu_worker.context import Context, ContextDeps, spoken
from gpu_worker.engine import SamplingOptions
from gpu_worker.errors import BadMessage, BadRequest, PronunciationNotFound, PronunciationsUnavailable
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.pronunciations import PronunciationCache
from gpu_worker.protocol import MAX_PRONUNCIATIONS, ContextOptions, PronunciationRef, Start, encode, parse_client
from gpu_worker.text.dictionary import MAX_RULES, Dictionary, PronunciationRule

pytestmark = pytest.mark.timeout(60)


def stored(name: str, rules: list[dict]) -> tuple[str, str]:
    """The record the gateway writes (gateway.tenants.pronunciations) and its version."""
    d = Dictionary.from_json({"name": name, "rules": rules})
    return json.dumps({"name": name, "version": d.version, **d.to_json()}), d.version


@pytest.fixture
async def redis(redis_url):
    client = aioredis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def key() -> str:
    return f"test:pron:{uuid.uuid4().hex[:8]}:t:t_abcdefghij:pronunciations"


async def test_a_replaced_dictionary_is_read_by_the_next_request(redis, redis_url, key):
    record, v1 = stored("names", [{"written": "Who", "spoken": "Hoo"}])
    await redis.hset(key, "names", record)
    cache = PronunciationCache(aioredis.from_url(redis_url, decode_responses=True), capacity=4)
    try:
        first = await cache.get(PronunciationRef(key, "names", v1))
        assert spoken("Dr. Who", first) == "Doctor Hoo"
        assert await cache.get(PronunciationRef(key, "names", v1)) is first and (cache.hits, cache.misses) == (1, 1)
        record, v2 = stored("names", [{"written": "Who", "spoken": "Whom"}])
        await redis.hset(key, "names", record)
        began = time.perf_counter()
        second = await cache.get(PronunciationRef(key, "names", v2))  # the next request names the new version
        seen_ms = (time.perf_counter() - began) * 1000
        assert spoken("Dr. Who", second) == "Doctor Whom" and v2 != v1
        print(f"a replaced 1-rule dictionary read by the next request in {seen_ms:.2f} ms (one HGET)")
        # a request routed before the replace, read after: the newer rules
        record, v3 = stored("names", [{"written": "Who", "spoken": "Hue"}])
        await redis.hset(key, "names", record)
        assert spoken("Who", await cache.get(PronunciationRef(key, "names", v1))) == "Hoo"  # v1 is still held
        assert spoken("Who", await cache.get(PronunciationRef(key, "names", "ffff"))) == "Hue"
        await redis.hdel(key, "names")
        with pytest.raises(PronunciationNotFound, match="was deleted"):
            await cache.get(PronunciationRef(key, "names", "eeee"))
    finally:
        await cache.aclose()


async def test_a_large_dictionary_is_fetched_once_and_the_cache_is_bounded(redis, redis_url, key):
    rules = [{"written": f"word{i}", "spoken": f"spoken {i}"} for i in range(MAX_RULES)]
    record, version = stored("big", rules)
    await redis.hset(key, "big", record)
    metrics = WorkerMetrics()
    cache = PronunciationCache(aioredis.from_url(redis_url, decode_responses=True), capacity=2, metrics=metrics)
    try:
        ref = PronunciationRef(key, "big", version)
        began = time.perf_counter()
        got = await asyncio.gather(*(cache.get(ref) for _ in range(20)))  # 20 contexts at once: one fetch
        fetch_ms = (time.perf_counter() - began) * 1000
        assert cache.misses == 1 and all(g is got[0] for g in got) and len(got[0].rules) == MAX_RULES
        print(f"a {MAX_RULES}-rule dictionary ({len(record):,} bytes) fetched and validated in {fetch_ms:.1f} ms")
        for i in range(3):
            r, v = stored(f"d{i}", [{"written": "a", "spoken": f"b{i}"}])
            await redis.hset(key, f"d{i}", r)
            await cache.get(PronunciationRef(key, f"d{i}", v))
        assert len(cache) == 2  # least recently used dropped first
        lookups = metrics.pronunciation_lookups
        assert (lookups.labels("miss")._value.get(), lookups.labels("hit")._value.get()) == (4, 19)
        assert metrics.pronunciations_held._value.get() == 2
    finally:
        await cache.aclose()


async def test_merge_order_and_the_combined_bound(redis, redis_url, key):
    a, va = stored("a", [{"written": "Who", "spoken": "Hoo"}])
    b, vb = stored("b", [{"written": "who", "spoken": "Hu"}, {"written": "SQL", "spoken": "sequel"}])
    await redis.hset(key, mapping={"a": a, "b": b})
    cache = PronunciationCache(aioredis.from_url(redis_url, decode_responses=True))
    try:
        merged = await cache.dictionary([PronunciationRef(key, "a", va), PronunciationRef(key, "b", vb)])
        assert spoken("Who wrote SQL?", merged) == "Hoo wrote sequel?"  # the first named wins
        merged = await cache.dictionary([PronunciationRef(key, "b", vb), PronunciationRef(key, "a", va)])
        assert spoken("Who wrote SQL?", merged) == "Hu wrote sequel?"
        assert await cache.dictionary([]) is None
    finally:
        await cache.aclose()


async def test_an_unreachable_redis_is_a_retryable_error(key):
    cache = PronunciationCache(aioredis.from_url("redis://127.0.0.1:1", decode_responses=True,
                                                 socket_connect_timeout=0.5))
    try:
        with pytest.raises(PronunciationsUnavailable) as err:
            await cache.get(PronunciationRef(key, "x", "ab"))
        assert err.value.retryable and "unreachable" in err.value.message
    finally:
        await cache.aclose()


async def test_a_damaged_record_is_not_retryable(redis, redis_url, key):
    await redis.hset(key, "bad", '{"name": "bad", "rules": [{"written": "<x>", "spoken": "y"}]}')
    cache = PronunciationCache(aioredis.from_url(redis_url, decode_responses=True))
    try:
        with pytest.raises(PronunciationsUnavailable, match="damaged") as err:
            await cache.get(PronunciationRef(key, "bad", "ab"))
        assert not err.value.retryable
    finally:
        await cache.aclose()


def test_references_travel_on_the_wire_and_are_left_off_when_absent():
    ref = PronunciationRef("p:t:t_abcdefghij:pronunciations", "names", "0123456789abcdef")
    start = Start("c1", "tara", "hi", ContextOptions(seed=1, pronunciations=(ref,)))
    assert parse_client(encode(start)) == start
    plain = encode(Start("c1", "tara", "hi"))
    assert "pronunciations" not in plain  # older workers accept the start unchanged
    named = parse_client(json.dumps({"type": "start", "context_id": "c", "voice": "tara",
                                     "pronunciations": ["a", "b"]}))
    assert named.pronunciations == ("a", "b")


@pytest.mark.parametrize("options", [
    {"pronunciations": [{"key": "voicering:tenants:t:t_x:apikeys", "name": "a", "version": "ab"}]},
    {"pronunciations": [{"key": "k:pronunciations", "name": "bad name", "version": "ab"}]},
    {"pronunciations": [{"key": "k:pronunciations", "name": "a", "version": "XYZ"}]},
    {"pronunciations": [{"key": "k:pronunciations", "name": "a"}]},
    {"pronunciations": [{"key": "k:pronunciations", "name": "a", "version": "ab"}] * (MAX_PRONUNCIATIONS + 1)},
    {"pronunciations": "a"},
])
def test_malformed_references_are_refused(options):
    with pytest.raises(BadMessage):
        parse_client(json.dumps({"type": "start", "context_id": "c", "voice": "tara", "options": options}))


@pytest.mark.parametrize("names", [["a"] * 2, ["a"] * (MAX_PRONUNCIATIONS + 1), [1], ["bad name"], "a"])
def test_malformed_names_are_refused(names):
    with pytest.raises(BadMessage):
        parse_client(json.dumps({"type": "start", "context_id": "c", "voice": "tara", "pronunciations": names}))


def deps(cache=None) -> ContextDeps:
    return ContextDeps(engine=None, runner=None, defaults=SamplingOptions(), pronunciations=cache)  # type: ignore[arg-type]


async def test_a_worker_without_redis_refuses_a_start_naming_dictionaries():
    async def send(_): ...

    ref = PronunciationRef("p:t:t_abcdefghij:pronunciations", "names", "ab")
    with pytest.raises(PronunciationsUnavailable, match="no Redis") as err:
        Context(Start("c", "tara", "hi", ContextOptions(pronunciations=(ref,))), deps(), send)
    assert err.value.code == "pronunciations_unavailable" and not err.value.retryable
    with pytest.raises(BadRequest, match="only the gateway resolves"):
        Context(Start("c", "tara", "hi", pronunciations=("names",)), deps(), send)
    Context(Start("c", "tara", "hi"), deps(), send)  # no dictionaries: no Redis needed


def test_the_dictionary_applies_before_normalization_and_without_it():
    d = Dictionary("d", (PronunciationRule("Who", "Hoo"), PronunciationRule("km", "klicks", case_sensitive=True)))
    assert spoken("Dr. Who ran 5 km.", d) == "Doctor Hoo ran five klicks."
    assert spoken("Dr. Who ran 5 km.", d, normalizes=False) == "Dr. Hoo ran 5 klicks."
    assert spoken("Dr. Who ran 5 km.") == "Doctor Who ran five kilometers."
