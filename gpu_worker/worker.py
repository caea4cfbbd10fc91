"""The worker process: engine + codec + adapter store + websocket server, until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from gpu_worker.adapters import AdapterStore
from gpu_worker.codec import SnacCodec, set_cpu_threads
from gpu_worker.engine import EngineSettings, SamplingOptions, SpeechEngine
from gpu_worker.scheduler import DecodeRunner
from gpu_worker.server import WorkerServer
from gpu_worker.session import SessionDeps
from gpu_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def engine_settings(settings: WorkerSettings) -> EngineSettings:
    return EngineSettings(
        model=settings.model, quantization=settings.quantization, max_loras=settings.max_loras,
        max_cpu_loras=settings.max_cpu_loras, max_lora_rank=settings.max_lora_rank,
        max_num_seqs=settings.max_num_seqs, max_model_len=settings.max_model_len,
        cpu_kv_cache_gib=settings.cpu_kv_cache_gib,
    )


def sampling_defaults(settings: WorkerSettings) -> SamplingOptions:
    return SamplingOptions(temperature=settings.temperature, top_p=settings.top_p,
                           repetition_penalty=settings.repetition_penalty, constraint=settings.constraint)


async def run_worker(settings: WorkerSettings, ready: asyncio.Event | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    set_cpu_threads(settings.codec_threads)
    codec = SnacCodec.load(settings.codec)
    engine = await SpeechEngine.start(engine_settings(settings))
    runner = DecodeRunner(codec)
    store = AdapterStore(settings.voices_dir, max_rank=settings.max_lora_rank, base_voices=settings.base_voices)
    deps = SessionDeps(engine, runner, sampling_defaults(settings), settings.max_text_chars, trim_factory=None)
    server = WorkerServer(settings, deps, store)
    ws_server = await server.serve()
    log.info("worker %s listening on ws://%s:%d", settings.worker_id, settings.host, settings.port)
    print(f"voicering worker ready on ws://{settings.host}:{settings.port}", flush=True)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        ws_server.close()
        await ws_server.wait_closed()
        await runner.aclose()
        await engine.aclose()
