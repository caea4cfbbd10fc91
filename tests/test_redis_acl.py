"""The fleet's Redis users against a real redis-server started with `voicering redis-acl`'s file:
each component does what its process does (the library calls its process makes, as that user),
and is refused what belongs to another component; the default user is off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from gateway.quotas import Quotas
from gateway.settings import GatewaySettings
from gateway.tenants import DEFAULT_PREFIX, KeyLayout, Tenants, TenantError
from hashring.embedded import EmbeddedRedis
from hashring.errors import RingError
from hashring.placement import HeatRecorder, ReplicaControl
from hashring.presence import Announcer
from hashring.records import WorkerInfo
from hashring.settings import RingSettings
from hashring.store import RingStore
from lora_training.jobs import JobQueue, Lease
from lora_training.pipeline import JobSpec
from lora_training.settings import TrainSettings
from voicering.redis_acl import USERS, Prefixes, acl_file

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]
PASSWORDS = {u: f"{u}-password-0123456789" for u in USERS}


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    folder = tmp_path_factory.mktemp("acl")
    env = {**os.environ, **{f"VOICERING_REDIS_PASSWORD_{u.upper()}": p for u, p in PASSWORDS.items()}}
    made = subprocess.run([sys.executable, "-m", "voicering", "redis-acl"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert made.returncode == 0, made.stderr
    assert all(p not in made.stdout for p in PASSWORDS.values())  # only digests
    (folder / "users.acl").write_text(made.stdout)
    with EmbeddedRedis(args=("--aclfile", str(folder / "users.acl"))) as server:
        yield server


def url(server: EmbeddedRedis, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{server.port}/0"


def ring(server: EmbeddedRedis, user: str) -> RingStore:
    return RingStore(RingSettings(redis_url=url(server, user), redis_timeout_s=2.0))


def test_the_default_prefixes_are_the_packages_defaults():
    assert Prefixes() == Prefixes(RingSettings().prefix, DEFAULT_PREFIX, TrainSettings().queue_prefix)
    assert GatewaySettings().train_prefix == Prefixes().train


def test_a_missing_or_short_password_is_refused_by_name():
    with pytest.raises(ValueError, match="worker \\(VOICERING_REDIS_PASSWORD_WORKER\\)"):
        acl_file({**PASSWORDS, "worker": "short"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICERING_REDIS_PASSWORD_")}
    done = subprocess.run([sys.executable, "-m", "voicering", "redis-acl"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "VOICERING_REDIS_PASSWORD_GATEWAY" in done.stderr


def test_the_default_user_is_off(acl_redis):
    client = redis.Redis(port=acl_redis.port, socket_timeout=2)
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    client.close()


async def test_a_worker_runs_the_ring_and_touches_nothing_else(acl_redis):
    async with ring(acl_redis, "worker") as store:
        await store.register(WorkerInfo("w1", "ws://127.0.0.1:1", "ws://127.0.0.1:1"))
        assert await store.heartbeat("w1", 1, ["tara"]) == 0
        control = ReplicaControl(store)
        async with HeatRecorder(control) as heat:
            heat.record("tara")
            heat.refused("tara", raise_replicas=True)
        assert heat.last_error is None and heat.flushed == 1
        await control.cool()
        assert await store.acquire_lock("cool", "token", 5)
        sub = await store.subscribe()
        await sub.aclose()
        assert "w1" in (await store.snapshot()).live
        await store.set_draining("w1", True, own=True)
        await store.deregister("w1")
    client = aioredis.from_url(url(acl_redis, "worker"), decode_responses=True)
    with pytest.raises(TenantError):  # a tenant's key digest, its limits: not the worker's
        await Tenants(client).create("acme")
    with pytest.raises(redis.exceptions.NoPermissionError):
        await client.hset(f"{DEFAULT_PREFIX}:apikeys", "digest", "t_acme")
    # pronunciation dictionaries: the worker reads a tenant's hash by reference, and no other tenant key
    layout = KeyLayout(DEFAULT_PREFIX)
    assert await client.hget(layout.pronunciations("t_abcdefghij"), "names") is None
    for other in (layout.pronunciation_index("t_abcdefghij"), layout.voices("t_abcdefghij"),
                  layout.tenant("t_abcdefghij"), layout.tenant_keys("t_abcdefghij")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.hget(other, "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        await client.xadd(f"{Prefixes().train}:jobs", {"job": "x"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        await client.flushall()
    await client.aclose()


async def test_an_agent_reads_the_ring_and_announces_itself(acl_redis):
    async with ring(acl_redis, "agent") as store:
        await store.snapshot()
        await (await store.subscribe()).aclose()
        await Announcer(store, "agent", "agent-1", address="wss://lk.example").beat()
        client = aioredis.from_url(url(acl_redis, "agent"), decode_responses=True)
        with pytest.raises(TenantError):
            await Tenants(client).create("acme")
        await client.aclose()


def test_a_trainer_runs_jobs_and_touches_nothing_else(acl_redis, tmp_path):
    gateway = JobQueue.connect(url(acl_redis, "gateway"))
    trainer = JobQueue.connect(url(acl_redis, "trainer"))
    try:
        job = gateway.submit(JobSpec(name="nova", tenant="acme", audio=[tmp_path / "a.wav"]))
        taken = trainer.next("trainer-1", block_ms=100, claim_idle_ms=60_000)
        assert taken is not None and taken.job_id == job.job_id
        lease = Lease(trainer, job.job_id, "token-1", 30_000)
        assert lease.acquire()
        lease.update(state="training", progress=50.0, step=1, total_steps=2, consumer="trainer-1")
        lease.finish(taken, state="failed", error="test", error_code="test", consumer="trainer-1")
        assert gateway.status(job.job_id).state == "failed"
        client = redis.Redis.from_url(url(acl_redis, "trainer"), socket_timeout=2)
        for denied in (lambda: client.hset(f"{DEFAULT_PREFIX}:apikeys", "d", "t"),
                       lambda: client.zadd("voicering:ring:heartbeats", {"w9": 1.0}),
                       lambda: client.sadd("voicering:ring:draining", "w1")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
        client.close()
    finally:
        gateway.close()
        trainer.close()


async def test_a_gateway_runs_tenants_quotas_the_queue_and_the_ring(acl_redis):
    client = aioredis.from_url(url(acl_redis, "gateway"), decode_responses=True)
    try:
        tenants = Tenants(client)
        tenant, key = await tenants.create("acme")
        assert (await tenants.authenticate(key)).id == tenant.id
        await Quotas(client).count_request(tenant)
        async with ring(acl_redis, "gateway") as store:
            await store.snapshot()
            await Announcer(store, "gateway", "gw-1:8000").beat()
    finally:
        await client.aclose()


async def test_the_operator_may_do_anything(acl_redis):
    async with ring(acl_redis, "operator") as store:
        await store.snapshot()
    client = aioredis.from_url(url(acl_redis, "operator"))
    assert await client.config_get("appendonly")
    await client.aclose()


def test_a_ring_error_names_the_missing_permission(acl_redis):
    import asyncio

    async def trainer_reads_the_ring() -> None:
        async with ring(acl_redis, "trainer") as store:
            await store.snapshot()

    with pytest.raises(RingError, match="NOPERM|permission"):
        asyncio.run(trainer_reads_the_ring())
