"""Membership and placement against a real redis-server: join, leave, drain, expiry, two reader
processes, Redis killed and restarted, operator and automatic replicas, odd voice ids."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import sys
from contextlib import AsyncExitStack, suppress
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from hashring.errors import RingUnavailable, UnknownWorker
from hashring.membership import Heartbeat, RingWatcher
from hashring.placement import ReplicaControl, place, route
from hashring.records import WorkerInfo
from hashring.redis_client import redact_url
from hashring.settings import RingSettings
from hashring.store import RingStore

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def info(i: int, **kw) -> WorkerInfo:
    return WorkerInfo(f"w{i}", f"ws://127.0.0.1:{7000 + i}", f"http://127.0.0.1:{8000 + i}", **kw)


def members(watcher: RingWatcher) -> set[str]:
    return {n.id for n in watcher.view.ring.nodes}


async def start_workers(stack: AsyncExitStack, store: RingStore, count: int) -> list[Heartbeat]:
    return [await stack.enter_async_context(Heartbeat(store, info(i))) for i in range(count)]


async def test_join_drain_undrain_leave_each_bump_the_epoch(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        watcher = await stack.enter_async_context(RingWatcher(store))
        assert len(watcher.view.ring) == 0 and watcher.view.epoch == 0
        beats = await start_workers(stack, store, 3)
        view = await watcher.wait_for(lambda v: len(v.ring) == 3, 5)
        assert view.epoch == 3 and view.workers["w1"].info.ws_url == "ws://127.0.0.1:7001"
        assert watcher.staleness_s < 2 and not watcher.stale

        assert await beats[1].set_draining() == 4
        view = await watcher.wait_for(lambda v: "w1" not in v.ring, 5)
        assert view.workers["w1"].status == "draining" and view.epoch == 4
        assert await store.set_draining("w1", True) == 0  # already draining: no change, no bump
        assert all(o != "w1" for k in range(200) for o in place(view, f"v{k}", ring_settings).owners)

        assert await store.set_draining("w1", False) == 5
        await watcher.wait_for(lambda v: "w1" in v.ring, 5)

        await beats[2].aclose()  # graceful leave
        view = await watcher.wait_for(lambda v: "w2" not in v.workers, 5)
        assert view.epoch == 6 and members(watcher) == {"w0", "w1"}


async def test_a_worker_that_died_while_draining_itself_comes_back_but_an_operator_drain_stays(ring_settings):
    """A worker drains itself on SIGTERM and leaves the ring when done; killed before it left (its
    grace ran out, OOM, Redis away), its next registration (same id: a StatefulSet pod) must not
    find it still drained. An operator's `voicering ring drain` must survive any restart, a clean one too."""
    async with RingStore(ring_settings) as store:
        snapshot = store.snapshot
        own = Heartbeat(store, info(0))
        await own.start()
        await own.set_draining()  # its own shutdown drain ...
        await own.aclose(deregister=False)  # ... and then it died without leaving
        assert "w0" in (await snapshot()).draining
        again = Heartbeat(store, info(0))
        await again.start()
        assert "w0" not in (await snapshot()).draining  # back in placement

        await store.set_draining("w0", True)  # the operator drains it
        await again.aclose(deregister=False)
        restarted = Heartbeat(store, info(0))
        await restarted.start()
        assert "w0" in (await snapshot()).draining  # still drained after a restart

        await store.set_draining("w0", False)
        await restarted.aclose(deregister=False)
        self_then_operator = Heartbeat(store, info(0))
        await self_then_operator.start()
        await self_then_operator.set_draining()
        assert await store.set_draining("w0", True) == 0  # the operator drains it too: now it is theirs
        await self_then_operator.aclose(deregister=False)
        last = Heartbeat(store, info(0))
        await last.start()
        assert "w0" in (await snapshot()).draining
        await last.aclose()  # a clean leave (a rollout, `kubectl delete pod`) keeps the operator's drain ...
        assert "w0" in (await snapshot()).draining and "w0" not in (await snapshot()).workers
        clean = Heartbeat(store, info(0))
        await clean.start()
        assert "w0" in (await snapshot()).draining  # ... so the pod comes back drained
        await store.set_draining("w0", False)
        await clean.set_draining()  # its own shutdown drain ...
        await clean.aclose()  # ... is forgotten with a clean leave
        back = Heartbeat(store, info(0))
        await back.start()
        assert "w0" not in (await snapshot()).draining
        await store.set_draining("w0", True)
        await back.aclose()
        assert await store.set_draining("w0", False) > 0  # scaled away for good: undrained while gone
        assert "w0" not in (await snapshot()).draining and "w0" not in (await snapshot()).workers
        with pytest.raises(UnknownWorker):  # and only a listed drain can be cleared so
            await store.set_draining("w0", False)


async def test_changes_arrive_by_pubsub_well_before_the_refresh_interval(ring_settings):
    slow = dataclasses.replace(ring_settings, refresh_interval_s=30.0)
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(slow))
        watcher = await stack.enter_async_context(RingWatcher(store))
        await asyncio.sleep(0.2)  # let the listener subscribe
        await start_workers(stack, store, 2)
        await watcher.wait_for(lambda v: len(v.ring) == 2, 2)
        await store.set_draining("w0", True)
        await watcher.wait_for(lambda v: "w0" not in v.ring, 2)


async def test_a_lost_message_costs_at_most_one_refresh(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        watcher = await stack.enter_async_context(RingWatcher(store))
        raw = aioredis.from_url(ring_settings.redis_url)
        stack.push_async_callback(raw.aclose)
        # Write an operator replica count without publishing: as if the message were lost.
        await raw.hset(store.keys.replicas, "tara", 3)
        await watcher.wait_for(lambda v: v.replicas.get("tara") == 3, ring_settings.refresh_interval_s + 1.0)


async def test_silent_worker_leaves_within_ttl_plus_one_refresh(ring_settings):
    s = ring_settings
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beats = await start_workers(stack, store, 2)
        await watcher.wait_for(lambda v: len(v.ring) == 2, 5)

        await asyncio.sleep(3 * s.heartbeat_ttl_s)  # heartbeating workers are never reaped
        assert members(watcher) == {"w0", "w1"}

        loop = asyncio.get_running_loop()
        await beats[0].aclose(deregister=False)  # crash: no goodbye
        silent_since = loop.time()
        view = await watcher.wait_for(lambda v: "w0" not in v.ring, 10)
        took = loop.time() - silent_since
        assert took <= s.heartbeat_ttl_s + s.refresh_interval_s + 0.5, took  # 0.5 s slack for a busy CI box
        assert took >= s.heartbeat_ttl_s - s.heartbeat_interval_s - 0.05, took  # not reaped early
        assert view.workers["w0"].status == "down"

        # It comes back by heartbeating again: the reaper had bumped the epoch, so does its return.
        assert await store.heartbeat("w0", 0) > view.epoch
        await watcher.wait_for(lambda v: "w0" in v.ring, 5)


async def test_long_dead_worker_is_forgotten(ring_settings):
    s = dataclasses.replace(ring_settings, forget_after_s=1.0)
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beat = Heartbeat(store, info(5))
        await beat.start()
        await watcher.wait_for(lambda v: "w5" in v.ring, 5)
        await beat.aclose(deregister=False)
        await watcher.wait_for(lambda v: "w5" not in v.workers, 5)
        assert await store.heartbeat("w5", 0) == -1  # must register again


async def test_unknown_worker_drain_is_a_clear_non_retryable_error(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        await start_workers(stack, store, 2)
        with pytest.raises(UnknownWorker) as err:
            await store.set_draining("w9", True)
        assert not err.value.retryable
        assert "'w9' is not registered" in err.value.message and "w0, w1" in err.value.message


async def test_two_reader_processes_compute_the_same_owners(ring_settings):
    voices = ["tara", "leo", "voix française", "名前 🎤", "a:b {c}*", "hot"]
    reader = (
        "import asyncio, json, sys\n"
        "from hashring.settings import RingSettings\n"
        "from hashring.store import RingStore\n"
        "from hashring.membership import RingWatcher\n"
        "from hashring.placement import place\n"
        "async def main(url, prefix, vnodes, voices):\n"
        "    s = RingSettings(redis_url=url, prefix=prefix, vnodes=int(vnodes))\n"
        "    async with RingStore(s) as store, RingWatcher(store) as w:\n"
        "        v = w.view\n"
        "        owners = {x: list(place(v, x, s).owners) for x in voices}\n"
        "        print(json.dumps({'epoch': v.epoch, 'digest': v.ring.digest(), 'owners': owners}))\n"
        "asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))\n"
    )
    s = ring_settings
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        await start_workers(stack, store, 5)
        await ReplicaControl(store).scale("hot", 3)
        watcher = await stack.enter_async_context(RingWatcher(store))
        view = watcher.view
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", reader, s.redis_url, s.prefix, str(s.vnodes), json.dumps(voices),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO, env=env)
            for _ in range(2)
        ]
        outputs = await asyncio.gather(*(p.communicate() for p in procs))
        results = []
        for proc, (out, err) in zip(procs, outputs):
            assert proc.returncode == 0, err.decode()
            results.append(json.loads(out))
        mine = {x: list(place(view, x, s).owners) for x in voices}
        assert results[0] == results[1] == {"epoch": view.epoch, "digest": view.ring.digest(), "owners": mine}
        assert len(mine["hot"]) == 3


async def test_redis_killed_and_restarted_readers_serve_from_cache_then_resync(ring_settings, redis_server):
    # The reader holds its ring for up to one TTL while the workers register again one by one
    # (tests/hashring/test_outage.py); 3 s of it covers three re-registrations on a loaded CI box.
    s = dataclasses.replace(ring_settings, heartbeat_ttl_s=3.0)
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)  # leave the shared server running whatever happens
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        await start_workers(stack, store, 3)
        before = await watcher.wait_for(lambda v: len(v.ring) == 3, 5)
        target = route(before, "tara", s).id

        smallest = [3]

        async def sample() -> None:  # the ring a request would see, every 20 ms
            while True:
                smallest[0] = min(smallest[0], len(watcher.view.ring))
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample(), name="sample-ring")
        stack.push_async_callback(_cancel, sampler)

        redis_server.kill()
        await asyncio.sleep(2 * s.refresh_interval_s + 0.3)
        assert watcher.stale and watcher.staleness_s > s.refresh_interval_s
        assert isinstance(watcher.last_error, RingUnavailable)
        assert watcher.view.ring.digest() == before.ring.digest()
        assert route(watcher.view, "tara", s).id == target  # still serving from cache
        with pytest.raises(RingUnavailable) as err:
            await store.set_draining("w0", True)  # writers retry with backoff, then give up
        assert err.value.retryable and "unreachable" in err.value.message

        redis_server.start()  # same port, empty: workers re-register on their next heartbeat
        after = await watcher.wait_for(lambda v: len(v.ring) == 3 and not watcher.stale, 10)
        assert after.ring.digest() == before.ring.digest()
        assert watcher.staleness_s < 1.0
        assert smallest[0] == 3  # no request ever saw an empty or partial ring from the outage itself

        await store.set_draining("w0", True)  # and pub/sub works again
        await watcher.wait_for(lambda v: "w0" not in v.ring, 3)


async def test_writer_retries_ride_out_a_short_outage(ring_settings, redis_server):
    s = dataclasses.replace(ring_settings, retry=dataclasses.replace(ring_settings.retry, attempts=10, max_delay_s=0.3))
    async with AsyncExitStack() as stack:
        stack.callback(redis_server.start)
        store = await stack.enter_async_context(RingStore(s))
        redis_server.stop()
        write = asyncio.create_task(ReplicaControl(store).scale("tara", 2), name="scale-during-outage")
        await asyncio.sleep(0.4)
        assert not write.done()
        redis_server.start()
        assert await asyncio.wait_for(write, 10) > 0
        assert (await store.snapshot()).replicas == {"tara": 2}


async def test_redis_data_loss_keeps_the_last_ring(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beats = await start_workers(stack, store, 2)
        before = await watcher.wait_for(lambda v: len(v.ring) == 2, 5)
        for beat in beats:
            await beat.aclose(deregister=False)
        raw = aioredis.from_url(ring_settings.redis_url)
        stack.push_async_callback(raw.aclose)
        await raw.delete(*[k async for k in raw.scan_iter(f"{ring_settings.prefix}:*")])  # as after a restart
        await asyncio.sleep(2 * ring_settings.refresh_interval_s + 0.2)
        assert watcher.view.ring.digest() == before.ring.digest()
        assert watcher.stale and "without its data" in watcher.last_error.message


async def test_operator_and_automatic_replicas(ring_settings):
    s = ring_settings
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        await start_workers(stack, store, 4)
        control = ReplicaControl(store)
        await watcher.wait_for(lambda v: len(v.ring) == 4, 5)

        epoch = await control.scale("tara", 2)
        assert epoch > 0 and await control.scale("tara", 2) == 0
        view = await watcher.wait_for(lambda v: v.replicas.get("tara") == 2, 5)
        assert place(view, "tara", s).owners == view.ring.owners("tara", 2)
        await control.scale("tara", 9)  # more than live workers: kept, placement clamps
        view = await watcher.wait_for(lambda v: v.replicas.get("tara") == 9, 5)
        assert place(view, "tara", s).clamped and place(view, "tara", s).replicas == 4
        await control.scale("tara", None)
        await watcher.wait_for(lambda v: "tara" not in v.replicas, 5)

        assert await control.record("leo") == 1
        assert await control.record("leo", count=20) == 1  # counting decides nothing: the cool loop does
        assert await control.cool() == {}  # and with no stream reported, nothing is measured to size by
        assert "leo" not in (await store.snapshot()).auto_replicas


async def test_odd_voice_ids_never_shape_redis_keys(ring_settings):
    voices = ["a:b", "{hash-tag}", "*?[x]", "名前 🎤", "line\nbreak", "x" * 256]
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        await start_workers(stack, store, 2)
        control = ReplicaControl(store)
        for voice in voices:
            await control.scale(voice, 2)
            await control.record(voice)
            await control.report({voice: 1}, spills={voice: 1}, refusals={voice: 2})
        snap = await store.snapshot()
        assert snap.replicas == {v: 2 for v in voices}
        assert set(await store.recent_voices()) == set(voices)  # the request index holds them as members
        assert set(await store.peek_outcomes(voices)) == set(voices)
        raw = aioredis.from_url(ring_settings.redis_url)
        stack.push_async_callback(raw.aclose)
        keys = {k.decode() async for k in raw.scan_iter(f"{ring_settings.prefix}:*")}
        pattern = re.compile(re.escape(ring_settings.prefix) + r":(epoch|workers|heartbeats|live|load|replicas|fleet|"
                             r"warm|clock|voices|spills|resident|heat:[0-9a-f]+|outcome:[0-9a-f]+)")
        assert keys and all(pattern.fullmatch(k) for k in keys), keys
        assert sum(k.startswith(f"{ring_settings.prefix}:heat:") for k in keys) == len(voices)
        assert sum(k.startswith(f"{ring_settings.prefix}:outcome:") for k in keys) == len(voices)


def test_redis_passwords_never_appear_in_messages():
    assert redact_url("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url("redis://:s3cret@host/0") == "redis://:***@host/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    s = RingSettings(redis_url="redis://:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in RingStore(s)._where


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task


async def test_close_is_prompt_even_when_a_cancel_is_swallowed(ring_settings):
    # Regression: redis-py 8.1's asyncio client sometimes swallows a CancelledError that lands
    # inside a command; RingWatcher.aclose() and Heartbeat.aclose() then waited forever.
    s = dataclasses.replace(ring_settings, refresh_interval_s=0.002, heartbeat_interval_s=0.002)
    loop = asyncio.get_running_loop()
    async with RingStore(s) as store:
        for i in range(40):
            watcher, beat = RingWatcher(store), Heartbeat(store, info(1))
            await watcher.start()
            await beat.start()
            await asyncio.sleep(0.002 * (i % 7))
            started = loop.time()
            await asyncio.wait_for(asyncio.gather(watcher.aclose(), beat.aclose(deregister=False)), 10)
            assert loop.time() - started < 2.0


# -- background tasks outlive every kind of failure (regressions: a ResponseError or a stray
#    message used to end the heartbeat, refresh or listen task for good, with `stale` still False)


async def _poll(predicate, timeout: float, every: float = 0.02) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(every)


async def _poll_async(probe, want, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while await probe() != want:
            await asyncio.sleep(0.02)


async def test_tasks_ride_out_redis_refusing_writes_and_recover(ring_settings):
    s = ring_settings
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(s))
        watcher = await stack.enter_async_context(RingWatcher(store))
        beats = await start_workers(stack, store, 2)
        before = await watcher.wait_for(lambda v: len(v.ring) == 2, 5)
        raw = aioredis.from_url(s.redis_url)
        stack.push_async_callback(raw.aclose)
        saved = {**await raw.config_get("maxmemory"), **await raw.config_get("maxmemory-policy")}

        async def restore() -> None:
            for key, value in saved.items():
                await raw.config_set(key, value)

        stack.push_async_callback(restore)
        await raw.config_set("maxmemory-policy", "noeviction")
        await raw.config_set("maxmemory", 1)  # every write now answers "-OOM command not allowed"

        await _poll(lambda: all(isinstance(b.last_error, RingUnavailable) for b in beats), 3)
        assert "OOM" in beats[0].last_error.message
        with pytest.raises(RingUnavailable) as err:  # writers retry, then give up with a retryable error
            await store.set_draining("w0", True)
        assert "refused the command (OOM)" in err.value.message
        # Silent past the TTL: no heartbeat can be written, so that silence says nothing about the
        # workers and nobody is reaped (an outage of the ring's writes, see test_outage.py).
        await asyncio.sleep(s.heartbeat_ttl_s + 2 * s.refresh_interval_s)
        assert all(isinstance(b.last_error, RingUnavailable) for b in beats)
        assert members(watcher) == {"w0", "w1"}

        await restore()  # the heartbeats that kept trying work again
        after = await watcher.wait_for(lambda v: len(v.ring) == 2 and not watcher.stale, 5)
        await _poll(lambda: all(b.last_error is None for b in beats), 3)
        assert after.ring.digest() == before.ring.digest()
        await store.set_draining("w0", True)  # pub/sub and the refresh loop both carry on
        await watcher.wait_for(lambda v: members(watcher) == {"w1"}, 3)


async def test_readonly_after_a_failover_is_retryable(ring_settings, redis_server):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        await store.register(info(0))
        raw = aioredis.from_url(ring_settings.redis_url)
        stack.push_async_callback(raw.aclose)
        stack.push_async_callback(raw.execute_command, "REPLICAOF", "NO", "ONE")
        await raw.execute_command("REPLICAOF", "127.0.0.1", "1")  # a primary demoted to a replica
        with pytest.raises(RingUnavailable) as err:
            await store.heartbeat("w0", 1)
        assert err.value.retryable and "refused the command (READONLY)" in err.value.message
        assert (await store.snapshot()).live == {"w0"}  # reads still work on a replica


async def test_unreadable_state_makes_the_watcher_stale_until_it_is_fixed(ring_settings):
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        watcher = await stack.enter_async_context(RingWatcher(store))
        await start_workers(stack, store, 1)
        await watcher.wait_for(lambda v: len(v.ring) == 1, 3)
        raw = aioredis.from_url(ring_settings.redis_url)
        stack.push_async_callback(raw.aclose)

        await raw.set(store.keys.draining, "oops")  # a key of the wrong type: Redis answers WRONGTYPE
        await _poll(lambda: watcher.stale, 3)
        assert "WRONGTYPE" in watcher.last_error.message and not watcher.last_error.retryable
        await raw.delete(store.keys.draining)
        await _poll(lambda: not watcher.stale, 3)

        await raw.hset(store.keys.replicas, "tara", "three")  # a value voicering cannot parse
        await _poll(lambda: watcher.stale, 3)
        assert "unreadable ring state" in watcher.last_error.message and not watcher.last_error.retryable
        await raw.hset(store.keys.replicas, "tara", 3)
        await watcher.wait_for(lambda v: v.replicas.get("tara") == 3, 3)
        assert not watcher.stale and watcher.last_error is None


async def test_a_malformed_message_on_the_channel_does_not_stop_the_listener(ring_settings):
    slow = dataclasses.replace(ring_settings, refresh_interval_s=30.0)  # only pub/sub can deliver in time
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(slow))
        watcher = await stack.enter_async_context(RingWatcher(store))
        await start_workers(stack, store, 2)
        await watcher.wait_for(lambda v: len(v.ring) == 2, 2)
        raw = aioredis.from_url(slow.redis_url)
        stack.push_async_callback(raw.aclose)
        await _poll_async(lambda: raw.pubsub_numsub(store.keys.events), [(store.keys.events.encode(), 1)], 3)
        for junk in (b"not-an-epoch", b"\xff\xfe", b"1.5", b""):
            assert await raw.publish(store.keys.events, junk) == 1  # our listener is subscribed
        await store.set_draining("w0", True)
        await watcher.wait_for(lambda v: "w0" not in v.ring, 2)
        assert watcher.listen_error is None


async def test_a_watcher_nobody_refreshes_turns_stale_by_itself(ring_settings):
    async with RingStore(ring_settings) as store:
        watcher = RingWatcher(store)
        await watcher.start()
        assert not watcher.stale
        await watcher.aclose()  # as if its refresh task had died: no error is ever recorded
        await asyncio.sleep(watcher.stale_after_s + 0.1)
        assert watcher.last_error is None and watcher.stale


async def test_a_late_heartbeat_is_reported(redis_url, caplog):
    """A blocked event loop makes beats late, and a worker silent for the TTL leaves the ring: the
    worker says so in its log instead of vanishing silently."""
    import time

    from hashring.membership import Heartbeat
    from hashring.records import WorkerInfo

    settings = RingSettings(redis_url=redis_url, prefix="test:late-beat", heartbeat_interval_s=0.2)
    async with RingStore(settings) as store, Heartbeat(store, WorkerInfo("late-1", "ws://x:1", "ws://x:1")):
        await asyncio.sleep(0.3)
        time.sleep(1.6)  # block the loop past max(interval, TTL / 5): a warning, not yet out of the ring
        await asyncio.sleep(0.3)
    assert "heartbeat ran" in caplog.text and "late" in caplog.text


async def test_a_stray_cancellation_does_not_end_the_heartbeat(redis_url, monkeypatch):
    """A CancelledError that nobody asked for (redis-py can let one escape a command it timed out)
    used to end the heartbeat task silently: the worker fell out of the ring for good while it
    kept serving. Now it is one failed beat, and the next beat brings the worker back."""
    from hashring.membership import Heartbeat
    from hashring.records import WorkerInfo

    settings = RingSettings(redis_url=redis_url, prefix="test:stray-cancel", heartbeat_interval_s=0.1,
                            heartbeat_ttl_s=0.5)
    async with RingStore(settings) as store, Heartbeat(store, WorkerInfo("stray-1", "ws://x:1", "ws://x:1")) as beat:
        real = store.heartbeat
        calls = {"n": 0}

        async def flaky(worker_id, load, resident=None):
            calls["n"] += 1
            if calls["n"] <= 8:  # long enough to be reaped from the ring
                raise asyncio.CancelledError
            return await real(worker_id, load, resident)

        monkeypatch.setattr(store, "heartbeat", flaky)
        await asyncio.sleep(1.2)
        assert beat.last_error is not None or calls["n"] > 8
        for _ in range(40):
            if "stray-1" in (await store.snapshot()).live and calls["n"] > 8:
                break
            await asyncio.sleep(0.1)
        assert calls["n"] > 8 and "stray-1" in (await store.snapshot()).live


async def test_a_withheld_worker_stays_out_of_this_reader_s_ring_only(ring_settings):
    """A worker's own drain when Redis cannot be told: its own view drops it at once and keeps it
    out over later refreshes, while Redis (and every other reader) still has it."""
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(RingStore(ring_settings))
        mine = await stack.enter_async_context(RingWatcher(store))
        other = await stack.enter_async_context(RingWatcher(store))
        await start_workers(stack, store, 2)
        await mine.wait_for(lambda v: len(v.ring) == 2, 5)
        await mine.withhold("w1")
        assert members(mine) == {"w0"} and mine.view.workers["w1"].status == "draining"
        await mine.refresh()
        await other.refresh()
        assert members(mine) == {"w0"} and members(other) == {"w0", "w1"}
