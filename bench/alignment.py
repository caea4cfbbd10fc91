"""`voicering bench alignment --json`: word timings against speech whose word starts are known.

The speech: espeak-ng reading SENTENCES (money, times, dates and a tag among them, so timings
go back through the text front end) in six voices (two of them espeak's other synthesizers:
Klatt and a Caribbean accent) at 140, 175 and 210 words a minute, and once more per voice with
every word at its own rate (70-140 %) and pauses of 0-300 ms after some words (SSML), so the
timing is not a uniform stretch of anything. Truth: the sample espeak-ng's C library reports
each word starting at; a written word read as several spoken words ("$5") starts with its first.
A word's audio ends at its last voiced frame before the next word (`voiced_ends`, as the
reference's words end; the lag is counted from there).

Ours: the worker's aligner exactly as a context runs it (`gpu_worker.alignment`): the text
front end's reading, a reference read by espeak-ng's en-us voice at 175 wpm, the audio fed in
2048-sample chunks (one SNAC frame) at 24 kHz, silero's speech check on. `lag_behind_audio_ms`:
for each word, the audio time when its timing came out plus that push's own compute time, minus
the end of the word's audio. CPU: process time of everything the aligner did (reference, pushes,
finish) over the audio's length.

The peer, on the same audio and words: livekit-agents' own estimate when a TTS sends no
timings: its `hyphenate_word` syllables per word, spoken at one rate over the segment's whole
audio (what its `_SegmentSynchronizerImpl` settles on when the audio and text are both done; it
starts from a fixed 3.83 syllables/s before that, which would only be worse). A word starts after
the syllables before it.

What this cannot show: the reference and the test speech come from one synthesizer, which
favours a reference-warping aligner; on a real voice the speakers' spectra differ more. The
figures on real Orpheus speech need real weights (docs/alignment.md says what stays unverified).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

TARGETS: Final = {"word_start_error_ms_p50": ("<=", 40.0), "word_start_error_ms_p90": ("<=", 100.0),
                  "peer_over_ours_p50": (">=", 3.0), "words_timed_share": (">=", 1.0),
                  "lag_behind_audio_ms_p99": ("<=", 1000.0), "noise_estimated_share": (">=", 1.0)}
SAMPLE_RATE: Final = 24000
CHUNK: Final = 2048  # one SNAC frame: what a worker emits at a time
VOICES: Final = ("en+f3", "en", "en-us+m3", "en-GB-scotland+f4", "en-029", "en+klatt")
RATES: Final = (140, 175, 210)
SENTENCES: Final = (
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "I paid $5 at 3:30pm on Dec. 4th, and the receipt says 12 items.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Well <laugh> that was not what I expected, honestly.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "Our meeting moved to Tuesday the 21st, room 404, at 10 a.m. sharp.",
)


@dataclass(frozen=True, slots=True)
class Case:
    text: str  # the caller's text
    voice: str
    wpm: int
    varied: bool  # every word at its own rate, pauses after some


@dataclass(slots=True)
class Measured:
    errors_ms: list[float]
    signed_ms: list[float]
    peer_errors_ms: list[float]
    lags_ms: list[float]
    words: int
    timed: int
    estimated: int
    audio_s: float
    cpu_s: float


def cases() -> list[Case]:
    out = [Case(t, v, r, False) for v in VOICES for r in RATES for t in SENTENCES]
    return out + [Case(t, v, 175, True) for v in VOICES for t in SENTENCES]


def _ssml(spoken: str, spans: Sequence[tuple[int, int]], rng: random.Random) -> tuple[str, list[tuple[int, int]]]:
    """`spoken` as SSML, each word at its own rate and a pause after some; the words' new spans."""
    out, new_spans, at = ["<speak>"], [], 0
    length = len("<speak>")
    for a, b in spans:
        gap = spoken[at:a]
        out.append(gap)
        length += len(gap)
        head = f'<prosody rate="{rng.randint(70, 140)}%">'
        out.append(head)
        length += len(head)
        new_spans.append((length, length + (b - a)))
        out.append(spoken[a:b])
        length += b - a
        tail = "</prosody>" + (f'<break time="{rng.randint(0, 300)}ms"/>' if rng.random() < 0.3 else "")
        out.append(tail)
        length += len(tail)
        at = b
    out.append(spoken[at:] + "</speak>")
    return "".join(out), new_spans


def peer_starts(words: Sequence[str], audio_s: float) -> list[float]:
    """livekit-agents' estimate: syllables spoken at one rate over the whole audio."""
    from livekit.agents.tokenize.basic import hyphenate_word

    hyphens = [max(1, len(hyphenate_word(w))) for w in words]
    speed = sum(hyphens) / audio_s
    starts, before = [], 0
    for h in hyphens:
        starts.append(before / speed)
        before += h
    return starts


def measure(case: Case, espeak, checks, rng: random.Random) -> Measured:  # noqa: ANN001
    import soxr

    from gpu_worker.alignment import CallerWords, WordTimer, blank_tags, reference_for, voiced_ends, word_starts
    from gpu_worker.alignment.features import HOP_S, features
    from gpu_worker.text import normalize

    normalized = normalize(case.text)
    words = CallerWords.of(normalized)
    if case.varied:
        ssml, spans = _ssml(blank_tags(normalized.text), words.spans, rng)
        spoken = espeak.speak(ssml, voice=case.voice, wpm=case.wpm, ssml=True)
    else:
        spans = words.spans
        spoken = espeak.speak(blank_tags(normalized.text), voice=case.voice, wpm=case.wpm)
    pcm = soxr.resample(spoken.pcm, spoken.sample_rate, SAMPLE_RATE).astype(np.float32)
    starts = word_starts(spans, spoken) / spoken.sample_rate  # per spoken word, seconds
    ends = voiced_ends((starts / HOP_S).astype(np.int64), features(pcm, SAMPLE_RATE)[1]) * HOP_S
    groups = words.groups
    truth_start = [starts[g.first] for g in groups]
    truth_end = [ends[g.last] for g in groups]

    began = time.process_time()
    timer = WordTimer(reference_for(normalized.text, espeak, words.spans), SAMPLE_RATE, check=checks.new(SAMPLE_RATE))
    got: list[tuple[object, float]] = []  # (TimedWord, when it came out: audio seconds + compute seconds)
    for at in range(0, len(pcm), CHUNK):
        t0 = time.perf_counter()
        out = words.push((w.index, w.start_s, w.end_s) for w in timer.push(pcm[at:at + CHUNK]))
        when = min(len(pcm), at + CHUNK) / SAMPLE_RATE + (time.perf_counter() - t0)
        got += [(w, when) for w in out]
    t0 = time.perf_counter()
    final = timer.finish()
    out = words.push((w.index, w.start_s, w.end_s) for w in final)
    got += [(w, len(pcm) / SAMPLE_RATE + (time.perf_counter() - t0)) for w in out]
    cpu = time.process_time() - began

    audio_s = len(pcm) / SAMPLE_RATE
    peer = peer_starts([g.text for g in groups], audio_s)
    n = min(len(got), len(groups))
    return Measured(
        errors_ms=[abs(got[i][0].start_s - truth_start[i]) * 1000 for i in range(n)],
        signed_ms=[(got[i][0].start_s - truth_start[i]) * 1000 for i in range(n)],
        peer_errors_ms=[abs(peer[i] - truth_start[i]) * 1000 for i in range(len(groups))],
        lags_ms=[(got[i][1] - truth_end[i]) * 1000 for i in range(n)],
        words=len(groups), timed=len(got), estimated=sum(w.estimated for w in final), audio_s=audio_s, cpu_s=cpu)


def _noise_estimated_share(espeak, checks) -> float:  # noqa: ANN001
    """The stand-in's case: noise for a sentence's length. Every word must come out estimated."""
    from gpu_worker.alignment import WordTimer, reference_for

    rng = np.random.default_rng(0)
    shares = []
    for text in SENTENCES[:3]:
        ref = reference_for(text.replace("$", ""), espeak)
        noise = (rng.standard_normal(int(ref.duration_s * SAMPLE_RATE)) * 0.1).astype(np.float32)
        timer = WordTimer(ref, SAMPLE_RATE, check=checks.new(SAMPLE_RATE))
        early = [w for at in range(0, len(noise), CHUNK) for w in timer.push(noise[at:at + CHUNK])]
        final = timer.finish()
        shares.append(0.0 if early else sum(w.estimated for w in final) / max(1, len(final)))
    return min(shares)


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def run(limit: int | None = None, rounds: int = 3) -> dict:
    """`limit`: only the first cases (the suite's smoke run); `rounds`: CPU timed this many times."""
    from gpu_worker.alignment import Espeak, SpeechChecks

    from bench.burst import judge

    started = time.perf_counter()
    espeak, checks = Espeak(), SpeechChecks()
    chosen = cases()[:limit] if limit else cases()
    rng = random.Random(7)
    measure(chosen[0], espeak, checks, random.Random(0))  # warm: imports, first allocations
    results = [measure(c, espeak, checks, rng) for c in chosen]
    cpu_rounds = [sum(r.cpu_s for r in results) / sum(r.audio_s for r in results)]
    for _ in range(rounds - 1):
        rng = random.Random(7)
        again = [measure(c, espeak, checks, rng) for c in chosen]
        cpu_rounds.append(sum(r.cpu_s for r in again) / sum(r.audio_s for r in again))

    def pooled(pick: Callable[[Measured], list[float]], only: Callable[[Case], bool] = lambda c: True) -> list[float]:
        return [x for c, r in zip(chosen, results) if only(c) for x in pick(r)]

    errors, peer = pooled(lambda r: r.errors_ms), pooled(lambda r: r.peer_errors_ms)
    lags = pooled(lambda r: r.lags_ms)
    ours_p50, peer_p50 = _pct(errors, 50), _pct(peer, 50)
    figures = {
        "word_start_error_ms_p50": ours_p50,
        "word_start_error_ms_p90": _pct(errors, 90),
        "word_start_error_ms_max": _pct(errors, 100),
        "word_start_bias_ms_p50": _pct(pooled(lambda r: r.signed_ms), 50),  # < 0: ours early
        "peer_word_start_error_ms_p50": peer_p50,
        "peer_word_start_error_ms_p90": _pct(peer, 90),
        "peer_over_ours_p50": round(peer_p50 / ours_p50, 2) if ours_p50 and peer_p50 is not None else None,
        "words_timed_share": round(sum(r.timed for r in results) / sum(r.words for r in results), 4),
        "estimated_words_on_speech": sum(r.estimated for r in results),
        "lag_behind_audio_ms_p50": _pct(lags, 50),
        "lag_behind_audio_ms_p99": _pct(lags, 99),
        "lag_behind_audio_ms_max": _pct(lags, 100),
        "cpu_s_per_audio_s": round(statistics.median(cpu_rounds), 4),
        "cpu_s_per_audio_s_rounds": [round(x, 4) for x in cpu_rounds],
        "noise_estimated_share": _noise_estimated_share(espeak, checks),
        "by_condition": {
            name: {"word_start_error_ms_p50": _pct(pooled(lambda r: r.errors_ms, only), 50),
                   "word_start_error_ms_p90": _pct(pooled(lambda r: r.errors_ms, only), 90),
                   "peer_word_start_error_ms_p50": _pct(pooled(lambda r: r.peer_errors_ms, only), 50)}
            for name, only in (("even_rate", lambda c: not c.varied), ("varied_rate_and_pauses", lambda c: c.varied),
                               *((f"voice {v}", (lambda v: lambda c: c.voice == v)(v)) for v in VOICES))},
        "words": sum(r.words for r in results),
        "audio_s": round(sum(r.audio_s for r in results), 1),
        "config": {"cases": len(chosen), "voices": list(VOICES), "rates_wpm": list(RATES), "chunk_samples": CHUNK,
                   "reference": "espeak-ng en-us 175 wpm", "rounds": rounds},
    }
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    figures["targets_met"] = judge(figures, TARGETS)
    return figures
