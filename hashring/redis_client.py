"""Redis clients from one URL, for every process of the fleet (the ring store, the gateway's
tenants, the training queue, `voicering status`): `redis://`, `rediss://` (TLS) and `unix://`
as redis-py reads them, and `redis+sentinel://` for a Sentinel-watched primary.

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]

The password (and user) are the data nodes'; Sentinels that need their own take
`sentinel_password`. `rediss+sentinel://` speaks TLS to the data nodes. A client made from such a
URL asks the Sentinels for the current primary on every new connection, and drops a connection
whose server answers that it is a replica now (redis-py's Sentinel pool), so it follows a
failover by itself; LiveKit's own config can point at the same Sentinels.

An asyncio client made with `max_connections` holds at most that many connections, and a call
that finds them all in use waits up to `pool_wait_s` for one, first come first served
(`WaitingPool`, for plain URLs and Sentinel URLs alike), before it raises redis-py's
`MaxConnectionsError` (a `ConnectionError` subclass: callers map it before ConnectionError, as
"this process is busy", never "Redis is unreachable"). redis-py's own pool raises at once, and its
`BlockingConnectionPool` raises a plain ConnectionError that reads like a dead server.

`redact_url` is the one way a URL is printed: every secret it can carry hidden.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel
from redis.exceptions import MaxConnectionsError

__all__ = ["SentinelTarget", "WaitingPool", "WaitingSentinelPool", "async_client", "parse_sentinel", "redact_url",
           "sync_client"]

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
HIDDEN: Final = "***"
# query parameters that carry a secret: redis-py reads `password` from the query of any URL, a
# Sentinel URL `sentinel_password`; anything named like a credential is hidden too
_SECRET_PARAM: Final = re.compile(r"pass|pwd|token|secret|key|auth|cred", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` as it may be printed (logs, errors, `voicering status`, the `up` banner): every secret
    it can carry replaced by '***': the userinfo's password (a userinfo without one is hidden whole,
    since `redis://secret@host` is a common way to write a password), and the value of every query
    parameter named like a credential (`password`, `sentinel_password`, `token`, `secret`, `key`...).
    The one function that does it; a URL it cannot read is not printed at all."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a Redis URL that could not be parsed>"
    if not url.startswith(f"{parts.scheme}://") and "@" in url:  # no authority to find userinfo in: hide up to '@'
        where, _, query = url.rsplit("@", 1)[1].partition("?")
        return f"{HIDDEN}@{where}" + ("?" + "&".join(map(_redact_param, query.split("&"))) if query else "")
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{HIDDEN}@{hosts}" if colon else f"{HIDDEN}@{hosts}"
    query = "?" + "&".join(map(_redact_param, parts.query.split("&"))) if parts.query else ""
    head = f"{parts.scheme}://" if url.startswith(f"{parts.scheme}://") else f"{parts.scheme}:" if parts.scheme else ""
    return f"{head}{netloc}{parts.path}{query}"  # the fragment, never used by Redis URLs, is dropped


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    return f"{name}={HIDDEN}" if eq and _SECRET_PARAM.search(unquote(name)) else param


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    tls: bool = False


def parse_sentinel(url: str) -> SentinelTarget | None:
    """The Sentinel target of a `redis+sentinel://` URL; None for any other scheme. Raises
    ValueError for a Sentinel URL without hosts or service, or with a bad port or db."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        return None
    hosts = parts.netloc.rsplit("@", 1)[-1]
    sentinels = []
    for item in filter(None, hosts.split(",")):
        host, port = _host_port(item)
        sentinels.append((host, port))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path:
        raise ValueError("a Sentinel URL names its Sentinels and the service: "
                         "redis+sentinel://host:26379[,host:26379]/service[/db]")
    try:
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        raise ValueError(f"Sentinel URL database {path[1]!r} is not a number") from None
    query = parse_qs(parts.query)
    user, password = None, None
    if "@" in parts.netloc:
        auth = parts.netloc.rsplit("@", 1)[0]
        name, _, secret = auth.partition(":")
        user, password = unquote(name) or None, unquote(secret) or None
    return SentinelTarget(tuple(sentinels), unquote(path[0]), db, user, password,
                          query.get("sentinel_password", [None])[0], parts.scheme.startswith("rediss"))


def _host_port(item: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]` or `[v6]:port`."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    try:
        return host, int(port) if port else DEFAULT_SENTINEL_PORT
    except ValueError:
        raise ValueError(f"Sentinel address {item!r} has no usable port") from None


def _node_options(target: SentinelTarget, options: dict[str, Any]) -> dict[str, Any]:
    node = {**options, "db": target.db, "username": target.username, "password": target.password}
    if target.tls:
        node["ssl"] = True
    return node


def _sentinel_options(target: SentinelTarget, options: dict[str, Any]) -> dict[str, Any]:
    keep = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
    return {**keep, **({"password": target.sentinel_password} if target.sentinel_password else {})}


class _Waiting:
    """Mixed into a redis-py asyncio pool: at most `max_connections` connections in use, and a
    caller that finds none free waits up to `wait_s` for one (FIFO) before `MaxConnectionsError`."""

    max_connections: int

    def __init__(self, *args: Any, wait_s: float, **kwargs: Any) -> None:
        if not wait_s > 0:
            raise ValueError(f"a pool's wait must be > 0 seconds, got {wait_s!r}")
        super().__init__(*args, **kwargs)
        self.wait_s = wait_s
        self._slots = asyncio.Semaphore(self.max_connections)  # one per connection that may be in use
        self._held: set[Any] = set()  # connections handed out that hold a slot

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(self.wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise MaxConnectionsError(f"all {self.max_connections} Redis connections of this process stayed in use "
                                      f"for {self.wait_s:g} s") from None
        try:
            connection = await super().get_connection(*args, **kwargs)  # type: ignore[misc]
        except BaseException:
            self._slots.release()
            raise
        self._held.add(connection)
        return connection

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)  # type: ignore[misc]
        finally:
            if connection in self._held:
                self._held.discard(connection)
                self._slots.release()


class WaitingPool(_Waiting, aioredis.ConnectionPool):
    """redis-py's asyncio pool, waiting a bounded time for a free connection (see `_Waiting`)."""


class WaitingSentinelPool(_Waiting, async_sentinel.SentinelConnectionPool):
    """redis-py's asyncio Sentinel pool, waiting a bounded time for a free connection (see `_Waiting`)."""


def async_client(url: str, *, max_connections: int | None = None, pool_wait_s: float | None = None,
                 **options: Any) -> aioredis.Redis:
    """An asyncio client for `url` (options as for `redis.asyncio.Redis`). With `max_connections`
    (and `pool_wait_s`, required with it) its pool waits that long for a free connection, then
    raises MaxConnectionsError; without, redis-py's pool (100 connections, no wait)."""
    if max_connections is None:
        return _client(url, options, aioredis.Redis, async_sentinel.Sentinel)
    if pool_wait_s is None:
        raise ValueError("a sized pool needs pool_wait_s: how long a call waits for a free connection")
    return _client(url, options, aioredis.Redis, async_sentinel.Sentinel, (WaitingPool, WaitingSentinelPool),
                   {"max_connections": max_connections, "wait_s": pool_wait_s})


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client for `url` (options as for `redis.Redis`)."""
    return _client(url, options, redis.Redis, redis.sentinel.Sentinel)


def _client(url: str, options: dict[str, Any], redis_class: type, sentinel_class: type,
            pools: tuple[type, type] | None = None, pool_options: dict[str, Any] | None = None) -> Any:
    """A client of `redis_class`; `pools`: the pool classes for a plain and a Sentinel URL, made
    with `pool_options` (else redis-py's own)."""
    pool_options = pool_options or {}
    target = parse_sentinel(url)
    if target is None:
        if pools is None:
            return redis_class.from_url(url, **options)
        return redis_class.from_pool(pools[0].from_url(url, **pool_options, **options))
    sentinel = sentinel_class(list(target.sentinels), sentinel_kwargs=_sentinel_options(target, options),
                              **{k: v for k, v in options.items() if k.startswith("socket_")})
    sized = {} if pools is None else {"connection_pool_class": pools[1], **pool_options}
    return sentinel.master_for(target.service, redis_class=redis_class, **sized, **_node_options(target, options))
