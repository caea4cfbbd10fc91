"""What a listener hears from a stream of audio chunks: the client's playout with a jitter buffer.

Playback starts ``buffer_s`` (100 ms) after the first chunk arrives and plays chunks back to back.
A chunk is *due* when the audio before it has finished playing; one that arrives later than that is
an **underrun**: the listener hears a gap (a stall) until it arrives, and playback carries on from
its arrival (no re-buffering, so one late chunk is one stall, not a cascade). A stream is real
time when it never underruns. Pure arithmetic on arrival times; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

JITTER_BUFFER_S = 0.100
SAMPLE_RATE = 24_000
BYTES_PER_SAMPLE = 2  # PCM16 mono


@dataclass(frozen=True, slots=True)
class Playout:
    """One stream as played: how many chunks came late and how long the listener waited in all."""

    chunks: int
    underruns: int
    stall_s: float
    audio_s: float

    @property
    def realtime(self) -> bool:
        return self.underruns == 0


def chunk_seconds(pcm_bytes: int) -> float:
    return pcm_bytes / BYTES_PER_SAMPLE / SAMPLE_RATE


def playout(arrivals: Sequence[float], durations: Sequence[float], buffer_s: float = JITTER_BUFFER_S) -> Playout:
    """Replay chunk arrival times (seconds, any origin) and audio durations through the player."""
    if len(arrivals) != len(durations):
        raise ValueError("one duration per arrival")
    if not arrivals:
        return Playout(0, 0, 0.0, 0.0)
    due = arrivals[0] + buffer_s  # when playback needs the next chunk
    underruns, stall = 0, 0.0
    for arrival, duration in zip(arrivals, durations, strict=True):
        if arrival > due:
            underruns += 1
            stall += arrival - due
            due = arrival
        due += duration
    return Playout(len(arrivals), underruns, stall, float(sum(durations)))
