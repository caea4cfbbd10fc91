"""The one rule on cluster tokens, for every process that binds a port: beyond loopback, a real token.

A worker without a token serves anyone who reaches its port (speech, prewarm, metrics), and an
empty key in a Kubernetes Secret or an env file gives exactly that to a whole fleet, silently. So
a worker, gateway or agent server that binds a non-loopback address refuses to start unless its
cluster token has at least `MIN_TOKEN_CHARS` characters, or the operator explicitly allowed an
open cluster (`allow_open_cluster`, e.g. behind a network that is itself the boundary). On
loopback nothing is required: the test suite and `voicering up` run there without a token.

Standard library only: the gateway and the agent server import it.
"""

from __future__ import annotations

import ipaddress

__all__ = ["MIN_TOKEN_CHARS", "OpenCluster", "is_loopback", "require_cluster_token", "usable_token"]

MIN_TOKEN_CHARS = 16  # `openssl rand -hex 32` gives 64: a shorter token was typed by hand, not generated


class OpenCluster(Exception):
    """A process would listen beyond loopback without a usable cluster token. The message says
    which settings fix it; it never contains the token."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the port on this machine ("" and 0.0.0.0 are every address; a
    name may resolve to anything)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def usable_token(token: str | None) -> bool:
    """Whether `token` is long enough to keep strangers out (`MIN_TOKEN_CHARS`)."""
    return token is not None and len(token) >= MIN_TOKEN_CHARS


def require_cluster_token(host: str, token: str | None, *, allow_open: bool, env_prefix: str, role: str) -> None:
    """Raise `OpenCluster` when a process bound to `host` would start with an empty or short token.

    `env_prefix` (VOICERING_WORKER_, ...) names the settings in the message; `role` the process."""
    if allow_open or is_loopback(host) or usable_token(token):
        return
    what = "no cluster token" if not token else f"a cluster token of {len(token)} characters"
    raise OpenCluster(
        f"the {role} binds {host or 'every address'} (beyond loopback) with {what}: workers would serve anyone "
        f"who reaches them. Set {env_prefix}CLUSTER_TOKEN to the fleet's shared secret (at least {MIN_TOKEN_CHARS} "
        f"characters; generate one with `openssl rand -hex 32`), bind 127.0.0.1, or set "
        f"{env_prefix}ALLOW_OPEN_CLUSTER=true if the network itself keeps strangers out")
