"""A worker's engine processes end with the worker's main process, however that process ends.

Why: vLLM's `EngineCore` is a child process of the worker that never notices its parent's death
(it waits on its input socket), and its `Worker` child only watches `EngineCore` (vLLM's death
pipe). A worker's main process that dies without shutting its engine down (SIGKILL, the OOM
killer, a crash in native code) leaves both running, re-parented to init, holding the model, the
KV cache and on a GPU the GPU's memory, so that the worker started in its place cannot allocate
its cache. Seen after a SIGKILL under `voicering up`: both still running half an hour later.

How: `run_worker` starts this reaper first thing, before the engine (`Reaper.start()`, the
worker's side, below), as `python -I -S .../reaper.py <worker pid>`: its own small process,
standard library only and nothing of voicering, so it is ready in ~50 ms and holds ~12 MB RSS
(~6 MB PSS). It asks the kernel for SIGHUP when its parent dies (PR_SET_PDEATHSIG, then checks
getppid(): the parent may already be gone) and meanwhile notes, every `WATCH_S`, the worker's
descendants and their start times. Once its parent is gone it SIGKILLs
- the descendants it noted that are still those processes (a pid the kernel has since given to
  another process has another start time and is left alone), then
- the worker's whole process group when the worker led one (`voicering up`, the trainer's
  validation worker, the tests and the benches start each worker in a session of its own). The
  reaper is a member of that group, which keeps its id from being reused, and goes with it.
A worker started inside someone else's process group (a shell pipeline) only loses what the
reaper noted, never the rest of that group. A separate process rather than PR_SET_PDEATHSIG in the
engine core itself: vLLM starts that (spawn or fork, from a thread of its choosing) and the
engine's own worker, and the worker starts others (multiprocessing's resource tracker); one
watcher outside them all covers every one, whatever vLLM version or start method.

A worker that shuts down cleanly stops its engine itself, then its reaper (`Reaper.stop`: SIGTERM
from the worker). SIGTERM from anyone else, SIGINT, SIGHUP and SIGQUIT (Ctrl-C at a terminal, a
signal to the whole group) are ignored: the reaper outlives the worker's own graceful shutdown.
Nothing restarts a reaper that was itself killed; supervisors still end a dead worker's group.
PR_SET_PDEATHSIG fires when the parent *thread* that started the reaper ends, so `Reaper.start`
runs on the worker's main thread; any other wake-up (and every `WATCH_S`) re-checks getppid().
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["Reaper", "WATCH_S", "descendants", "reap"]

WATCH_S = 1.0  # how often the worker's descendants are noted (its engine processes live for hours)
PARENT_GONE = signal.SIGHUP  # what the kernel sends when the worker dies (PR_SET_PDEATHSIG)
WAKE = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}  # blocked, read by sigtimedwait
START_TIMEOUT_S = 60.0  # tens of milliseconds on an idle box
STOP_TIMEOUT_S = 5.0
READY = b"watching\n"  # on stdout, once the reaper has noted the worker's descendants
PR_SET_PDEATHSIG = 1


# -- the worker's side ---------------------------------------------------------------------------------


class Reaper:
    """The worker's handle on its reaper: `start()` before the engine, `stop()` once it is shut down."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    @classmethod
    def start(cls) -> Reaper:
        """From the worker's main thread (see the module docstring); returns once the reaper
        watches. Its log lines go to the worker's stderr."""
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        with proc.stdout:
            readable, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
            said = proc.stdout.readline() if readable else b""
        if said != READY:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the worker's reaper ({__file__}) did not start: its output is above")
        return cls(proc)

    def stop(self) -> None:
        """A clean exit: the reaper leaves without killing anything."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the reaper's side -------------------------------------------------------------------------------


def _stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks since boot) from /proc/<pid>/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int, known: Mapping[int, int] | None = None) -> dict[int, int]:
    """The live descendants of `root` ({pid: start time}), plus those of `known` that are still the
    same processes (descendants that outlived their own parent are re-parented away from `root`)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():  # no /proc: the group kill alone
        if name.isdigit() and (stat := _stat(name)) is not None:
            children.setdefault(stat[0], []).append((int(name), stat[1]))
    found = {pid: start for pid, start in (known or {}).items()
             if (stat := _stat(pid)) is not None and stat[1] == start}
    frontier = [root, *found]  # the children of those noted before: started since, or re-parented away
    while frontier:
        for pid, start in children.get(frontier.pop(), ()):
            found[pid] = start
            frontier.append(pid)
    found.pop(os.getpid(), None)
    return found


def reap(parent: int, noted: Mapping[int, int], *, group: bool) -> list[int]:
    """SIGKILL what the dead `parent` left: the noted processes still alive as themselves, then
    (`group`: the parent led this process's group) the whole group, this process included."""
    killed = []
    for pid, start in noted.items():
        if (stat := _stat(pid)) is not None and stat[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    _say(f"worker {parent} is gone: killed {len(killed)} process(es) it left {sorted(killed)}"
         + (", and now its process group" if group else ""))
    if group:
        os.killpg(parent, signal.SIGKILL)
    return killed


def _say(line: str) -> None:
    print(f"voicering reaper: {line}", file=sys.stderr, flush=True)


def _ask_for_parent_death_signal() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, PARENT_GONE)
    except (OSError, AttributeError):  # not Linux: the WATCH_S check alone notices
        pass


def main(argv: list[str]) -> int:
    parent = int(argv[0])
    signal.pthread_sigmask(signal.SIG_BLOCK, WAKE)
    _ask_for_parent_death_signal()
    group = os.getpgrp() == parent
    noted: dict[int, int] = {}
    said = False
    while os.getppid() == parent:  # re-parented: the worker is gone
        noted = descendants(parent, noted)
        if not said:
            said = True
            _say(f"watching worker {parent}: " + ("its process group and descendants die with it" if group else
                 "its descendants die with it (it leads no process group)"))
            sys.stdout.buffer.write(READY)
            sys.stdout.close()
        woke = signal.sigtimedwait(WAKE, WATCH_S)
        if woke is not None and woke.si_signo == signal.SIGTERM and woke.si_pid == parent \
                and os.getppid() == parent:
            return 0  # the worker shut its engine down and stops us
    reap(parent, noted, group=group)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
