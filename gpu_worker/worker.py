"""The worker process: engine + codec + adapter store/cache + metrics + websocket server, until
SIGINT/SIGTERM. Everything is built here from one `WorkerSettings` and passed in; nothing global."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gpu_worker.adapters import AdapterCache, AdapterStore
from gpu_worker.cluster import drain, join_cluster
from gpu_worker.loop_watchdog import LoopWatchdog, dump_stacks_on_sigusr1
from gpu_worker.codec import ChunkSchedule, SnacCodec, set_cpu_threads
from gpu_worker.engine import EngineSettings, SamplingOptions, SpeechEngine
from gpu_worker.errors import EngineError
from gpu_worker.orpheus import SAMPLE_RATE
from gpu_worker.metrics import WorkerMetrics, use_json_logs
from gpu_worker.open_cluster import is_loopback, require_cluster_token
from gpu_worker.open_files import raise_open_file_limit
from gpu_worker.prompt_window import WindowLimits
from gpu_worker.pronunciations import PronunciationCache
from gpu_worker.reaper import Reaper
from gpu_worker.scheduler import MAX_BATCH, TICK_S, make_decode_runner
from gpu_worker.server import WorkerServer
from gpu_worker.context import ContextLimits, ContextDeps
from gpu_worker.settings import WorkerSettings

if TYPE_CHECKING:
    from gpu_worker.alignment import Aligner

log = logging.getLogger(__name__)


def engine_settings(settings: WorkerSettings) -> EngineSettings:
    return EngineSettings(
        model=settings.model, revision=settings.model_revision, quantization=settings.quantization,
        max_loras=settings.max_loras,
        max_cpu_loras=settings.max_cpu_loras, max_lora_rank=settings.max_lora_rank,
        max_num_seqs=settings.max_num_seqs, max_model_len=settings.max_model_len,
        gpu_memory_utilization=settings.gpu_memory_utilization, cpu_kv_cache_gib=settings.cpu_kv_cache_gib,
        separate_model_process=settings.separate_model_process, prefix_caching=settings.continuity,
    )


def window_limits(settings: WorkerSettings) -> WindowLimits | None:
    """How much of a context's past prompts its next segment; None when continuity is off."""
    if not settings.continuity:
        return None
    return WindowLimits(max_tokens=settings.continuity_window_tokens, max_audio_s=settings.continuity_window_s)


def context_limits(settings: WorkerSettings) -> ContextLimits:
    return ContextLimits(max_text_chars=settings.max_text_chars, max_queued_segments=settings.max_queued_segments,
                         max_context_backlog_chars=settings.max_context_backlog_chars,
                         idle_timeout_s=settings.idle_timeout_s)


def chunk_schedule(settings: WorkerSettings) -> ChunkSchedule:
    """When every stream's first audio is decoded (the codec's default unless the operator chose)."""
    if settings.first_audio_frames is None:
        return ChunkSchedule()
    return ChunkSchedule.first_audio_after(settings.first_audio_frames)


def sampling_defaults(settings: WorkerSettings) -> SamplingOptions:
    return SamplingOptions(temperature=settings.temperature, top_p=settings.top_p,
                           repetition_penalty=settings.repetition_penalty, constraint=settings.constraint)


def trim_factory(settings: WorkerSettings) -> Callable[[], object] | None:
    """A fresh streaming head-silence gate per segment (energy detector: cheap, and the worker's
    output is clean synthetic audio), or None when trimming is off."""
    if not settings.trim_silence:
        return None
    from silence_trim import StreamOptions, StreamTrimmer

    options = StreamOptions(max_drop_ms=settings.trim_max_drop_ms, max_hold_ms=max(2000.0, settings.trim_max_drop_ms + 500.0))
    return lambda: StreamTrimmer(SAMPLE_RATE, options)


def word_aligner(settings: WorkerSettings) -> Aligner | None:
    """The word aligner (one espeak-ng and silero session for the process), or None when alignment
    is off or libespeak-ng is missing: then a start asking for timings gets `alignment_unavailable`."""
    if not settings.alignment:
        return None
    from gpu_worker.alignment import Aligner, EspeakMissing

    try:
        return Aligner(SAMPLE_RATE, threads=settings.alignment_threads)
    except EspeakMissing as err:
        log.warning("word timings are off: %s", err)
        return None


def adapter_store(settings: WorkerSettings) -> AdapterStore:
    return AdapterStore(settings.voices_url or settings.voices_dir, max_rank=settings.max_lora_rank,
                        base_voices=settings.base_voices, base_model=settings.base_model or settings.model,
                        cache_dir=settings.adapter_cache_dir, revalidate_s=settings.adapter_revalidate_s,
                        cache_max_bytes=settings.adapter_cache_max_bytes)


def pronunciation_cache(settings: WorkerSettings, metrics: WorkerMetrics | None = None) -> PronunciationCache | None:
    """Tenants' pronunciation dictionaries, read from the fleet's Redis (None without one: a start
    naming dictionaries is then refused with `pronunciations_unavailable`)."""
    if not settings.redis_url:
        return None
    from hashring.redis_client import async_client
    from hashring.settings import RingSettings

    timeout = RingSettings.from_env(redis_url=settings.redis_url, prefix=settings.ring_prefix).redis_timeout_s
    redis = async_client(settings.redis_url, decode_responses=True, socket_timeout=timeout,
                         socket_connect_timeout=timeout)
    return PronunciationCache(redis, settings.pronunciation_cache_size, metrics)


async def run_worker(settings: WorkerSettings, ready: asyncio.Event | None = None) -> None:
    reaper = Reaper.start()  # first, before the engine: its processes end with this one, however it ends
    try:
        await _serve(settings, ready)
    finally:
        reaper.stop()  # the engine is shut down


async def _serve(settings: WorkerSettings, ready: asyncio.Event | None) -> None:
    # before anything loads: an exposed worker without a real token is refused (OpenCluster)
    require_cluster_token(settings.host, settings.cluster_token, allow_open=settings.allow_open_cluster,
                          env_prefix=WorkerSettings.model_config["env_prefix"], role="worker")
    if settings.log_format == "json":
        use_json_logs()
    raise_open_file_limit()  # every stream, link and adapter holds a descriptor
    logging.getLogger("websockets.server").setLevel(logging.WARNING)  # one line per /health probe otherwise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    dump_stacks_on_sigusr1()
    set_cpu_threads(settings.codec_threads)
    metrics = WorkerMetrics()
    codec = SnacCodec.load(settings.codec)
    engine = await SpeechEngine.start(engine_settings(settings))
    tick_s = settings.codec_tick_ms / 1000.0 if settings.codec_tick_ms is not None else TICK_S
    runner = make_decode_runner(codec, settings.codec_policy, tick_s=tick_s, max_batch=settings.codec_max_batch or MAX_BATCH,
                                compile_decoder=settings.codec_compile, metrics=metrics, schedule=chunk_schedule(settings))
    store = adapter_store(settings)
    # the engine's CPU cache holds max(max_cpu_loras, max_loras) adapters (see EngineSettings)
    adapters = AdapterCache(store, engine.load_adapter, max(settings.max_cpu_loras, settings.max_loras), metrics,
                            listing=engine.loaded_adapters, reconcile_s=settings.adapter_reconcile_s)
    metrics.bind(engine_queue=lambda: engine.waiting, codec_queue=lambda: runner.pending,
                 adapters_resident=lambda: len(adapters.resident))
    pronunciations = pronunciation_cache(settings, metrics)
    aligner = word_aligner(settings)
    deps = ContextDeps(engine, runner, sampling_defaults(settings), context_limits(settings),
                       trim_factory=trim_factory(settings), adapters=adapters, metrics=metrics, worker_id=settings.worker_id,
                       pronunciations=pronunciations, aligner=aligner, window=window_limits(settings))
    server = WorkerServer(settings, deps)
    if settings.prewarm_voices:
        report = await adapters.prewarm(settings.prewarm_voices)
        log.info("prewarmed voices: %s", report, extra={"prewarm": report})
    if not settings.cluster_token and not is_loopback(settings.host):  # allowed open by the operator
        log.warning("worker listens on %s without a cluster token (VOICERING_WORKER_ALLOW_OPEN_CLUSTER): anyone who "
                    "reaches it can speak, prewarm and read metrics", settings.host)
    # The start-up heap (torch, vLLM, the codec: ~0.5 M objects) never becomes garbage; frozen, a
    # gen-2 collection no longer walks it (0.3 s idle, seconds on a loaded box, on the serving loop).
    gc.collect()
    gc.freeze()
    watchdog = LoopWatchdog(settings.loop_stall_s)  # while serving (start-up imports block the loop by design)
    await watchdog.__aenter__()
    ws_server = await server.serve()
    membership = join_cluster(settings, load=lambda: server.active, adapters=adapters)
    cluster = await membership.__aenter__()
    if cluster is not None:
        server.join(cluster.forwarder, cluster.heat)
    log.info("worker %s listening on ws://%s:%d (codec %s, first audio after %d tokens)", settings.worker_id, settings.host,
             settings.port, runner.policy, runner.schedule.tokens_before_first_audio())
    print(f"voicering worker ready on ws://{settings.host}:{settings.port}", flush=True)
    if ready is not None:
        ready.set()
    engine_watch = asyncio.create_task(_watch_engine(engine, stop), name="engine-watch")
    try:
        await stop.wait()
    finally:
        engine_watch.cancel()
        dead = not engine.alive()
        # Each step below runs whatever the one before did: a failure (Redis gone, a bug) is logged,
        # and the server still closes and the engine still shuts down.
        if cluster is not None:  # a dead engine serves nothing: leave at once
            await _step("draining", drain(cluster, lambda: server.active + server.relayed,
                                          0.0 if dead else settings.drain_grace_s))
        await _step("leaving the ring", membership.__aexit__(None, None, None))
        await watchdog.__aexit__(None, None, None)
        ws_server.close()
        await ws_server.wait_closed()
        await server.aclose()
        await runner.aclose()
        if pronunciations is not None:
            await _step("closing the pronunciation cache", pronunciations.aclose())
        if aligner is not None:
            aligner.close()
        await engine.aclose()
    if dead:
        raise EngineError("the vLLM engine core died while serving (its log is above): this worker left the ring "
                          "and exits so its supervisor starts a new one")


async def _step(what: str, step: Awaitable[object]) -> None:
    """One shutdown step that must not stop the ones after it."""
    try:
        await step
    except Exception:
        log.exception("%s failed during shutdown; going on with the rest of it", what)


async def _watch_engine(engine: SpeechEngine, stop: asyncio.Event, interval_s: float = 1.0) -> None:
    """Stop the worker when its engine core dies: the process can serve nothing more, and a worker
    that stays up would keep answering /health while failing every request routed to it."""
    while engine.alive():
        await asyncio.sleep(interval_s)
    log.error("the vLLM engine core is dead: stopping this worker")
    stop.set()
