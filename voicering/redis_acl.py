"""`voicering redis-acl`: the fleet's Redis users, one per component, as a Redis ACL file.

Whoever can write to the fleet's Redis controls the fleet: a tenant's key digest, its limits, a
drain, a training job naming another tenant's voice. So no component gets more of Redis than its
own keys, and the default user is off:

    worker          the ring's keys and events (membership, heartbeats, placement, presence), and each
                    tenant's pronunciation dictionaries hash (`{tenants}:t:*:pronunciations`, which it
                    reads by the references the gateway sends; no other tenant key: not the key
                    digests, limits, voices, nor the dictionaries' index)
    agent           the ring's keys and events
    trainer         the training queue's keys
    gateway         all three prefixes (tenants, the queue it submits to, the ring it routes by)
    operator        everything (`redis-cli`, `voicering ring|tenant|status`)

A LiveKit server keeps its own keys, unprefixed: give it its own Redis (the compose file does),
never this one.

Components get every command but Redis's `@dangerous` ones (CONFIG, FLUSHALL, KEYS, DEBUG, ...).
Passwords come from `VOICERING_REDIS_PASSWORD_<USER>` and go into the file only as SHA-256.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import typer

__all__ = ["MIN_PASSWORD_CHARS", "USERS", "AclUser", "Prefixes", "acl_file", "acl_users", "command", "password_env",
           "pronunciations_pattern"]

MIN_PASSWORD_CHARS: Final = 16
COMPONENT_COMMANDS: Final = "+@all -@dangerous"


@dataclass(frozen=True, slots=True)
class Prefixes:
    """The fleet's three Redis key prefixes, as its processes' settings name them."""

    ring: str = "voicering:ring"  # RingSettings.prefix
    tenants: str = "voicering:tenants"  # GatewaySettings.tenant_prefix
    train: str = "voicering:train"  # TrainSettings.queue_prefix, GatewaySettings.train_prefix


@dataclass(frozen=True, slots=True)
class AclUser:
    name: str
    keys: tuple[str, ...]  # key patterns
    channels: tuple[str, ...]  # pub/sub channel patterns
    commands: str


USERS: Final = ("gateway", "worker", "agent", "trainer", "operator")


def password_env(user: str) -> str:
    """The environment variable `voicering redis-acl` reads the user's password from."""
    return f"VOICERING_REDIS_PASSWORD_{user.upper()}"


def pronunciations_pattern(prefixes: Prefixes = Prefixes()) -> str:
    """The tenants' pronunciation dictionaries hashes (gateway.tenants.keys.KeyLayout.pronunciations)."""
    return f"{prefixes.tenants}:t:*:pronunciations"


def acl_users(prefixes: Prefixes = Prefixes()) -> tuple[AclUser, ...]:
    ring = (f"{prefixes.ring}:*",)
    return (
        AclUser("gateway", (f"{prefixes.tenants}:*", f"{prefixes.train}:*", *ring), ring, COMPONENT_COMMANDS),
        # Redis 6.2 (the bundled server) has no read-only key patterns (7.0's %R~): the worker may also
        # write these hashes; what it could spoil is a tenant's readings, never its keys or limits
        AclUser("worker", (*ring, pronunciations_pattern(prefixes)), ring, COMPONENT_COMMANDS),
        AclUser("agent", ring, ring, COMPONENT_COMMANDS),
        AclUser("trainer", (f"{prefixes.train}:*",), (), COMPONENT_COMMANDS),
        AclUser("operator", ("*",), ("*",), "+@all"),
    )


def acl_file(passwords: Mapping[str, str], prefixes: Prefixes = Prefixes()) -> str:
    """The ACL file (redis-server --aclfile) for these passwords; raises ValueError naming each
    user whose password is missing or shorter than `MIN_PASSWORD_CHARS`."""
    weak = [u for u in USERS if len(passwords.get(u) or "") < MIN_PASSWORD_CHARS]
    if weak:
        raise ValueError(f"set a password of at least {MIN_PASSWORD_CHARS} characters for "
                         + ", ".join(f"{u} ({password_env(u)})" for u in weak))
    lines = ["user default reset"]  # off: every client names its user
    for user in acl_users(prefixes):
        digest = hashlib.sha256(passwords[user.name].encode()).hexdigest()
        keys = " ".join(f"~{k}" for k in user.keys)
        channels = " ".join(["resetchannels", *(f"&{c}" for c in user.channels)])  # 6.2's reset allows all
        lines.append(f"user {user.name} reset on #{digest} {keys} {channels} {user.commands}")
    return "\n".join(lines) + "\n"


_DEFAULT: Final = Prefixes()


def command(
    ring_prefix: str = typer.Option(_DEFAULT.ring, "--ring-prefix", help="RingSettings.prefix of the fleet."),
    tenant_prefix: str = typer.Option(_DEFAULT.tenants, "--tenant-prefix", help="The gateways' tenant_prefix."),
    train_prefix: str = typer.Option(_DEFAULT.train, "--train-prefix", help="The training queue's prefix."),
    out: Path | None = typer.Option(None, "--out", help="Write the file here instead of printing it (mode 0644: "
                                    "the Redis server, another user, reads it; it holds only SHA-256 digests)."),
) -> None:
    """Print the fleet's Redis ACL file (one user per component) from VOICERING_REDIS_PASSWORD_<USER>."""
    passwords = {u: os.environ.get(password_env(u), "") for u in USERS}
    try:
        text = acl_file(passwords, Prefixes(ring_prefix, tenant_prefix, train_prefix))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if out is None:
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(out, 0o644)  # whatever the umask: redis-server runs as another user
