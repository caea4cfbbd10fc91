"""bench/gateway.py's reading of the gateway's Server-Timing header (its gateway-share figure)."""

from bench.gateway import server_timing


def test_server_timing_is_read_by_name():
    assert server_timing("admit;dur=1.25, worker;dur=600.50") == {"admit": 1.25, "worker": 600.5}
    assert server_timing("") == {}
    assert server_timing("cache;desc=hit, worker;dur=3") == {"worker": 3.0}
