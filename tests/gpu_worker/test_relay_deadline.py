"""The relay's first-audio deadline sits below its pool's (issue 20, L5): checked when the
forwarder is built, so a worker never starts with nested clocks that fire together. No worker
process, no socket (a static pool dials nothing until asked)."""

from __future__ import annotations

import pytest

from gpu_worker.client import PoolSettings, WorkerPool
from gpu_worker.proxy import Forwarder
from gpu_worker.settings import RELAY_TIMEOUT_S


def forwarder(pool_s: float | None, relay_s: float | None) -> Forwarder:
    pool = WorkerPool.static(["ws://127.0.0.1:9"], PoolSettings(first_audio_timeout_s=pool_s))
    return Forwarder("entry", None, None, pool, first_audio_timeout_s=relay_s)


def test_the_default_relay_deadline_is_below_every_pool_s_default():
    assert RELAY_TIMEOUT_S < PoolSettings().first_audio_timeout_s
    assert forwarder(PoolSettings().first_audio_timeout_s, RELAY_TIMEOUT_S).first_audio_timeout_s == 20.0


@pytest.mark.parametrize("relay_s", [30.0, 31.0, 0.0, -1.0])
def test_a_relay_deadline_at_or_above_its_pool_s_or_not_positive_is_refused(relay_s):
    with pytest.raises(ValueError, match="below the pool's first_audio_timeout_s"):
        forwarder(30.0, relay_s)


def test_without_a_pool_clock_any_positive_deadline_goes_and_none_turns_it_off():
    assert forwarder(None, 600.0).first_audio_timeout_s == 600.0
    assert forwarder(30.0, None).first_audio_timeout_s is None
