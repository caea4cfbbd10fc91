"""The rule by which the suite starts a module's workers ahead of it (tests/fixtures/fleet.py): never
more than three workers alive, the session worker's slot always kept."""

from __future__ import annotations

import pytest

from tests.fixtures.fleet import MAX_WORKERS, ModulePlan, WorkerSpec, ahead_of_need

SMALL = WorkerSpec("small")
ENTRY, OWNER = WorkerSpec("entry"), WorkerSpec("owner")


def plans(*rows: tuple[str, tuple[WorkerSpec, ...], int]) -> list[ModulePlan]:
    return [ModulePlan(path, specs, own) for path, specs, own in rows]


def nobody() -> int:
    return 0


def test_the_next_module_s_workers_start_while_the_modules_before_it_have_room():
    modules = plans(("a", (), 0), ("b", (), 1), ("c", (ENTRY, OWNER), 0))
    assert ahead_of_need(modules, 0, set(), [], nobody) == ("c", [ENTRY])  # b's own worker: one slot left
    assert ahead_of_need(modules, 1, set(), [], nobody) == ("c", [ENTRY])
    modules = plans(("a", (), 0), ("c", (ENTRY, OWNER), 0))
    assert ahead_of_need(modules, 0, set(), [], nobody) == ("c", [ENTRY, OWNER])


def test_a_module_at_the_limit_on_the_way_gets_nothing_started_beside_it():
    modules = plans(("a", (), 0), ("demo", (), 2), ("c", (SMALL,), 0))
    assert ahead_of_need(modules, 0, set(), [], nobody) == ("c", [])  # it would live through demo's two
    assert ahead_of_need(modules, 1, set(), [], nobody) == ("c", [])
    modules = plans(("b", (SMALL,), 0), ("c", (SMALL,), 0))
    assert ahead_of_need(modules, 0, set(), [], nobody) == ("c", [SMALL])  # b's one and c's one


def test_what_was_started_ahead_counts_and_one_module_is_looked_ahead_at_a_time():
    modules = plans(("a", (), 0), ("c", (ENTRY, OWNER), 0), ("d", (SMALL,), 0))
    started = {("c", "entry")}
    assert ahead_of_need(modules, 0, started, ["c"], nobody) == ("c", [OWNER])
    assert ahead_of_need(modules, 0, started, ["c", "x"], nobody) == ("c", [])  # another one started ahead
    assert ahead_of_need(modules, 0, started | {("c", "owner")}, ["c", "c"], nobody) == ("c", [])  # not d's yet


def test_the_machine_s_live_workers_are_a_bound_too():
    modules = plans(("a", (), 0), ("c", (ENTRY, OWNER), 0))
    assert ahead_of_need(modules, 0, set(), [], lambda: 2) == ("c", [ENTRY])
    assert ahead_of_need(modules, 0, set(), [], lambda: MAX_WORKERS) == ("c", [])
    assert ahead_of_need(plans(("a", (), 0)), 0, set(), [], nobody) == ("", [])  # no module ahead needs any


def test_a_spec_never_joins_the_session_ring():
    with pytest.raises(ValueError, match="ring"):
        WorkerSpec("b", ring_id="b")
    assert WorkerSpec("b", env={"VOICERING_WORKER_RING_PREFIX": "test:own"}, ring_id="b").ring_id == "b"
