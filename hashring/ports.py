"""Free loopback ports for the processes we start, chosen where the kernel does not hand ports out.

A port from ``bind(0)`` lies in the kernel's ephemeral range, and the kernel hands the same range
to every later ``bind(0)`` and ``connect()``. A worker is told its port ~20 s before it listens,
and meanwhile its own vLLM engine binds about a dozen ephemeral ports (gloo), as does any engine
starting beside it: the port can be taken by the time the worker binds it (a CI bench failed so).
A port below (or above) the range is only ever taken by whoever asks for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["LOWEST", "ephemeral_range", "free_port", "free_ports"]

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_RANGE = (32768, 60999)
LOWEST = 10000  # below this lie the ports services are configured on (8000, 8765, 6379 ...)
TRIES = 200


def ephemeral_range(source: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range, both ends included (Linux's default where unreadable)."""
    try:
        low, high = (int(x) for x in source.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_RANGE
    return low, high


def _outside(count: int, ephemeral: tuple[int, int]) -> list[range]:
    """Where a run of `count` ports may start so that it stays out of `ephemeral`."""
    low, high = ephemeral
    spans = [range(LOWEST, low - count + 1), range(max(LOWEST, high + 1), 65536 - count + 1)]
    return [s for s in spans if len(s) > 0]


def free_ports(count: int = 1, host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None,
               rng: random.Random | None = None) -> int:
    """The first of `count` consecutive ports on `host` that nothing holds now, outside the
    ephemeral range; inside it (``bind(0)``'s choice) only where the range leaves no room."""
    if count < 1:
        raise ValueError("count must be >= 1")
    rng = rng or random.Random()
    spans = _outside(count, ephemeral or ephemeral_range())
    for _ in range(TRIES):
        if spans:
            span = rng.choices(spans, weights=[len(s) for s in spans])[0]
            first = rng.choice(span)
        else:
            with socket.socket() as probe:
                probe.bind((host, 0))
                first = probe.getsockname()[1]
            if first + count > 65536:
                continue
        if _all_free(host, range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports on {host} after {TRIES} tries")


def free_port(host: str = "127.0.0.1") -> int:
    """One port on `host` that nothing holds now, outside the ephemeral range (see the module)."""
    return free_ports(1, host)


def _all_free(host: str, ports: range) -> bool:
    held: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket()
            held.append(sock)
            sock.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for sock in held:
            sock.close()
