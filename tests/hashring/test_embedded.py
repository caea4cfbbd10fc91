"""EmbeddedRedis: a real redis-server on a free loopback port that stops and restarts in place."""

from __future__ import annotations

import socket

import pytest
import redis

from hashring.embedded import EmbeddedRedis, find_redis_server


def test_find_redis_server_returns_an_executable():
    assert find_redis_server().endswith("redis-server")


def test_start_stop_restart_keep_the_port_and_lose_the_data():
    with EmbeddedRedis() as server:
        assert server.running and server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        server.restart()
        assert server.running
        assert client.get("k") is None  # nothing persisted
        server.kill()
        assert not server.running
        with pytest.raises(redis.ConnectionError):
            client.ping()
        server.start()
        assert client.ping()
        client.close()
    assert not server.running
    with socket.socket() as sock:  # the port is free again once closed (TIME_WAIT aside)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", server.port))


async def test_async_context_manager():
    async with EmbeddedRedis() as server:
        assert redis.Redis.from_url(server.url).ping()
    assert not server.running


def test_session_fixture_is_shared_and_running(redis_server, redis_url):
    assert redis_server.running and redis_url == redis_server.url
