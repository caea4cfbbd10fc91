"""Redis clients from one URL, for every process of the fleet (the ring store, the gateway's
tenants, the training queue, `voicering status`): `redis://`, `rediss://` (TLS) and `unix://`
as redis-py reads them, and `redis+sentinel://` for a Sentinel-watched primary.

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]

The password (and user) are the data nodes'; Sentinels that need their own take
`sentinel_password`. `rediss+sentinel://` speaks TLS to the data nodes. A client made from such a
URL asks the Sentinels for the current primary on every new connection, and drops a connection
whose server answers that it is a replica now (redis-py's Sentinel pool), so it follows a
failover by itself; LiveKit's own config can point at the same Sentinels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel

__all__ = ["SentinelTarget", "async_client", "parse_sentinel", "sync_client"]

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


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


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client for `url` (options as for `redis.asyncio.Redis`)."""
    return _client(url, options, aioredis.Redis, async_sentinel.Sentinel)


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client for `url` (options as for `redis.Redis`)."""
    return _client(url, options, redis.Redis, redis.sentinel.Sentinel)


def _client(url: str, options: dict[str, Any], redis_class: type, sentinel_class: type) -> Any:
    target = parse_sentinel(url)
    if target is None:
        return redis_class.from_url(url, **options)
    sentinel = sentinel_class(list(target.sentinels), sentinel_kwargs=_sentinel_options(target, options),
                              **{k: v for k, v in options.items() if k.startswith("socket_")})
    return sentinel.master_for(target.service, redis_class=redis_class, **_node_options(target, options))
