"""How many replicas a voice gets: its share of the fleet's load, with headroom (pure).

    voice_streams    = rate(v) × mean_stream_s                  # Little's law: its concurrent streams
    per_replica      = max(α × mean_streams_per_worker, min_replica_streams)
    replicas(v)      = clamp(ceil(voice_streams / per_replica), 1, min(live workers, max_auto_replicas))

Both fleet figures are measured, never configured: `mean_streams_per_worker` is the streams the
live workers reported in their heartbeats over their count, and `mean_stream_s` is those streams
over the fleet's request rate in the same window (Little's law, L = λ W). With α = 0.375 an owner
carries at most ~3/8 of a mean worker's load from one voice, so two random choices among the
owners have room to balance (the arithmetic behind α is in docs/ring.md). `min_replica_streams`
keeps a nearly idle fleet from spreading a voice that has one stream at a time.

The count rises on the short window (`heat_fast_half_life_s`), at once by one more when a worker
reports that the voice spilled past its owners, and falls on the slow window (`heat_half_life_s`)
only once the count for rate / cool_factor is lower and the voice was not raised within
`scale_down_hold_s` (hysteresis, so a voice does not flap between worker sets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hashring.settings import RingSettings

__all__ = ["FleetLoad", "next_replicas", "replicas_for", "warm_rate"]


@dataclass(frozen=True, slots=True)
class FleetLoad:
    """The fleet as the cool loop measured it: live undrained workers, the streams they reported,
    and the fleet's request rate (requests/s) over one window."""

    workers: int
    streams: float
    rate: float

    @property
    def mean_streams_per_worker(self) -> float:
        return self.streams / self.workers if self.workers else 0.0

    @property
    def mean_stream_s(self) -> float | None:
        """Mean stream length by Little's law; None while nothing is measured (no streams or no requests)."""
        return self.streams / self.rate if self.rate > 0 and self.streams > 0 else None

    def per_replica(self, settings: RingSettings) -> float:
        """Concurrent streams of one voice that one replica should carry."""
        return max(settings.replica_headroom * self.mean_streams_per_worker, settings.min_replica_streams)


def replicas_for(rate: float, fleet: FleetLoad, settings: RingSettings) -> int:
    """The replica count a voice taking `rate` requests/s deserves in `fleet` (1 when unmeasured)."""
    stream_s = fleet.mean_stream_s
    if stream_s is None or rate <= 0 or fleet.workers < 1:
        return 1
    want = math.ceil(rate * stream_s / fleet.per_replica(settings) - 1e-9)
    return max(1, min(want, fleet.workers, settings.max_auto_replicas))


def warm_rate(fleet: FleetLoad, settings: RingSettings) -> float | None:
    """The lowest rate at which a voice would get a second replica (None: nothing measured)."""
    stream_s = fleet.mean_stream_s
    return None if stream_s is None else fleet.per_replica(settings) / stream_s


def next_replicas(current: int, *, fast: int, slow_cooled: int, spilled: bool, may_lower: bool, limit: int) -> int:
    """The new automatic count of a voice that has `current`.

    `fast`: replicas_for its short-window rate; `slow_cooled`: replicas_for its slow-window rate
    / cool_factor; `spilled`: a worker reported one of its requests landing past its owners;
    `limit`: live workers (and the safety limit). Raising wins over lowering; a count above `limit`
    (workers left) is left to placement's clamp unless the rate lowers it."""
    want = max(current, fast)
    if spilled:
        want = max(want, current + 1)
    if want > current:
        return max(current, min(want, limit))
    if may_lower and slow_cooled < current:
        return max(1, slow_cooled)
    return current
