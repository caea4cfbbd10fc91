"""The worker's reaper (gpu_worker.reaper) with real processes and plain `sleep`s in place of the
engine: a stand-in worker starts its children and its reaper as `run_worker` does, and is then
SIGKILLed. Whatever it started dies within seconds; a worker inside someone else's process group
takes only its own processes; a clean stop kills nothing; a pid now another process's is spared."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from gpu_worker.reaper import descendants, reap
from tests.fixtures.models import REPO

pytestmark = pytest.mark.timeout(120)

DEADLINE_S = 20.0  # the reaper acts within milliseconds of the kill; this is for a loaded box

# argv: mode. Starts two sleeps and (mode "orphan") a sleep whose own parent exits at once, then
# its reaper; prints their pids as JSON; with "stop", stops the reaper as a clean shutdown does.
# In mode "nested" the process first starts itself again as a child in its own process group and
# then only waits: the child is the "worker", inside a group that someone else leads.
WORKER = textwrap.dedent("""
    import json, subprocess, sys, time
    from gpu_worker.reaper import Reaper
    mode = sys.argv[1]
    def sleep():
        return subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL).pid
    if mode == "nested":
        subprocess.Popen([sys.executable, "-c", sys.argv[2], "plain", sys.argv[2]])
        print(json.dumps({"leader_sleep": sleep()}), flush=True)
        time.sleep(600)
    sleeps = [sleep() for _ in range(2)]
    if mode == "orphan":
        sleeps.append(int(subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                         text=True, check=True).stdout))
    reaper = Reaper.start()
    print(json.dumps({"worker": __import__("os").getpid(), "reaper": reaper.proc.pid, "sleeps": sleeps}), flush=True)
    if mode == "stop":
        reaper.stop()
        print(json.dumps({"stopped": reaper.proc.returncode}), flush=True)
    time.sleep(600)
""")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], what: str) -> float:
    began = time.monotonic()
    while not all(gone(pid) for pid in pids):
        alive = [pid for pid in pids if not gone(pid)]
        assert time.monotonic() - began < DEADLINE_S, f"{what} still alive {DEADLINE_S:.0f} s after the kill: {alive}"
        time.sleep(0.02)
    return time.monotonic() - began


class Started:
    """The stand-in worker (a group leader unless nested), its output read line by line."""

    def __init__(self, mode: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, mode, WORKER], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []  # all output so far (the reaper's lines come here too)
        self._unread: list[str] = []

    def read(self, predicate) -> str:
        """The first output line not read yet that satisfies `predicate`."""
        for line in self._unread:
            if predicate(line):
                self._unread.remove(line)
                return line
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the stand-in worker's output ended: {self.lines}"
            self.lines.append(line.rstrip())
            if predicate(line):
                return line
            self._unread.append(line)

    def json(self, key: str) -> dict:
        return json.loads(self.read(lambda line: line.startswith("{") and key in json.loads(line)))

    def watching(self) -> str:
        """Once the reaper says it watches, it has noted the worker's children started before it."""
        return self.read(lambda line: line.startswith("voicering reaper: watching"))

    def close(self) -> None:
        """Whatever is left of the group (a failed test's): its leader, not reaped before, pins its id."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc.stdout.close()


def test_a_killed_worker_s_group_and_descendants_die_with_it():
    worker = Started("orphan")
    try:
        found = worker.json("reaper")
        assert "its process group and descendants die with it" in worker.watching()
        # anyone but the worker: a terminal's Ctrl-C, a signal to the group, a stray SIGTERM
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
            os.kill(found["reaper"], sig)
        os.kill(worker.proc.pid, signal.SIGKILL)  # left unreaped: its zombie keeps the group's id for close()
        # the third sleep was re-parented to init before the reaper's first look: the group kill ends it
        wait_gone([*found["sleeps"], found["reaper"]], "the worker's children and its reaper")
        said = worker.read(lambda line: "is gone" in line)
        assert f"worker {found['worker']} is gone" in said and "and now its process group" in said
    finally:
        worker.close()


def test_a_worker_inside_someone_else_s_group_takes_only_its_own_processes():
    leader = Started("nested")
    try:
        mine = leader.json("worker")
        theirs = leader.json("leader_sleep")["leader_sleep"]
        assert "it leads no process group" in leader.watching()
        os.kill(mine["worker"], signal.SIGKILL)
        wait_gone([*mine["sleeps"], mine["reaper"]], "the worker's children and its reaper")
        said = leader.read(lambda line: "is gone" in line)
        assert f"killed 2 process(es) it left {sorted(mine['sleeps'])}" in said and "process group" not in said
        assert not gone(leader.proc.pid) and not gone(theirs)  # the group's leader and its other members live
    finally:
        leader.close()


def test_a_clean_stop_leaves_everything_to_the_worker():
    worker = Started("stop")
    try:
        found = worker.json("reaper")
        assert worker.json("stopped") == {"stopped": 0}
        assert gone(found["reaper"])
        os.kill(worker.proc.pid, signal.SIGKILL)
        assert not any(gone(pid) for pid in found["sleeps"])  # nothing watches them any more
        assert not any("is gone" in line for line in worker.lines)
    finally:
        worker.close()


def test_a_pid_now_another_process_s_is_not_killed():
    sleep = subprocess.Popen(["sleep", "600"])
    try:
        start = descendants(os.getpid())[sleep.pid]
        # the pid noted with another start time: the process noted ended and the kernel gave its
        # pid to this one
        assert reap(os.getpid(), {sleep.pid: start + 1}, group=False) == []
        assert sleep.poll() is None
        assert reap(os.getpid(), {sleep.pid: start}, group=False) == [sleep.pid]
        assert sleep.wait(DEADLINE_S) == -signal.SIGKILL
    finally:
        sleep.kill()
        sleep.wait()


def test_descendants_are_found_through_their_parents_also_once_noted_and_once_re_parented():
    middle = subprocess.Popen(["sh", "-c", "read go; sleep 600 >/dev/null & echo $!; exec sleep 600"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        seen = descendants(os.getpid())
        assert middle.pid in seen
        middle.stdin.write("go\n")
        middle.stdin.flush()
        grandchild = int(middle.stdout.readline())
        seen = descendants(os.getpid(), seen)  # a child of a process noted before (an engine core's worker)
        assert {middle.pid, grandchild} <= set(seen)
        middle.kill()
        middle.wait()  # the grandchild is re-parented away from this process: still noted as ours
        assert grandchild in descendants(os.getpid(), seen) and grandchild not in descendants(os.getpid())
    finally:
        middle.kill()
        middle.wait()
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
        middle.stdin.close()
        middle.stdout.close()
