"""Outlier ejection as a pure policy (`gpu_worker.client.ejection`): the clock is passed in."""

from __future__ import annotations

import pytest

from gpu_worker.client import EjectionPolicy, Health, PoolSettings

POLICY = EjectionPolicy(consecutive_errors=3, base_s=30.0, max_s=300.0, max_share=0.1)


def test_failures_in_a_row_eject_and_a_success_starts_the_count_over():
    h = Health()
    assert not POLICY.failed(h) and not POLICY.failed(h)
    POLICY.succeeded(h)
    assert not POLICY.failed(h) and not POLICY.failed(h) and POLICY.failed(h)  # the third in a row
    assert POLICY.eject(h, 100.0, ejected=0, known=5) == 30.0
    assert h.ejected(129.9) and not h.ejected(130.0) and h.errors == 0


def test_each_ejection_lasts_longer_up_to_the_cap_and_the_count_resets_after_a_healthy_spell():
    h, now = Health(), 0.0
    periods = []
    for _ in range(12):
        periods.append(POLICY.eject(h, now, ejected=0, known=1))
        now = h.ejected_until + 1.0  # probed right after it ends, and ejected again
    assert periods[:3] == [30.0, 60.0, 90.0] and max(periods) == 300.0
    assert POLICY.eject(h, h.ejected_until + 301.0, ejected=0, known=1) == 30.0  # healthy > max_s: a first one again


def test_an_ejected_worker_is_not_ejected_again_and_the_share_is_capped_at_one_at_least():
    h = Health()
    assert POLICY.eject(h, 0.0, ejected=0, known=3) == 30.0
    assert POLICY.eject(h, 10.0, ejected=1, known=3) is None and h.ejection_s == 30.0  # still ejected: unchanged
    assert POLICY.eject(Health(), 0.0, ejected=1, known=3) is None  # 10 % of 3 rounds down: one at most
    assert POLICY.eject(Health(), 0.0, ejected=1, known=20) == 30.0  # 10 % of 20 = 2
    assert POLICY.eject(Health(), 0.0, ejected=2, known=20) is None


def test_the_pool_settings_carry_the_policy_and_check_it():
    assert PoolSettings(consecutive_errors=2, ejection_base_s=1.0).ejection == EjectionPolicy(2, 1.0, 300.0, 0.1)
    with pytest.raises(ValueError):
        EjectionPolicy(max_share=0.0)
    with pytest.raises(ValueError):
        PoolSettings(stall_timeout_s=0)
