"""A worker's share of the fleet's streams: the bound above which it refuses a placed start (pure).

    fleet_mean = (the other live workers' reported streams + its own exact in_flight + 1) / workers
    share      = ceil(admit_factor × fleet_mean)

The + 1 counts the start being decided, so a lone worker's share is never below in_flight + 1 (it
always admits up to its capacity). Below ``share_floor × capacity`` streams a worker admits whatever
the mean (`share_floor_streams`): the others' loads it sees are their last heartbeats, and in a
burst (hundreds of starts inside one heartbeat period) they read idle, so the share alone would
refuse after three or four starts on every worker at once. Workers run it on their own ring view (`gpu_worker.server`);
`voicering bench ring` runs the same function on its model's loads.
"""

from __future__ import annotations

import math

__all__ = ["share_bound", "share_floor_streams", "share_of_mean"]


def share_bound(others: float, in_flight: int, workers: int, admit_factor: float, floor: int = 0) -> tuple[int, float]:
    """``(max(ceil(admit_factor × mean), floor), mean)`` for a worker holding ``in_flight`` streams
    beside ``others`` streams on the fleet's other ``workers - 1`` workers; ``floor`` is its
    `share_floor_streams` (below it every start fits the bound: the same as not asking)."""
    mean = (others + in_flight + 1) / max(1, workers)
    return max(share_of_mean(mean, admit_factor), floor), mean


def share_of_mean(mean: float, admit_factor: float) -> int:
    """``ceil(admit_factor × mean)``, rounded first: 1.35 × 2.0 must not ceil to 3."""
    return math.ceil(round(admit_factor * mean, 9))


def share_floor_streams(capacity: int, share_floor: float) -> int:
    """The streams below which a worker of ``capacity`` never refuses a start for its share."""
    return math.ceil(round(share_floor * capacity, 9))
