"""Dynamic time warping of a streaming signal against a whole reference, one column per frame.

Each new test frame adds one column of the cumulative cost, computed for every reference frame at
once: the column's recurrence x[r] = c[r] + min(a[r], x[r-1]) is a min-plus scan, which is
S[r] + running-min(a[k] - S[k-1]) with S the cumulative sum of c. So a frame costs a few vector
operations over the reference, never a Python loop, and the alignment is always current: its
best end so far (an open end: the test may have reached any point of the reference) and the path
to any end.
"""

from __future__ import annotations

import numpy as np

__all__ = ["StreamingDtw"]

_DIAGONAL, _TEST_ONLY, _REFERENCE_ONLY = 0, 1, 2  # how a cell was reached: (r-1,t-1), (r,t-1), (r-1,t)


class StreamingDtw:
    """`push(frames)` test frames; `best_end()` the reference frame the test has reached; `path(end)`."""

    def __init__(self, reference: np.ndarray) -> None:
        if reference.ndim != 2 or len(reference) == 0:
            raise ValueError("the reference must be a non-empty (frames, dims) array")
        self.reference = np.asarray(reference, np.float32)
        self._column: np.ndarray | None = None  # cumulative cost of the last column
        self._steps: list[np.ndarray] = []  # per kept test frame, how each reference frame was reached (int8)
        self._forgotten = 0  # test frames whose steps were dropped (`forget_before`)

    @property
    def frames(self) -> int:
        return self._forgotten + len(self._steps)

    def forget_before(self, frame: int) -> None:
        """Drop the steps of test frames before `frame`: no path asked for later goes back that far
        (the caller's words there are timed), and a long piece keeps only its recent columns."""
        drop = min(len(self._steps), frame - self._forgotten)
        if drop > 0:
            del self._steps[:drop]
            self._forgotten += drop

    def push(self, frames: np.ndarray) -> None:
        ref = self.reference
        for frame in np.asarray(frames, np.float32):
            cost = np.sqrt(((ref - frame) ** 2).sum(axis=1))
            total = np.cumsum(cost, dtype=np.float64)
            before = np.concatenate(([0.0], total[:-1]))
            if self._column is None:  # the first test frame: the path starts at (0, 0)
                column, steps = total, np.full(len(ref), _REFERENCE_ONLY, np.int8)
                steps[0] = _DIAGONAL
            else:
                prev = self._column
                diagonal = np.concatenate(([np.inf], prev[:-1]))
                reach = np.minimum(diagonal, prev)
                scan = np.minimum.accumulate(reach - before)
                column = total + scan
                from_reach = (reach - before) <= scan  # the scan's minimum is this row's own entry
                steps = np.where(from_reach, np.where(diagonal <= prev, _DIAGONAL, _TEST_ONLY), _REFERENCE_ONLY)
                steps = steps.astype(np.int8)
            self._column = column
            self._steps.append(steps)

    def best_end(self) -> int:
        """The reference frame the test's last frame most likely matches (cost per path step)."""
        if self._column is None:
            return 0
        length = np.arange(len(self.reference)) + self.frames  # a path to (r, t) has about r + t steps
        return int(np.argmin(self._column / length))

    def path(self, end: int | None = None, *, floor: int = 0) -> np.ndarray:
        """For every reference frame from `floor` up to `end`, the first test frame the path to
        (`end`, the last test frame) pairs with it (frames it never reaches before the forgotten
        columns keep the first kept column)."""
        end = len(self.reference) - 1 if end is None else end
        first = np.full(end + 1, self._forgotten, np.int64)
        r, t = end, self.frames - 1
        while r >= floor and t >= self._forgotten:
            first[r] = t
            if r == 0 and t == 0:
                break
            step = self._steps[t - self._forgotten][r]
            if step == _DIAGONAL:
                r, t = r - 1, t - 1
            elif step == _TEST_ONLY:
                t -= 1
            else:
                r -= 1
        return first
