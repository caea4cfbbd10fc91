"""Where to cut a recording into training contexts: at pauses, into pieces of ~2-15 s.

Speech activity comes from silence_trim's frame levels (10 ms frames, detrended RMS in dBFS)
against a threshold that follows the recording's noise floor. Gaps shorter than `min_pause_ms`
are breaths inside speech; longer ones are places to cut, each cut in the middle of its pause
(the clip trimmer then removes the rest of the silence).

Two ways to group speech into pieces:

- `pack`: no text yet (ASR will transcribe each piece): greedy, pieces up to `clip_max_s`,
  short pieces merged with a neighbour.
- `align`: a transcript for a whole file. A file whose speech fits one clip (or a one-sentence
  transcript) stays one piece; a longer one has its sentences matched to the pauses by dynamic
  programming (sentence boundaries land near where their share of characters puts them, preferring
  long pauses). Either way it is checked: the file, and every sentence, must be spoken at a
  plausible rate, or the transcript does not match the audio and the file is refused. (Without
  ASR this is a plausibility check, not a proof: a transcript with the right sentence count and
  lengths but other words passes it.)

Pure functions over numpy arrays; sample indices at 24 kHz.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.errors import TranscriptError
from lora_training.settings import DataParams
from silence_trim.energy import EnergyParams
from silence_trim.levels import frame_levels_db

FRAME = SAMPLE_RATE // 100  # 10 ms
MIN_REGION_MS = 60.0  # shorter bursts are clicks, not speech
FLOOR_MARGIN_DB = 15.0  # activity threshold sits this far above the noise floor...
RATE_TOLERANCE = 2.5  # a sentence spoken this much faster or slower than the file's mean is a mismatch
CHARS_PER_S = (7.0, 30.0)  # plausible reading rates (80-350 words a minute), pauses included


@dataclass(frozen=True)
class Piece:
    """A stretch of a recording to become one clip: cut at [start, end), speech within [first, last)."""

    start: int
    end: int
    first: int
    last: int
    text: str | None = None

    @property
    def speech_s(self) -> float:
        return (self.last - self.first) / SAMPLE_RATE


def activity(audio: np.ndarray) -> np.ndarray:
    """Per 10 ms frame: is there speech? [n] -> [ceil(n / 240)] bool."""
    return active_frames(frame_levels_db(np.asarray(audio, dtype=np.float64), FRAME))


def active_frames(levels: np.ndarray) -> np.ndarray:
    """Per frame, from its level in dBFS (`FRAME` samples, as a stream's `LevelMeter` gives them): is
    there speech? [F] -> [F] bool."""
    floor = float(np.percentile(levels, 10)) if levels.size else -120.0
    threshold = max(EnergyParams().off_db, floor + FLOOR_MARGIN_DB)
    return levels >= min(threshold, EnergyParams().on_db)


def speech_regions(audio: np.ndarray, data: DataParams) -> list[tuple[int, int]]:
    """Runs of speech [start, end) in samples, gaps shorter than min_pause_ms closed."""
    return regions_of(activity(audio), audio.size, data)


def regions_of(active: np.ndarray, total: int, data: DataParams) -> list[tuple[int, int]]:
    """`speech_regions` from per-frame activity over `total` samples (a decoded stream's levels)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], active.astype(np.int8), [0]])))
    runs = edges.reshape(-1, 2)  # [R, 2] frame indices
    min_gap = round(data.min_pause_ms / 10.0)
    merged: list[list[int]] = []
    for start, end in runs.tolist():
        if merged and start - merged[-1][1] < min_gap:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    min_len = round(MIN_REGION_MS / 10.0)
    return [(s * FRAME, min(e * FRAME, total)) for s, e in merged if e - s >= min_len]


def _cuts(regions: list[tuple[int, int]], total: int) -> list[int]:
    """Cut positions: file start, the middle of each pause, file end ([R + 1])."""
    middles = [(regions[i][1] + regions[i + 1][0]) // 2 for i in range(len(regions) - 1)]
    return [0, *middles, total]


def _split_long(region: tuple[int, int], max_len: int) -> list[tuple[int, int]]:
    """A run of speech longer than a clip, with no pause in it: equal parts (rare in read speech)."""
    start, end = region
    parts = -(-(end - start) // max_len)
    bounds = np.linspace(start, end, parts + 1).astype(int)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def _group(spans: list[tuple[int, int]], data: DataParams) -> list[list[int]]:
    """Consecutive spans joined while the group is shorter than clip_min_s and the result fits clip_max_s."""
    max_len, min_len = data.clip_max_s * SAMPLE_RATE, data.clip_min_s * SAMPLE_RATE
    groups: list[list[int]] = []
    for i, (start, end) in enumerate(spans):
        if groups:
            first = spans[groups[-1][0]][0]
            if spans[groups[-1][-1]][1] - first < min_len and end - first <= max_len:
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def pack(regions: list[tuple[int, int]], total: int, data: DataParams) -> list[Piece]:
    """Pause-sized pieces of at most clip_max_s, short ones joined with the next (no text yet)."""
    max_len = int(data.clip_max_s * SAMPLE_RATE)
    flat = [part for region in regions for part in _split_long(region, max_len)]
    cuts = _cuts(flat, total)
    return [Piece(cuts[g[0]], cuts[g[-1] + 1], flat[g[0]][0], flat[g[-1]][1]) for g in _group(flat, data)]


def align(sentences: list[str], regions: list[tuple[int, int]], total: int, data: DataParams, *, name: str) -> list[Piece]:
    """Pieces for a transcript: sentences matched to pauses, then grouped into clips."""
    if not regions:
        return []
    if regions[-1][1] - regions[0][0] <= data.clip_max_s * SAMPLE_RATE or len(sentences) <= 1:
        text = " ".join(sentences)
        _check_rates([(regions[0][0], regions[-1][1], text)], name)  # one clip's transcript must fit its audio too
        return [Piece(0, total, regions[0][0], regions[-1][1], text)]
    gaps = len(regions) - 1
    if gaps < len(sentences) - 1:
        raise TranscriptError(
            f"{name}: the transcript has {len(sentences)} sentences but only {gaps + 1} stretches of speech "
            "were heard: check that the transcript belongs to this file, or cut the file into one clip per sentence"
        )
    bounds = _sentence_bounds(sentences, regions)  # [N + 1] region indices
    pieces = [(regions[bounds[k]][0], regions[bounds[k + 1] - 1][1], sentences[k]) for k in range(len(sentences))]
    _check_rates(pieces, name)
    return _group_sentences(pieces, regions, bounds, total, data)


def _sentence_bounds(sentences: list[str], regions: list[tuple[int, int]]) -> list[int]:
    """Dynamic programming over pauses: sentence k covers regions [b_k, b_{k+1})."""
    n, gaps = len(sentences), len(regions) - 1
    chars = np.cumsum([len(s) for s in sentences], dtype=np.float64)  # [N]
    expected = regions[0][0] + (regions[-1][1] - regions[0][0]) * chars[:-1] / chars[-1]  # [N-1] samples
    middles = np.array([(regions[j][1] + regions[j + 1][0]) / 2 for j in range(gaps)])  # [G]
    lengths = np.array([regions[j + 1][0] - regions[j][1] for j in range(gaps)]) / SAMPLE_RATE  # [G] s
    span = regions[-1][1] - regions[0][0]
    # cost of putting boundary k at gap j: distance from where its characters say, minus a bonus for long pauses
    cost = ((middles[None, :] - expected[:, None]) / span) ** 2 * 50.0 - np.minimum(lengths, 1.0)[None, :]  # [N-1, G]
    best = np.full((n - 1, gaps), np.inf)
    back = np.zeros((n - 1, gaps), dtype=np.int64)
    best[0] = cost[0]
    for k in range(1, n - 1):
        prefix = np.minimum.accumulate(best[k - 1])  # best over gaps j' <= j
        arg = _prefix_argmin(best[k - 1])
        best[k, 1:] = prefix[:-1] + cost[k, 1:]  # boundary k must sit after boundary k-1
        back[k, 1:] = arg[:-1]
    chosen = [int(np.argmin(best[-1]))]
    for k in range(n - 2, 0, -1):
        chosen.append(int(back[k, chosen[-1]]))
    chosen.reverse()
    return [0, *(j + 1 for j in chosen), len(regions)]


def _prefix_argmin(row: np.ndarray) -> np.ndarray:
    """Index of the minimum of row[: j + 1] for every j."""
    out = np.zeros(row.size, dtype=np.int64)
    best = 0
    for j in range(row.size):
        if row[j] < row[best]:
            best = j
        out[j] = best
    return out


def _check_rates(pieces: list[tuple[int, int, str]], name: str) -> None:
    chars = sum(len(text) for _, _, text in pieces)
    seconds = sum(end - start for start, end, _ in pieces) / SAMPLE_RATE
    mean = chars / seconds
    if not CHARS_PER_S[0] <= mean <= CHARS_PER_S[1]:
        raise TranscriptError(
            f"{name}: the transcript does not follow the audio ({chars} characters for {seconds:.0f} s of speech, "
            f"{mean:.1f} characters/s; reading speed is {CHARS_PER_S[0]:.0f}-{CHARS_PER_S[1]:.0f}): check that the "
            "transcript belongs to this file and is complete"
        )
    for start, end, text in pieces:
        rate = len(text) / max((end - start) / SAMPLE_RATE, 0.05)
        if not mean / RATE_TOLERANCE <= rate <= mean * RATE_TOLERANCE:
            raise TranscriptError(
                f"{name}: the transcript does not follow the audio (the sentence \"{text[:60]}\" would be spoken "
                f"at {rate:.0f} characters/s against {mean:.0f} on average): check that the transcript belongs to "
                "this file and is complete, or upload one file per sentence"
            )


def _group_sentences(pieces, regions, bounds, total: int, data: DataParams) -> list[Piece]:
    """Sentence-sized clips, short sentences joined. A sentence longer than clip_max_s stays alone
    (it cannot be cut without word timings; the clip cutter drops it and reports it)."""
    cuts = _cuts(regions, total)
    runs: list[list[int]] = [[]]  # runs of consecutive sentences that fit a clip
    for k, (start, end, _) in enumerate(pieces):
        if end - start <= data.clip_max_s * SAMPLE_RATE:
            runs[-1].append(k)
        else:
            runs.extend([[k], []])
    out = []
    for run in (r for r in runs if r):
        for group in _group([(pieces[k][0], pieces[k][1]) for k in run], data):
            first, last = run[group[0]], run[group[-1]]
            text = " ".join(pieces[k][2] for k in range(first, last + 1))
            out.append(Piece(cuts[bounds[first]], cuts[bounds[last + 1]], pieces[first][0], pieces[last][1], text))
    return out
