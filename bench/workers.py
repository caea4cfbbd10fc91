"""The workers a serving bench measures: stand-in workers of its own, or a running one it is pointed at.

`start_stand_in_worker` is the one command line every bench's own workers run with (the bench
stand-in, `bench.weights`). `RunningRing` is a worker already serving in a ring (`voicering bench
gateway|livekit|pipecat --worker URL --redis URL --ring-prefix P`): the bench starts only what
sits in front of it (a gateway, the plugin) and stops only that. The suite's smokes point these
three benches at its session worker instead of starting one each.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.weights import REPO, bench_stand_in


def start_stand_in_worker(voices: Path, log: Path, *, max_streams: int = 8, max_loras: int | None = 2,
                          redis_url: str | None = None, ring_prefix: str | None = None, worker_id: str | None = None,
                          env: dict[str, str] | None = None):
    """One real `voicering worker` on the bench stand-in, serving ``voices``, waited on until /health
    answers (`gpu_worker.process.spawn_worker`: its own session, stopped whole). With ``redis_url`` it
    joins the bench's own ring under ``ring_prefix`` as ``worker_id``. It drains for 1 s when stopped:
    a bench stops its workers after its last stream."""
    from gpu_worker.process import spawn_worker

    stand_in = bench_stand_in()
    args = ["--model", str(stand_in.model), "--codec", str(stand_in.codec), "--voices-dir", str(voices),
            "--quantization", "none", "--max-streams", str(max_streams)]
    if max_loras is not None:
        args += ["--max-loras", str(max_loras)]
    extra = {"VOICERING_WORKER_DRAIN_GRACE_S": "1"}
    if redis_url is not None:
        if ring_prefix is None or worker_id is None:
            raise ValueError("a worker in a ring needs its ring_prefix and worker_id")
        args += ["--redis", redis_url, "--worker-id", worker_id]
        extra["VOICERING_WORKER_RING_PREFIX"] = ring_prefix
    return spawn_worker(args, log, timeout_s=300, cwd=REPO, env={**extra, **(env or {})})


@dataclass(frozen=True)
class RunningWorker:
    """A worker the bench did not start: its websocket URL and the id it has in its ring."""

    url: str
    worker_id: str

    @property
    def http(self) -> str:
        return self.url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)


@dataclass(frozen=True)
class RunningRing:
    """A ring with a worker already serving in it: the worker's URL, the Redis holding the ring and
    the ring's key prefix (what `voicering worker --redis` and `VOICERING_WORKER_RING_PREFIX` name)."""

    worker_url: str
    redis_url: str
    prefix: str

    def worker(self, timeout_s: float = 10.0) -> RunningWorker:
        """The worker, its ring id read from its /health; raises if it does not answer or is in no ring."""
        http = RunningWorker(self.worker_url, "").http
        try:
            with urllib.request.urlopen(f"{http}/health", timeout=timeout_s) as resp:
                health = json.loads(resp.read())
        except OSError as exc:
            raise RuntimeError(f"the worker at {self.worker_url} did not answer /health: {exc}") from None
        if "ring_epoch" not in health or not health.get("worker_id"):
            raise RuntimeError(f"the worker at {self.worker_url} is in no ring (start it with --redis)")
        return RunningWorker(self.worker_url, health["worker_id"])


def bench_ring(stack: contextlib.ExitStack, ring: RunningRing | None, own_prefix: str) -> tuple[str, str]:
    """(Redis URL, ring prefix) a bench's worker serves in: the running ring's, or an embedded Redis
    of the bench's own under ``own_prefix``, closed with ``stack``."""
    if ring is not None:
        return ring.redis_url, ring.prefix
    from hashring.embedded import EmbeddedRedis

    return stack.enter_context(EmbeddedRedis()).url, own_prefix


@contextlib.contextmanager
def measured_worker(ring: RunningRing | None, voices: Path, log: Path, **own: object) -> Iterator[object]:
    """The worker a bench measures: the ring's running one (left running), or a stand-in worker of the
    bench's own (``own``: `start_stand_in_worker`'s options), stopped on exit."""
    if ring is not None:
        yield ring.worker()
        return
    worker = start_stand_in_worker(voices, log, **own)
    try:
        yield worker
    finally:
        with contextlib.suppress(Exception):
            worker.stop()
