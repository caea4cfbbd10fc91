"""Shared fixtures live in tests/fixtures/, one module per real component they start.

Every worker the suite starts (fixtures, `voicering up`, benches, validation workers) inherits
this process's environment. vLLM gives its engine's worker process 5 s to leave on its own at
shutdown before it signals it, and on a loaded 2-core box it always needs the signal: 1 s here
takes ~3 s off each of the suite's ~25 worker stops. Production keeps vLLM's default.
"""

import gc
import os

os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "1")
# vLLM's model worker runs inside its engine core (`WorkerSettings.separate_model_process`): one
# process of three fewer per worker, so one import of torch and vLLM fewer per start and less
# memory. The real engine all the same; tests of the production process layout (a killed worker's
# engine processes) set it back to true.
os.environ.setdefault("VOICERING_WORKER_SEPARATE_MODEL_PROCESS", "false")

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.speech",
    "tests.fixtures.models",
    "tests.fixtures.gateway",
    "tests.fixtures.browser",
    "tests.fixtures.trainer",
    "tests.fixtures.fresh_envs",
    "tests.fixtures.fleet",
]


def pytest_configure(config) -> None:
    """torch in this process (the codec, sampling and training tests) on one intra-op thread, as a
    worker keeps its codec (`gpu_worker.codec.set_cpu_threads`). With two, every parallel op waits
    for both threads, and any other busy process on a 2-core box (the suite always has some) stalls
    it: a codec test beside one CPU burner took 1.93 s on two threads, 0.46 s on one (0.42 s idle);
    test_codec took 21-29 s instead of ~2 s in two whole runs of stop 52."""
    import torch

    torch.set_num_threads(1)


def pytest_collection_finish(session) -> None:
    """Freeze the heap that collection built (torch, vLLM, transformers, every test module: ~0.5 M
    objects that live all session). All async tests share one loop, and a gen-2 collection that walks
    that heap stalls it for 0.3 s idle and over a second on a loaded 2-core box: long enough for a
    1 s Redis timeout of a ring under test to fire (seen in CI)."""
    gc.collect()
    gc.freeze()
