"""How `voicering up` stops a child (gateway.stack.children), with real processes: a child that,
like a worker over its vLLM engine core, runs a grandchild in its process group and stops it
itself on SIGTERM. The graceful stop must reach only the child; a child stuck past its grace
loses its whole group."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path

import psutil

from gateway.stack.children import Child, ChildSpec

# argv: the events file. The grandchild notes its SIGTERM; the child, on SIGTERM, notes it, waits a
# second (a drain: long enough that a group-wide signal would already have reached the
# grandchild), then stops the grandchild and exits. With `stuck`, the child ignores SIGTERM.
# SIGUSR1 (up asks a stuck child for its stacks) is noted.
CHILD = textwrap.dedent("""
    import signal, subprocess, sys, time
    events, stuck = sys.argv[1], sys.argv[2] == "stuck"
    def note(what):
        with open(events, "a") as out:
            out.write(what + "\\n")
    GRANDCHILD = '''
    import signal, sys, time
    def term(*_):
        with open(sys.argv[1], "a") as out:
            out.write("grandchild got SIGTERM\\\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    with open(sys.argv[1], "a") as out:
        out.write("grandchild ready\\\\n")
    while True:
        time.sleep(0.05)
    '''
    grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD, events])
    def term(*_):
        note("child got SIGTERM")
        if stuck:
            return
        time.sleep(1.0)
        note("child stops its grandchild")
        grandchild.terminate()
        grandchild.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGUSR1, lambda *_: note("child dumps its stacks"))  # as a worker does
    note(f"child ready {grandchild.pid}")
    while True:
        time.sleep(0.05)
""")


def started(tmp_path: Path, mode: str, stop_timeout_s: float) -> tuple[Child, Path, int]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    events = tmp_path / "events"
    child = Child(ChildSpec("fake-worker", (str(events), mode), launcher=(sys.executable, str(script)),
                            stop_timeout_s=stop_timeout_s), tmp_path / "logs")
    child.start()
    deadline = time.monotonic() + 60
    while not (events.exists() and "grandchild ready" in events.read_text() and "child ready" in events.read_text()):
        assert child.running, child.log_tail()
        assert time.monotonic() < deadline, "the child never got ready"
        time.sleep(0.05)
    (line,) = [x for x in events.read_text().splitlines() if x.startswith("child ready")]
    return child, events, int(line.split()[-1])


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_graceful_stop_signals_only_the_main_process(tmp_path):
    child, events, grandchild = started(tmp_path, "drains", stop_timeout_s=60)
    began = time.monotonic()
    asyncio.run(child.stop())
    assert events.read_text().splitlines()[2:] == [
        "child got SIGTERM", "child stops its grandchild", "grandchild got SIGTERM"]
    assert child.returncode == 0 and gone(grandchild)
    assert time.monotonic() - began < 30, "a child that exits in time is not waited on for the whole grace"


def test_a_child_stuck_past_its_grace_loses_its_whole_group(tmp_path):
    child, events, grandchild = started(tmp_path, "stuck", stop_timeout_s=1.0)
    asyncio.run(child.stop())
    # the grandchild got no SIGTERM; past the grace the child is asked for its stacks, then the
    # whole group is SIGKILLed
    assert events.read_text().splitlines()[2:] == ["child got SIGTERM", "child dumps its stacks"]
    assert child.returncode == -9
    deadline = time.monotonic() + 30
    while not gone(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived the stop"
        time.sleep(0.05)
