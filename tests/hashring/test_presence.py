"""Presence of gateways and agent servers on a real Redis: announced every interval, read back with
their age, dropped after the forget time by anyone's next beat, a failing beat that never costs the
process; and the session's real gateway process announcing itself."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import pytest

from hashring.embedded import EmbeddedRedis
from hashring.presence import Announcer, read_presence
from hashring.settings import RingSettings
from hashring.store import RingStore
from tests.fixtures.models import CLUSTER_PREFIX


async def test_announced_processes_are_read_back_newest_first_and_forgotten_when_long_silent(ring_settings):
    async with RingStore(ring_settings) as store:
        async with Announcer(store, "gateway", "gw-1:8000", address="10.0.0.1:8000", interval_s=0.05):
            await asyncio.sleep(0.2)
            await Announcer(store, "agent", "agent-1:7").beat()
            present = await read_presence(store)
        assert {(p.kind, p.id) for p in present} == {("agent", "agent-1:7"), ("gateway", "gw-1:8000")}
        assert [p.seen_age_s for p in present] == sorted(p.seen_age_s for p in present)  # newest first
        (gateway,) = [p for p in present if p.kind == "gateway"]
        assert gateway.info["address"] == "10.0.0.1:8000" and gateway.seen_age_s < 5 and not gateway.silent
        # silent past the forget time (0.01 s here, an hour in production): dropped by the agent's next beat
        await asyncio.sleep(0.1)
        await store.announce("agent/agent-1:7", "{}", 0.01)
        assert [p.id for p in await read_presence(store)] == ["agent-1:7"]


async def test_a_beat_that_fails_is_logged_once_and_the_announcer_carries_on(caplog):
    server = EmbeddedRedis().start()
    settings = RingSettings(redis_url=server.url, prefix="test:presence-down", redis_timeout_s=0.3)
    try:
        async with RingStore(settings) as store:
            async with Announcer(store, "gateway", "gw-down:1", interval_s=0.05) as announcer:
                await asyncio.sleep(0.1)
                server.kill()
                with caplog.at_level(logging.WARNING, logger="hashring.presence"):
                    await asyncio.sleep(1.5)
                assert not announcer._task.done()  # still beating (and failing)
            warned = [r for r in caplog.records if "not announced" in r.getMessage()]
            assert len(warned) == 1
    finally:
        server.stop()


def test_a_kind_outside_the_fleet_s_is_refused():
    with pytest.raises(ValueError):
        Announcer(None, "worker", "w")  # workers are ring members: they heartbeat, not announce


async def test_the_session_gateway_announces_itself(gateway, redis_server):
    port = urlsplit(gateway.url).port
    async with RingStore(RingSettings(redis_url=redis_server.url, prefix=CLUSTER_PREFIX)) as store:
        for _ in range(100):  # its first beat is at start-up; one a few seconds in is enough
            mine = [p for p in await read_presence(store) if p.kind == "gateway" and p.id.endswith(f":{port}")]
            if mine:
                break
            await asyncio.sleep(0.1)
    assert mine, "the gateway never announced itself"
    assert mine[0].info["pid"] == gateway.proc.pid and not mine[0].silent
