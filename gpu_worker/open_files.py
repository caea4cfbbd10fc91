"""The open-file soft limit, raised to the hard limit at start (worker, gateway, agent server).

Every websocket, worker link, Redis connection and loaded adapter holds a descriptor. Containers
under containerd 2.x and many systemd hosts start processes with a soft limit of 1024 while the
hard limit is far higher; a busy gateway or worker then fails `accept()` with EMFILE long before
any real limit. An unprivileged process may raise its soft limit up to the hard one, so each does.

Standard library only: the gateway and the agent server import it.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OpenFileLimit", "raise_open_file_limit"]

log = logging.getLogger(__name__)

NR_OPEN = Path("/proc/sys/fs/nr_open")  # the kernel's ceiling when the hard limit is "unlimited"


@dataclass(frozen=True, slots=True)
class OpenFileLimit:
    before: int
    after: int
    hard: int


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(NR_OPEN.read_text())
    except (OSError, ValueError):
        return 1 << 20  # Linux's default nr_open


def raise_open_file_limit() -> OpenFileLimit:
    """Set RLIMIT_NOFILE's soft limit to its hard limit (never lowering it) and log both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    after = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    log.info("open files: soft limit %d -> %d (hard %s)", soft, after,
             "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return OpenFileLimit(before=soft, after=after, hard=hard)
