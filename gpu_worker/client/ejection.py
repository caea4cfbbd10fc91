"""Outlier ejection for the worker pool (Envoy's outlier detection), as a small pure policy: the
caller passes the clock in and acts on the answers; nothing here does I/O or reads the time.

- A dial that fails (refused, handshake refused or not answered) ejects a worker at once.
- `consecutive_errors` failures on open connections in a row (a connection lost, `engine_error`,
  `internal`, a stalled context) eject it too; a completed context resets the count. A `busy`
  answer, the caller's own mistakes and a 1009 close (a message too big: the sender's fault) are
  not failures: the caller never reports them.
- An ejection lasts `base_s` × the worker's ejection count, capped at `max_s`; the count starts
  over once the worker has stayed un-ejected for `max_s`.
- At most `max_share` of the known workers are ejected at once, at least one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EjectionPolicy", "Health"]


@dataclass(slots=True)
class Health:
    """One worker's health as the pool sees it (mutable: one per worker, owned by the pool)."""

    errors: int = 0  # consecutive failures on open connections
    ejections: int = 0  # the current ejection count (sets the length of the next one)
    ejected_until: float = 0.0  # monotonic
    ejection_s: float = 0.0  # length of the latest ejection

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    consecutive_errors: int = 5
    base_s: float = 30.0
    max_s: float = 300.0
    max_share: float = 0.1

    def __post_init__(self) -> None:
        if self.consecutive_errors < 1:
            raise ValueError("consecutive_errors must be >= 1")
        if not 0 < self.max_share <= 1:
            raise ValueError("max_ejected_share must be in (0, 1]")

    def failed(self, health: Health) -> bool:
        """Count one failure; True when the worker should now be ejected."""
        health.errors += 1
        return health.errors >= self.consecutive_errors

    @staticmethod
    def succeeded(health: Health) -> None:
        health.errors = 0

    def eject(self, health: Health, now: float, *, ejected: int, known: int) -> float | None:
        """Eject the worker (`ejected` of `known` workers are ejected now); the ejection's length,
        or None when it is ejected already or the share of ejected workers is at its cap."""
        if health.ejected(now) or ejected >= max(1, math.floor(self.max_share * known)):
            return None
        if now - health.ejected_until > self.max_s:
            health.ejections = 0  # healthy long enough: the next ejection is a first one again
        health.ejections += 1
        period = min(self.max_s, self.base_s * health.ejections)
        health.ejected_until, health.ejection_s, health.errors = now + period, period, 0
        return period
