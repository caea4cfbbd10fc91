"""How `voicering up` stops and restarts a child (voicering.stack.children), with real processes: a
child that, like a worker over its vLLM engine core, runs a grandchild in its process group and
stops it itself on SIGTERM. The graceful stop must reach only the child; a child stuck past its
grace loses its whole group, and so does a dead child before it is started again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from voicering.stack.children import Child, ChildSpec
from voicering.stack.supervisor import RestartPolicy, Supervisor

REPO = Path(__file__).resolve().parents[2]

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


async def test_a_child_restarted_by_the_supervisor_first_loses_what_it_left_in_its_group(tmp_path):
    """The child's main process alone SIGKILLed (as the OOM killer ends a worker): its grandchild,
    like an engine core with nothing watching it, lives on in the dead child's group. The
    supervisor's restart kills that group before it starts the child again."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    events = tmp_path / "events"
    child = Child(ChildSpec("fake-worker", (str(events), "drains"), launcher=(sys.executable, str(script)),
                            stop_timeout_s=10, settle_s=0.2), tmp_path / "logs")
    reports: list[str] = []
    supervisor = Supervisor([[child]], report=reports.append, policy=RestartPolicy(max_restarts=1, window_s=60))
    interrupt = asyncio.Event()

    async def grandchild_of_life(n: int) -> int:
        deadline = time.monotonic() + 60
        while len(lives := [x for x in events.read_text().splitlines() if x.startswith("child ready")]) < n:
            assert time.monotonic() < deadline, child.log_tail()
            await asyncio.sleep(0.05)
        return int(lives[n - 1].split()[-1])

    await supervisor.start(interrupt)
    watching = asyncio.create_task(supervisor.watch(interrupt))
    first = None
    try:
        first = await grandchild_of_life(1)
        os.kill(child.proc.pid, signal.SIGKILL)
        second = await grandchild_of_life(2)  # the child runs again: by now its first group is gone
        assert gone(first) and not gone(second), (first, second)
        assert any(line.startswith("fake-worker exited with code -9; restarting it") for line in reports), reports
    finally:
        interrupt.set()
        assert await watching is None
        await supervisor.stop()
        if first is not None and not gone(first):  # a failed test's orphan
            os.kill(first, signal.SIGKILL)


# `voicering up` under `nice`: it starts one child (a sleeper) and prints the child's pid
NICED_UP = textwrap.dedent("""
    import sys
    from pathlib import Path
    from voicering.stack.children import Child, ChildSpec
    child = Child(ChildSpec("sleeper", ("-c", "import time; time.sleep(120)"), launcher=(sys.executable,)),
                  Path(sys.argv[1]))
    child.start()
    print(child.proc.pid, flush=True)
    sys.stdin.read()
    child.proc.kill()
    child.proc.wait()
""")


def test_a_child_keeps_the_priority_of_a_niced_up_its_session_s_group_included(tmp_path):
    """Each child leads a session of its own, and where the kernel groups tasks by session
    (autogroup) a new session's group starts at normal priority whatever its processes' niceness:
    a niced `up` (the suite's demo run in the background) would otherwise take an equal share of
    the CPU beside everything else."""
    up = subprocess.Popen(["nice", "-n", "7", sys.executable, "-c", NICED_UP, str(tmp_path)], cwd=REPO,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(up.stdout.readline())
        assert os.getpriority(os.PRIO_PROCESS, pid) == 7 and os.getsid(pid) == pid
        autogroup = Path(f"/proc/{pid}/autogroup")
        if autogroup.exists():  # "/autogroup-123 nice 7" (a kernel with autogroup, as this one and CI's)
            assert autogroup.read_text().split()[-1] == "7", autogroup.read_text()
    finally:
        up.stdin.close()
        up.wait(timeout=60)
