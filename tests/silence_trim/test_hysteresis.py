"""The run search: clicks rejected, soft onsets kept, and the answer stable as more steps arrive."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from silence_trim.hysteresis import first_confirmed_run

RULES = dict(min_active=4, window=10)


def steps(pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """'.' quiet, '-' active, '#' loud (and active)."""
    loud = np.array([c == "#" for c in pattern], dtype=bool)
    active = np.array([c in "#-" for c in pattern], dtype=bool)
    return loud, active


def test_a_click_is_not_speech():
    found = first_confirmed_run(*steps("....#........."), **RULES, final=True)
    assert found.start is None and found.horizon == 14


def test_the_run_starts_at_its_soft_onset():
    found = first_confirmed_run(*steps("....--###-#####"), **RULES, final=True)
    assert (found.start, found.trigger) == (4, 6)


def test_a_trigger_is_confirmed_across_a_short_gap():
    found = first_confirmed_run(*steps("...##..####....."), **RULES, final=True)
    assert found.start == 3


def test_a_pending_trigger_holds_the_horizon_back_until_the_stream_ends():
    loud, active = steps("......--##")
    assert first_confirmed_run(loud, active, **RULES, final=False).horizon == 6
    assert first_confirmed_run(loud, active, **RULES, final=True).horizon == 10


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=".-#", max_size=60))
def test_prefix_stable_and_horizon_monotone(pattern):
    loud, active = steps(pattern)
    full = first_confirmed_run(loud, active, **RULES, final=True)
    last_horizon = 0
    for n in range(len(pattern) + 1):
        part = first_confirmed_run(loud[:n], active[:n], **RULES, final=False)
        assert part.horizon >= last_horizon
        last_horizon = part.horizon
        if part.start is not None:
            assert part.start == full.start
            break
        if full.start is not None:
            assert full.start >= part.horizon
