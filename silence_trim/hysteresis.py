"""Where the first run of speech starts, from per-step decisions, with hysteresis and a minimum run.

Steps are frames (energy detector) or model windows (VAD). A step is `loud` when it crosses the
high threshold and `active` when it is above the low one (loud implies active). A loud step
*triggers*; the trigger is *confirmed* once at least `min_active` active steps fall within the
`window` steps that start at it. The run starts at the trigger, extended back over the active
steps just before it (the hysteresis: a soft onset below the high threshold still counts).

The search is prefix-stable: once a prefix of the steps confirms a run, every longer prefix
confirms the same run. A streaming caller can therefore re-run it on what it has seen and act on
the first answer, and get exactly what an offline caller gets on the whole signal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunSearch:
    """Result of a search over a prefix of steps.

    start: first step of the confirmed run, or None.
    trigger: the step that triggered it, or None.
    horizon: no run confirmed later can start before this step (equals `start` when found;
        equals the number of steps when the search is final and found nothing).
    """

    start: int | None
    trigger: int | None
    horizon: int


def run_start(active: np.ndarray, step: int) -> int:
    """First step of the run of active steps that ends just before `step`, extended back from it."""
    inactive = np.flatnonzero(~active[:step])
    return int(inactive[-1]) + 1 if inactive.size else 0


def run_end(active: np.ndarray, step: int) -> int:
    """One past the last step of the run of active steps that contains or starts at `step`."""
    inactive = np.flatnonzero(~active[step:])
    return step + int(inactive[0]) if inactive.size else int(active.size)


def first_confirmed_run(
    loud: np.ndarray, active: np.ndarray, *, min_active: int, window: int, final: bool
) -> RunSearch:
    """Search the steps seen so far for the first confirmed run of speech.

    `final` says no more steps will come: triggers still waiting for their window are rejected.
    """
    n = int(active.size)
    counts_before = np.concatenate([[0], np.cumsum(active, dtype=np.int64)])  # [n+1]
    triggers = np.flatnonzero(loud)
    window_end = np.minimum(triggers + window, n)
    counts = counts_before[window_end] - counts_before[triggers]
    confirmed = counts >= min_active
    if confirmed.any():
        trigger = int(triggers[np.argmax(confirmed)])
        start = run_start(active, trigger)
        return RunSearch(start=start, trigger=trigger, horizon=start)
    if final:
        return RunSearch(start=None, trigger=None, horizon=n)
    # A trigger whose window is still open may yet confirm; a future trigger may extend back over
    # the active steps at the end of what has been seen.
    horizon = run_start(active, n)
    waiting = triggers[triggers + window > n]
    if waiting.size:
        horizon = min(horizon, run_start(active, int(waiting[0])))
    return RunSearch(start=None, trigger=None, horizon=horizon)
