"""The rule by which the suite starts a module's workers and commands ahead of it
(tests/fixtures/fleet.py): never more than three workers alive, the session worker's slot always
kept, one command in the background at a time; and the order its modules run in, which gives
those starts room (`running_order`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hashring.ports import ephemeral_range
from tests.fixtures.fleet import MAX_WORKERS, Ahead, Command, ModulePlan, WorkerSpec, _filled, ahead_of_need, running_order

SMALL = WorkerSpec("small")
ENTRY, OWNER = WorkerSpec("entry"), WorkerSpec("owner")
CODEC = Command("codec", ("true",), timeout_s=10)
PROXY = Command("proxy", ("true",), timeout_s=10, workers=2)
ENGINE = Command("engine", ("true",), timeout_s=10, workers=1)


def plans(*rows: tuple) -> list[ModulePlan]:
    return [ModulePlan(*row) for row in rows]


def nobody() -> int:
    return 0


def names(picks) -> list[tuple[str, str]]:
    return [(module, item.name) for module, item in picks]


def test_the_next_module_s_workers_start_while_the_modules_before_it_have_room():
    modules = plans(("a", (), 0), ("b", (), 1), ("c", (ENTRY, OWNER), 0))
    assert names(ahead_of_need(modules, 0, Ahead(), nobody)) == [("c", "entry")]  # b's own: one slot left
    assert names(ahead_of_need(modules, 1, Ahead(), nobody)) == [("c", "entry")]
    modules = plans(("a", (), 0), ("c", (ENTRY, OWNER), 0))
    assert names(ahead_of_need(modules, 0, Ahead(), nobody)) == [("c", "entry"), ("c", "owner")]


def test_a_module_at_the_limit_on_the_way_gets_nothing_started_beside_it():
    modules = plans(("a", (), 0), ("demo", (), 2), ("c", (SMALL,), 0))
    assert ahead_of_need(modules, 0, Ahead(), nobody) == []  # it would live through demo's two
    assert ahead_of_need(modules, 1, Ahead(), nobody) == []
    modules = plans(("b", (SMALL,), 0), ("c", (SMALL,), 0))
    assert names(ahead_of_need(modules, 0, Ahead(), nobody)) == [("c", "small")]  # b's one and c's one


def test_what_was_started_ahead_holds_its_slots_until_its_module_and_nearer_modules_come_first():
    modules = plans(("a", (), 0), ("c", (ENTRY, OWNER), 0), ("d", (SMALL,), 0))
    started = {("c", "entry")}
    assert names(ahead_of_need(modules, 0, Ahead(started=started, held=[("c", 1)]), nobody)) == [("c", "owner")]
    # a worker started for a module already past (deselected) still holds its slot everywhere
    assert ahead_of_need(modules, 1, Ahead(started=started, held=[("a", 1), ("c", 1)]), nobody) == []
    # c's two and the session worker fill the room until c is over
    both = started | {("c", "owner")}
    assert ahead_of_need(modules, 0, Ahead(started=both, held=[("c", 1), ("c", 1)]), nobody) == []
    assert ahead_of_need(modules, 1, Ahead(started=both), nobody) == []
    # with one of c's, d's fits beside it: at c, c's held worker is c's own peak, not counted twice
    modules = plans(("a", (), 0), ("c", (ENTRY,), 0), ("d", (SMALL,), 0))
    assert names(ahead_of_need(modules, 0, Ahead(started=started, held=[("c", 1)]), nobody)) == [("d", "small")]


def test_a_command_holds_its_workers_slots_and_one_runs_ahead_at_a_time():
    modules = plans(("a", (), 0), ("b", (), 1), ("c", (), 0, (CODEC, PROXY, ENGINE)))
    assert names(ahead_of_need(modules, 0, Ahead(), nobody)) == [("c", "codec")]  # needs no slot; then one at a time
    codec = ("c", "codec")
    assert ahead_of_need(modules, 0, Ahead(started={codec}, held=[("c", 0)], running=True), nobody) == []
    # the codec run ended: the proxy's two workers would not fit beside b's own; the engine's one does
    done = Ahead(started={codec}, finished={codec})
    assert names(ahead_of_need(modules, 0, done, nobody)) == [("c", "engine")]
    assert ahead_of_need(modules, 0, done, lambda: MAX_WORKERS) == []  # the machine has no slot left


def test_a_module_s_commands_count_in_its_peak_until_they_ended_ahead():
    c = ModulePlan("c", (), 0, (CODEC, PROXY))
    assert c.peak() == 2 and c.peak({("c", "proxy")}) == 0
    modules = [ModulePlan("a", (), 0), c, ModulePlan("d", (SMALL,), 0)]
    assert ahead_of_need(modules, 0, Ahead(started={("c", "codec"), ("c", "proxy")}), nobody) == []
    ended = Ahead(started={("c", "codec"), ("c", "proxy")}, finished={("c", "codec"), ("c", "proxy")})
    assert names(ahead_of_need(modules, 0, ended, nobody)) == [("d", "small")]


def test_the_machine_s_live_workers_are_a_bound_too():
    modules = plans(("a", (), 0), ("c", (ENTRY, OWNER), 0))
    assert names(ahead_of_need(modules, 0, Ahead(), lambda: 2)) == [("c", "entry")]
    assert ahead_of_need(modules, 0, Ahead(), lambda: MAX_WORKERS) == []
    assert ahead_of_need(plans(("a", (), 0)), 0, Ahead(), nobody) == []  # no module ahead needs any


def test_a_spec_never_joins_the_session_ring():
    with pytest.raises(ValueError, match="ring"):
        WorkerSpec("b", ring_id="b")
    assert WorkerSpec("b", env={"VOICERING_WORKER_RING_PREFIX": "test:own"}, ring_id="b").ring_id == "b"


def test_a_module_whose_workers_all_come_from_its_commands_runs_after_the_stretch_that_has_room():
    demo = ModulePlan("demo", (), 0, (Command("demo", ("true",), timeout_s=10, workers=2),))
    spec = ModulePlan("spec", (SMALL,), 0)
    modules = [ModulePlan("a", (), 0), demo, ModulePlan("b", (), 0), spec, ModulePlan("c", (), 0)]
    assert [m.path for m in running_order(modules)] == ["a", "b", "demo", "c", "spec"]  # spec: the rule below
    # a module with commands of its own stops it (one command at a time: its own starts ahead there)
    bench = ModulePlan("bench", (), 0, (CODEC,))
    assert [m.path for m in running_order([demo, ModulePlan("b", (), 0), bench, ModulePlan("c", (), 0)])] == [
        "b", "demo", "bench", "c"]
    # nothing moves a module that starts workers in the foreground, or whose commands need none
    fixed = [ModulePlan("own", (), 1, (PROXY,)), ModulePlan("spec", (SMALL,), 0, (PROXY,)),
             ModulePlan("codec", (), 0, (CODEC,)), ModulePlan("b", (), 0)]
    assert running_order(fixed) == fixed


def test_a_module_with_foreground_workers_on_the_way_runs_right_after_it():
    demo = ModulePlan("demo", (), 0, (Command("demo", ("true",), timeout_s=10, workers=2),))
    modules = [ModulePlan("up", (), 2), ModulePlan("a", (), 0), demo, ModulePlan("b", (), 0),
               ModulePlan("faults", (), 1), ModulePlan("c", (), 0), ModulePlan("spec", (SMALL,), 0)]
    # the demo's run starts ahead once "up" is over and runs through a, b and c; "faults" (no room
    # beside the run) comes after it, then "spec", which needs a slot of its own too
    assert [m.path for m in running_order(modules)] == ["up", "a", "b", "c", "demo", "faults", "spec"]


def test_a_module_of_specs_runs_after_the_modules_of_its_folder_that_need_no_worker():
    entry_owner = ModulePlan("w/relay", (ENTRY, OWNER), 0)
    share = ModulePlan("w/share", (SMALL,), 0)
    modules = [ModulePlan("w/routing", (SMALL,), 0), entry_owner, ModulePlan("w/server", (), 0), share,
               ModulePlan("w/text", (), 0), ModulePlan("w/words", (), 0), ModulePlan("x/ring", (), 0)]
    # relay's two start while server runs, not only once routing gave its slot back; share's one
    # while text and words run; nothing crosses into another folder or past a module with workers
    assert [m.path for m in running_order(modules)] == [
        "w/routing", "w/server", "w/relay", "w/text", "w/words", "w/share", "x/ring"]
    kept = [ModulePlan("w/a", (SMALL,), 1), ModulePlan("w/b", (), 0), ModulePlan("w/c", (SMALL,), 0, (CODEC,)),
            ModulePlan("w/d", (), 0)]
    assert running_order(kept) == kept  # workers of its own, or a command: it stays


def test_a_command_s_out_and_ports_are_filled_as_its_run_starts():
    out = Path("/tmp/run")
    assert _filled("--folder={out}/demo", out) == "--folder=/tmp/run/demo"
    first, second = (int(_filled("{ports:2}", out)) for _ in range(2))
    low, high = ephemeral_range()
    assert all(port + 1 < low or port > high for port in (first, second))  # both ports outside the kernel's range
    assert re.fullmatch(r"\d+:\d+", _filled("{ports:1}:{ports:1}", out))
