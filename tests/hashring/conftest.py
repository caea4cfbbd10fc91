"""Fixtures for the hashring tests: fast membership timings and a unique key prefix per test."""

from __future__ import annotations

import uuid

import pytest

from hashring.settings import RetryPolicy, RingSettings


@pytest.fixture
def ring_settings(redis_url: str) -> RingSettings:
    return RingSettings(
        redis_url=redis_url,
        prefix=f"test:{uuid.uuid4().hex[:10]}",
        vnodes=128,
        heartbeat_interval_s=0.1,
        heartbeat_ttl_s=0.6,
        refresh_interval_s=0.25,
        redis_timeout_s=0.5,
        retry=RetryPolicy(attempts=3, base_delay_s=0.02, max_delay_s=0.1),
        heat_half_life_s=0.5,
        heat_fast_half_life_s=0.25,
        scale_down_hold_s=0.5,
    )
