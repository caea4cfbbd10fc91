"""A worker's share of the fleet's streams: the bound above which it refuses a placed start (pure).

    fleet_mean = (the other live workers' reported streams + its own exact in_flight + 1) / workers
    share      = ceil(admit_factor × fleet_mean)

The + 1 counts the start being decided, so a lone worker's share is never below in_flight + 1 (it
always admits up to its capacity). Workers run it on their own ring view (`gpu_worker.server`);
`voicering bench ring` runs the same function on its model's loads.
"""

from __future__ import annotations

import math

__all__ = ["share_bound"]


def share_bound(others: float, in_flight: int, workers: int, admit_factor: float) -> tuple[int, float]:
    """``(ceil(admit_factor × mean), mean)`` for a worker holding ``in_flight`` streams beside
    ``others`` streams on the fleet's other ``workers - 1`` workers."""
    mean = (others + in_flight + 1) / max(1, workers)
    return math.ceil(round(admit_factor * mean, 9)), mean  # rounded: 1.35 × 2.0 must not ceil to 3
