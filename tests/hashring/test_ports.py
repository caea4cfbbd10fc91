"""Free ports for the processes the suite and the benches start: outside the kernel's ephemeral range,
so no engine's own bind(0) (vLLM binds about a dozen while a worker starts) can take one first."""

from __future__ import annotations

import random
import socket

import pytest

from hashring.ports import LOWEST, ephemeral_range, free_port, free_ports


def test_a_free_port_lies_outside_the_range_the_kernel_hands_out_and_can_be_bound():
    low, high = ephemeral_range()
    handed_out = []  # what an engine starting beside the worker binds
    for _ in range(64):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            handed_out.append(sock.getsockname()[1])
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high and port >= LOWEST, (port, (low, high))
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))
            listener.listen()
    assert all(low <= p <= high for p in handed_out)  # the premise: bind(0) stays inside the range


def test_a_run_of_ports_is_consecutive_and_every_one_is_free():
    first = free_ports(4)
    held = []
    try:
        for port in range(first, first + 4):
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", port))
    finally:
        for sock in held:
            sock.close()


def test_a_held_port_is_never_handed_out():
    # only LOWEST and LOWEST + 1 lie outside this range: hold one, the other is the answer
    ephemeral = (LOWEST + 2, 65535)
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", LOWEST))
        except OSError:
            pytest.skip(f"port {LOWEST} is held by something else on this machine")
        for seed in range(20):
            assert free_ports(1, ephemeral=ephemeral, rng=random.Random(seed)) == LOWEST + 1


def test_with_no_room_outside_the_range_the_kernel_chooses():
    whole = (LOWEST, 65535)
    port = free_ports(1, ephemeral=whole)
    assert LOWEST <= port <= 65535
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))


def test_the_range_is_read_from_the_kernel_or_is_linux_s_default(tmp_path):
    given = tmp_path / "ip_local_port_range"
    given.write_text("40000\t50000\n")
    assert ephemeral_range(given) == (40000, 50000)
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)
    given.write_text("garbage")
    assert ephemeral_range(given) == (32768, 60999)
    with pytest.raises(ValueError):
        free_ports(0)
