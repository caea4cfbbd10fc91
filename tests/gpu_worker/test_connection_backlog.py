"""A worker connection's text budget never binds before its contexts' own (issue 19): the gateway
multiplexes many tenants' contexts on one connection per worker, so a budget smaller than the sum
of what its contexts may each hold would let one tenant's text refuse (and end) another tenant's
context. Settings-level: the session worker (4 contexts per connection) cannot show the default
of 16 contexts per connection, and the invariant is what matters for every configuration."""

from __future__ import annotations

import pytest

from gpu_worker.settings import WorkerSettings


@pytest.mark.parametrize("changes", [{}, {"max_streams": 8}, {"max_streams": 128},
                                     {"max_streams_per_connection": 32}, {"max_context_backlog_chars": 1000}])
def test_the_connection_budget_covers_every_context_it_admits(changes):
    settings = WorkerSettings(model="unused", **changes)
    assert settings.connection_backlog_limit() >= (settings.connection_stream_limit()
                                                   * settings.max_context_backlog_chars)


def test_an_operator_may_still_set_a_tighter_budget():
    assert WorkerSettings(model="unused", max_connection_backlog_chars=4096).connection_backlog_limit() == 4096
