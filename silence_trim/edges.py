"""Placing the edges of speech on frame levels, once a detector has found roughly where it is.

A detector confirms speech coarsely (energy thresholds at -55 dBFS, or the VAD's 32 ms
windows). The edge is then moved outward, frame by frame, over audio that is still clearly above
the noise: frames at least `margin_db` above the noise floor (the quietest 10 ms outside the
speech) and above `floor_db`, bridging gaps of up to `bridge_ms` (the closure before a final
"k"), and, for a start, at most `lookback_ms` before the coarse edge. Bounding that move keeps
the streaming decision causal: nothing earlier than `lookback_ms` before the coarse horizon can
ever become speech.

The caller measures the floor on frames it knows to be outside speech: for a start, frames
before the coarse start; for an end (offline only), frames after it. With no such frame the floor
is unknown and only `floor_db` applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from silence_trim.errors import InvalidOptionsError


@dataclass(frozen=True)
class EdgeParams:
    """How far the coarse edge of speech moves out over quieter audio."""

    margin_db: float = 5.0  # above the noise floor (quietest pair of frames outside the speech)
    floor_db: float = -70.0  # ... and never below this level
    lookback_ms: float = 150.0  # a start moves at most this far before the coarse one
    bridge_ms: float = 80.0  # across quieter gaps up to this long

    def __post_init__(self) -> None:
        if self.margin_db < 0 or self.lookback_ms < 0 or self.bridge_ms < 0:
            raise InvalidOptionsError("edge margin_db, lookback_ms and bridge_ms must be >= 0")


@dataclass(frozen=True)
class EdgeFrames:
    """EdgeParams in frames of one detector."""

    margin_db: float
    floor_db: float
    lookback: int
    bridge: int

    @classmethod
    def of(cls, params: EdgeParams, frame_ms: float) -> EdgeFrames:
        lookback, bridge = round(params.lookback_ms / frame_ms), round(params.bridge_ms / frame_ms)
        return cls(params.margin_db, params.floor_db, lookback, bridge)


def noise_floor(levels: np.ndarray) -> float:
    """Noise level of consecutive whole frames known to hold no speech: the quietest pair of
    neighbours, averaged (pairs smooth the frame-to-frame ripple of hum); -inf for no frames."""
    if levels.size < 2:
        return float(levels[0]) if levels.size else -np.inf
    return float(((levels[1:] + levels[:-1]) / 2).min())


def refine_start(levels: np.ndarray, coarse: int, search_end: int, floor: float, edge: EdgeFrames) -> int:
    """Frame where speech starts, given a coarse start frame, the frame where the coarse detector
    became sure and the noise floor. The first frame above the edge threshold in
    [coarse, search_end) anchors the edge, so a coarse start that is too early moves in."""
    coarse = min(coarse, levels.size)
    threshold = max(floor + edge.margin_db, edge.floor_db)
    anchor = np.flatnonzero(levels[coarse : min(search_end, levels.size)] >= threshold)
    if not anchor.size:
        return coarse
    anchor_frame = coarse + int(anchor[0])
    low = max(0, coarse - edge.lookback)
    above = low + np.flatnonzero(levels[low : anchor_frame + 1] >= threshold)  # ends with anchor_frame
    gaps = np.diff(above) - 1
    breaks = np.flatnonzero(gaps > edge.bridge)
    return int(above[breaks[-1] + 1]) if breaks.size else int(above[0])


def refine_end(levels: np.ndarray, coarse_end: int, search_begin: int, floor: float, edge: EdgeFrames) -> int:
    """One past the frame where speech ends: refine_start on the time-reversed levels.

    Ends are only placed offline, on the whole clip, so the move is not bounded by `lookback`
    (a final plosive after a closure can lie well past where a detector lets go of a sentence).
    """
    n = levels.size
    unbounded = EdgeFrames(edge.margin_db, edge.floor_db, lookback=n, bridge=edge.bridge)
    return n - refine_start(levels[::-1], n - coarse_end, n - search_begin, floor, unbounded)
