"""`voicering train | train-worker | jobs`: the training commands (heavy imports inside each).

Settings come from the environment (VOICERING_TRAIN_*) and the options given here override them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from lora_training.ingest import AUDIO_SUFFIXES


def _settings(**overrides: object):
    """TrainSettings from the environment, with the options that were given on the command line."""
    from pydantic import ValidationError

    from lora_training.settings import TrainSettings

    try:
        return TrainSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:
        typer.echo(f"error: invalid settings: {err}", err=True)
        raise typer.Exit(2) from None


def _expand(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for the audio files directly inside it."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES))
        else:
            out.append(path)
    return out


class ConsoleReporter:
    """States as lines on stderr; training progress comes from the trainer's own bar."""

    def __init__(self) -> None:
        self._message = ""

    def state(self, state: str, message: str = "") -> None:
        typer.echo(f"[{state}] {message}", err=True)

    def progress(self, percent: float, message: str = "", **fields: object) -> None:
        if message and message != self._message and "step" not in fields:
            self._message = message
            typer.echo(f"  {percent:5.1f}%  {message}", err=True)


def train(
    voice: str = typer.Argument(..., help="Voice name (the name the model is prompted with)."),
    tenant: str | None = typer.Option(None, "--tenant", help="Tenant: the voice id becomes TENANT/VOICE."),
    audio: list[Path] = typer.Option(..., "--audio", help="Audio file or folder (repeat the option for more)."),
    transcripts: Path | None = typer.Option(None, "--transcripts", help="JSON or CSV manifest: file name -> text."),
    submit: bool = typer.Option(False, "--submit", help="Queue the job in Redis for a train-worker instead."),
    model: str | None = typer.Option(None, "--model", help="Base Orpheus weights (local path or hub id)."),
    codec: str | None = typer.Option(None, "--codec", help="SNAC 24 kHz weights."),
    store: Path | None = typer.Option(None, "--store", help="Adapter store the workers serve."),
    work_dir: Path | None = typer.Option(None, "--work-dir", help="Caches and checkpoints."),
    worker_url: str | None = typer.Option(None, "--worker-url", help="Worker that generates the validation sample."),
    no_sample: bool = typer.Option(False, "--no-sample", help="Publish after the adapter checks alone."),
    redis_url: str | None = typer.Option(None, "--redis-url"),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (overrides epochs)."),
    epochs: float | None = typer.Option(None, "--epochs"),
    rank: int | None = typer.Option(None, "--rank", help="LoRA rank (alpha follows as 2 x rank)."),
    min_speech_s: float | None = typer.Option(None, "--min-speech-s", help="Least speech accepted, in seconds."),
    job_id: str | None = typer.Option(None, "--job-id", help="Job id (a local rerun with the same id resumes)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Train a voice LoRA from ~10 minutes of speech, validate it and publish it to the adapter store."""
    from pydantic import ValidationError

    from lora_training.errors import TrainingError
    from lora_training.pipeline import JobSpec, run_job

    settings = _settings(base_model=model, codec=codec, adapter_store=store, work_dir=work_dir,
                         validate_worker_url=worker_url, validate_sample=False if no_sample else None, redis_url=redis_url)
    params = settings.params.model_copy(update={k: v for k, v in {
        "max_steps": steps, "epochs": epochs, "rank": rank, "alpha": 2 * rank if rank else None}.items() if v is not None})
    data = settings.data.model_copy(update={"min_speech_s": min_speech_s} if min_speech_s is not None else {})
    try:
        if job_id is None and not submit:  # a local rerun of the same voice resumes its caches and checkpoints
            job_id = f"local-{tenant or 'default'}-{voice}"
        spec = JobSpec(**({"job_id": job_id} if job_id else {}), name=voice, tenant=tenant,
                       audio=[p.resolve() for p in _expand(audio)],
                       transcripts=transcripts.resolve() if transcripts else None, data=data, params=params)
        _ = spec.voice_id  # refuses an invalid or reserved voice id before any work
        if submit:
            from lora_training.jobs import JobQueue

            from lora_training.publish import check_free

            check_free(settings.adapter_store, spec.voice_id)
            queue = JobQueue.connect(settings.redis_url, settings.queue_prefix)
            try:
                status = queue.submit(spec)
            finally:
                queue.close()
            typer.echo(json.dumps(status.to_dict()) if as_json else f"queued job {status.job_id} for voice '{status.voice_id}'")
            return
        result = run_job(spec, settings, ConsoleReporter())
    except TrainingError as err:
        typer.echo(f"error: {err.message}", err=True)
        raise typer.Exit(1) from None
    except ValidationError as err:
        typer.echo(f"error: invalid job: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(f"voice '{result['voice']}' is ready: {result['clip_count']} clips, {result['data_minutes']:.1f} min, "
                   f"{result['steps']} steps, final loss {result['final_train_loss']}")


def train_worker(
    redis_url: str | None = typer.Option(None, "--redis-url"),
    model: str | None = typer.Option(None, "--model"),
    codec: str | None = typer.Option(None, "--codec"),
    store: Path | None = typer.Option(None, "--store"),
    work_dir: Path | None = typer.Option(None, "--work-dir"),
    worker_url: str | None = typer.Option(None, "--worker-url"),
    consumer: str | None = typer.Option(None, "--consumer", help="Consumer name in the group (default host:pid)."),
    lease_ms: int | None = typer.Option(None, "--lease-ms"),
    claim_idle_ms: int | None = typer.Option(None, "--claim-idle-ms"),
    max_jobs: int | None = typer.Option(None, "--max-jobs", help="Exit after this many jobs reached an outcome."),
    health_port: int | None = typer.Option(None, "--health-port", help="Serve GET /health and /metrics on this "
                                           "port (0: any free port; default VOICERING_TRAIN_HEALTH_PORT, else none)."),
    log_level: str = typer.Option("INFO"),
) -> None:
    """Consume the training queue: run jobs one at a time, re-claiming those of crashed trainers."""
    from lora_training.consumer import TrainWorker
    from lora_training.jobs import JobQueue

    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = _settings(redis_url=redis_url, base_model=model, codec=codec, adapter_store=store, work_dir=work_dir,
                         validate_worker_url=worker_url, consumer=consumer, lease_ms=lease_ms,
                         claim_idle_ms=claim_idle_ms, health_port=health_port)
    import signal

    queue = JobQueue.connect(settings.redis_url, settings.queue_prefix)
    health, server = _health_server(settings)
    trainer = TrainWorker(settings, queue, health=health)
    # SIGTERM (voicering up, Kubernetes, systemd): the running job goes back to the queue at its next step
    signal.signal(signal.SIGTERM, lambda *_: trainer.shutdown())
    try:
        trainer.run(max_jobs=max_jobs)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.close()
        queue.close()


def _health_server(settings):
    """The trainer's health record, and its /health and /metrics server when a port is set (None, None
    otherwise). A port that cannot be bound ends the command: a trainer its probes cannot reach
    would be restarted in a loop."""
    if settings.health_port is None:
        return None, None
    from lora_training.health import TrainerHealth
    from lora_training.health_server import HealthServer
    from lora_training.jobs import JobQueue
    from lora_training.metrics import TrainerMetrics

    health = TrainerHealth(stall_s=settings.health_stall_s, redis_grace_s=settings.health_redis_grace_s)
    metrics = TrainerMetrics()
    health.listen(metrics)
    try:  # its own connection: the probe reads Redis while the job loop may be blocked on it
        server = HealthServer(health, metrics, JobQueue.connect(settings.redis_url, settings.queue_prefix),
                              host=settings.health_host, port=settings.health_port,
                              refresh_s=settings.health_refresh_s)
    except OSError as err:
        typer.echo(f"error: the trainer's health server cannot listen on {settings.health_host}:"
                   f"{settings.health_port} ({err}): free the port or set VOICERING_TRAIN_HEALTH_PORT", err=True)
        raise typer.Exit(2) from None
    logging.getLogger(__name__).info("trainer health and metrics on http://%s:%d/health and /metrics",
                                     settings.health_host, server.port)
    return health, server.start()


def jobs(
    cancel: str | None = typer.Option(None, "--cancel", help="Cancel this job id."),
    limit: int = typer.Option(20, "--limit"),
    redis_url: str | None = typer.Option(None, "--redis-url"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per job."),
) -> None:
    """List training jobs (newest first) with state and progress; or cancel one."""
    from lora_training.errors import TrainingError
    from lora_training.jobs import JobQueue

    settings = _settings(redis_url=redis_url)
    queue = JobQueue.connect(settings.redis_url, settings.queue_prefix)
    try:
        if cancel:
            status = queue.cancel(cancel)
            if status is None:
                typer.echo(f"error: no job {cancel}", err=True)
                raise typer.Exit(1)
            statuses = [status]
        else:
            statuses = queue.list(limit)
    except TrainingError as err:
        typer.echo(f"error: {err.message}", err=True)
        raise typer.Exit(1) from None
    finally:
        queue.close()
    for s in statuses:
        if as_json:
            typer.echo(json.dumps(s.to_dict()))
        else:
            detail = s.error or s.message
            steps = f" step {s.step}/{s.total_steps}" if s.total_steps else ""
            typer.echo(f"{s.job_id:14s} {s.voice_id:28s} {s.state:13s} {s.progress:5.1f}%{steps}  {detail}")


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root CLI."""
    app.command("train")(train)
    app.command("train-worker")(train_worker)
    app.command("jobs")(jobs)
