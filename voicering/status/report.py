"""One sample of the fleet as data: the settings of a run, its problems, each worker's probe and
rates, and the report as one JSON object (`voicering status --json`). Pure: no I/O here.

Heartbeats carry only a worker's stream count, so refusals and relays per second need two
samples of its counters (`rates_between`): one run has the totals and null rates. What no process
records is null in the JSON, with the reason (`NOT_RECORDED`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from hashring.fleet_view import FleetView, WorkerRow
    from hashring.presence import Presence
    from hashring.settings import RingSettings
    from lora_training.queue_view import QueueView

__all__ = ["NOT_RECORDED", "VOICE_FIELDS", "Probe", "Problem", "ProblemKind", "StatusReport", "StatusSettings", "WorkerRates",
           "duration", "problems_of", "rates_between", "report_json"]

# What the issue asks for that nothing in the fleet records today, and why (the JSON's *_note fields).
NOT_RECORDED: Final = {
    "presence": "gateways (routed by the ring) and agent servers announce themselves every 5 s "
                "(hashring.presence); `silent` ones missed 15 s of it, and an hour of silence drops them. A "
                "gateway pinned to a --worker list is not in the fleet and is not listed",
    "rates": "refusals_per_s and relays_per_s come from two samples of each worker's /metrics counters "
             "(voicering_worker_rejected_total for busy, share and connection_limit; voicering_worker_proxied_total); "
             "heartbeats carry only the stream count. One run has one sample, so they are null: use --watch",
    "voices": "voices are ranked when requested within the heat TTL (the newest 10,000 are indexed), when they "
              "have a replica record (an operator floor or an automatic count), or when named with --voice",
}

# How the per-voice fields that are not plain counts are made (the JSON's voice_field_notes).
VOICE_FIELDS: Final = {
    "adapter_loaded_on": "live workers whose latest heartbeat listed the voice's LoRA adapter as resident (a base "
                         "voice has no adapter: empty)",
    "spill_share": "of the voice's requests, the share served by a worker outside its owners (decayed counters, "
                   "short window); null without recent requests",
    "refusal_share": "of the voice's tries (requests + refusals), the share a worker refused (busy, its fleet share, "
                     "a connection's limit; the pool then tries another); null without recent tries",
}

ProblemKind = Literal["dead_worker", "replicas_short", "queue_stale"]


@dataclass(frozen=True, slots=True)
class StatusSettings:
    """One `voicering status` run: where to read and what counts as a problem (built once)."""

    ring: RingSettings  # redis_url and prefix of the ring, as `voicering ring` reads them
    queue_url: str  # the training queue's Redis (TrainSettings.redis_url unless --redis)
    queue_prefix: str
    token: str | None = None  # the workers' cluster token, for /metrics
    probe_timeout_s: float = 1.0  # per HTTP answer; 0: no probes
    queue_age_limit_s: float = 600.0
    top: int = 10  # hottest voices shown
    voices: tuple[str, ...] = ()  # voices shown whatever their replica records
    job_limit: int = 500  # newest jobs read from the queue
    failed_window_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    subject: str  # the worker id, voice id or job id
    message: str


@dataclass(frozen=True, slots=True)
class Probe:
    """What one worker's HTTP port answered."""

    at: float  # time.monotonic() of the answers
    health: Mapping[str, Any] | None  # GET /health (open to probes); None when it did not answer
    refusals: float | None  # counter totals since the worker started, from GET /metrics
    relays: float | None
    error: str | None  # why health or the counters are missing


@dataclass(frozen=True, slots=True)
class WorkerRates:
    refusals_per_s: float | None
    relays_per_s: float | None


@dataclass(frozen=True, slots=True)
class StatusReport:
    redis: str  # the ring's Redis URL, password redacted
    queue_redis: str  # the training queue's, likewise
    read_at: float  # wall clock
    fleet: FleetView
    queue: QueueView | None
    queue_error: str | None
    probes: Mapping[str, Probe]  # live workers only
    rates: Mapping[str, WorkerRates]
    problems: tuple[Problem, ...]
    settings: StatusSettings
    presence: tuple[Presence, ...] = ()  # gateways and agent servers that announced themselves


def problems_of(fleet: FleetView, queue: QueueView | None, settings: StatusSettings) -> tuple[Problem, ...]:
    """The fleet's problems, the worst kind first."""
    out = [Problem("dead_worker", w.id, f"worker {w.id} is dead ({_heartbeat(w)}) but still listed: it is out of "
                   f"the ring, and its record stays until {duration(settings.ring.forget_after_s)} of silence")
           for w in fleet.workers if w.state == "dead"]
    out += [Problem("replicas_short", v.voice, f"voice {v.voice!r} wants {v.wanted} replicas but {v.placed} "
                    f"{'is' if v.placed == 1 else 'are'} placed: {fleet.in_ring} worker(s) serve; add workers or "
                    f"lower its floor (`voicering ring scale`)")
            for v in fleet.short]
    age = queue.oldest_queued_age_s if queue is not None else None
    if queue is not None and age is not None and age > settings.queue_age_limit_s:
        job = queue.queued[0]
        late = sum(1 for j in queue.queued if queue.read_at - j.created_at > settings.queue_age_limit_s)
        out.append(Problem("queue_stale", job.job_id, f"training job {job.job_id} (voice {job.voice_id}) has been "
                           f"queued for {duration(age)}, over the {duration(settings.queue_age_limit_s)} limit "
                           f"({late} job(s) over it): is a `voicering train-worker` running?"))
    return tuple(out)


def rates_between(before: Probe | None, after: Probe) -> WorkerRates:
    """Per-second rates between two samples of one worker; None without two counter readings, or
    when a counter went back (the worker restarted between them)."""
    if before is None or after.at <= before.at:
        return WorkerRates(None, None)
    dt = after.at - before.at

    def rate(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b < a else (b - a) / dt

    return WorkerRates(rate(before.refusals, after.refusals), rate(before.relays, after.relays))


def report_json(report: StatusReport) -> dict[str, Any]:
    """The report as one JSON object (`voicering status --json`)."""
    fleet, queue = report.fleet, report.queue
    workers = []
    for w in fleet.workers:
        probe = report.probes.get(w.id)
        rates = report.rates.get(w.id, WorkerRates(None, None))
        workers.append({
            "id": w.id, "state": w.state, "streams": w.streams, "capacity": w.capacity, "weight": w.weight,
            "ring_share": round(w.ring_share, 4), "heartbeat_age_s": _round(w.heartbeat_age_s),
            "ws_url": w.ws_url, "proxy_url": w.proxy_url,
            "adapters_resident": (len(w.adapters) if w.adapters is not None
                                  else (probe.health or {}).get("adapters_resident") if probe else None),
            "adapters": None if w.adapters is None else list(w.adapters),
            "health": dict(probe.health) if probe and probe.health is not None else None,
            "refusals_total": probe.refusals if probe else None, "relays_total": probe.relays if probe else None,
            "refusals_per_s": _round(rates.refusals_per_s), "relays_per_s": _round(rates.relays_per_s),
            "probe_error": None if probe is None else probe.error,
        })
    voices = [{
        "voice": v.voice, "rate_per_s": _round(v.rate), "rate_per_s_slow": _round(v.rate_slow),
        "share": _round(v.share, 4), "replicas_wanted": v.wanted, "replicas_placed": v.placed,
        "operator_replicas": v.operator, "auto_replicas": v.automatic, "owners": list(v.owners),
        "adapter_loaded_on": list(v.adapter_on), "spill_share": _round(v.spill_share, 4),
        "refusal_share": _round(v.refusal_share, 4),
    } for v in fleet.voices]
    return {
        "redis": report.redis, "ring_prefix": report.settings.ring.prefix, "read_at": round(report.read_at, 3),
        "epoch": fleet.epoch, "incarnation": fleet.incarnation,
        "fleet": {"workers": len(fleet.workers), "in_ring": fleet.in_ring, "streams": fleet.streams,
                  "rate_per_s": _round(fleet.rate), "rate_per_s_slow": _round(fleet.rate_slow),
                  "cooling": fleet.cooling},
        "workers": workers, "rates_note": NOT_RECORDED["rates"],
        "voices": voices, "voices_ranked": fleet.voices_ranked, "voices_note": NOT_RECORDED["voices"],
        "voice_field_notes": dict(VOICE_FIELDS),
        "training": None if queue is None else _queue_json(queue),
        "training_error": report.queue_error, "training_redis": report.queue_redis,
        "training_prefix": report.settings.queue_prefix,
        "gateways": [_presence_json(p) for p in report.presence if p.kind == "gateway"],
        "agents": [_presence_json(p) for p in report.presence if p.kind == "agent"],
        "presence_note": NOT_RECORDED["presence"],
        "problems": [dataclasses.asdict(p) for p in report.problems],
    }


def _queue_json(queue: QueueView) -> dict[str, Any]:
    def job(j, **extra) -> dict[str, Any]:
        return {"job_id": j.job_id, "voice_id": j.voice_id, "state": j.state, "progress": j.progress,
                "step": j.step, "total_steps": j.total_steps, "consumer": j.consumer, "attempts": j.attempts,
                "age_s": _round(queue.read_at - j.created_at), **extra}

    return {
        "queued": len(queue.queued), "oldest_queued_age_s": _round(queue.oldest_queued_age_s),
        "queued_jobs": [job(j) for j in queue.queued],
        "running": [job(r.status, leased=r.leased) for r in queue.running],
        "failed_recent": [job(j, error_code=j.error_code, error=j.error,
                              failed_ago_s=_round(queue.read_at - j.updated_at)) for j in queue.failed_recent],
        "failed_window_s": queue.failed_window_s, "pending_entries": queue.pending_entries,
        "jobs_read": queue.scanned, "complete": queue.complete,
    }


def duration(seconds: float) -> str:
    """Seconds as an operator reads them: 4.2s, 21s, 3m 05s, 1h 00m (problems and the terminal view)."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h {int(seconds % 3600 // 60):02d}m"


def _heartbeat(w: WorkerRow) -> str:
    return "it never heartbeated" if w.heartbeat_age_s is None else f"last heartbeat {duration(w.heartbeat_age_s)} ago"


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _presence_json(p: Presence) -> dict:
    return {"id": p.id, "seen_age_s": p.seen_age_s, "silent": p.silent, "address": p.info.get("address"),
            "pid": p.info.get("pid"), "started_at": p.info.get("started_at")}
