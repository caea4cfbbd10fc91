"""What an agent server's rooms did, as Prometheus metrics: sessions open, turns by how they ended
(completed, interrupted), turns that failed (an error event of the TTS, LLM or STT), and the TTS's
time to first audio per turn.

LiveKit runs each room in a job process of its own, and the agent server's main process serves
`/metrics` (livekit-agents' `prometheus_port`) from prometheus_client's multiprocess files
(`prometheus_multiproc_dir`): so the metrics here are made in each job process, registered in no
registry (``registry=None``: their values go to that process's files, which the main process
collects), or in a registry given for a test. An `AgentMetrics` is attached to each session a job
process runs. `sessions` is summed over the job processes' files (`livesum`); a job process that
dies without closing its session (a crash) leaves it counted until the server restarts, as
livekit-agents' own `lk_agents_active_job_count` does (neither marks dead job processes).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["TURN_OUTCOMES", "AgentMetrics"]

log = logging.getLogger(__name__)

PREFIX = "voicering_agent"
TURN_OUTCOMES = ("completed", "interrupted")
_TTFB_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry
        self.sessions = Gauge(f"{PREFIX}_sessions", "Agent sessions open (rooms joined), over all job processes",
                              registry=r, multiprocess_mode="livesum")
        self.turns = Counter(f"{PREFIX}_turns", "Agent turns (speech handles) by how they ended: completed, "
                             "interrupted", ["outcome"], registry=r)
        self.failed_turns = Counter(f"{PREFIX}_failed_turns", "Errors a session reported, by source (tts, llm, stt, "
                                    "other): a turn that could not be spoken or answered", ["source"], registry=r)
        self.ttfb = Histogram(f"{PREFIX}_tts_ttfb_seconds", "The voicering TTS's time to first audio per request, as "
                              "the framework measures it (first text sent -> first audio frame)",
                              buckets=_TTFB_BUCKETS, registry=r)
        for outcome in TURN_OUTCOMES:
            self.turns.labels(outcome)

    def attach(self, session, tts) -> None:
        """Count this session: open now, until its `close` event; its turns and errors; ``tts``'s
        TTFB (the plugin's `metrics_collected` events)."""
        self.sessions.inc()
        closed = False

        def on_close(_event) -> None:
            nonlocal closed
            if not closed:
                closed = True
                self.sessions.dec()

        def on_speech(event) -> None:
            event.speech_handle.add_done_callback(
                lambda handle: self.turns.labels("interrupted" if handle.interrupted else "completed").inc())

        def on_error(event) -> None:
            self.failed_turns.labels(_source(event.source)).inc()

        def on_tts_metrics(metrics) -> None:
            ttfb = getattr(metrics, "ttfb", None)
            if isinstance(ttfb, int | float) and ttfb >= 0:
                self.ttfb.observe(ttfb)

        session.on("close", on_close)
        session.on("speech_created", on_speech)
        session.on("error", on_error)
        tts.on("metrics_collected", on_tts_metrics)


def _source(source: object) -> str:
    """tts / llm / stt from the object that raised (the framework passes the plugin itself)."""
    from livekit.agents import llm, stt, tts

    for name, kind in (("tts", tts.TTS), ("llm", llm.LLM), ("stt", stt.STT)):
        if isinstance(source, kind):
            return name
    return "other"
