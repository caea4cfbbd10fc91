"""Who speaks in an upload: a second voice among the creator's, and whether a consent recording is
the creator's voice. Pure numpy over `SpeakerWindows` (speaker.py makes them; torch stays there).

Second speaker: every window of the whole upload is split in two by spherical 2-means on cosine.
Two clusters always come out, so the split counts as two voices only when their centroids are
less alike than `thresholds.second_speaker_centroid_similarity` (one voice split in two keeps two
near-identical centroids). The smaller cluster is the other voice; its share of the upload's
speech decides `block` / `warn`, and each contiguous stretch of it is one finding with its file
and time. Consent: a recording's embedding against the centroid of the upload's windows, held to
the upload's own spread less a margin, so noisy uploads (wide spread) are judged by their noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from lora_training.quality.findings import Finding, clock
from lora_training.quality.speaker import SpeakerWindows
from lora_training.quality.thresholds import CheckThresholds

__all__ = [
    "MAX_RANGES_LISTED",
    "MERGE_GAP_S",
    "MIN_WINDOWS",
    "SPREAD_PERCENTILE",
    "SpeakerMatch",
    "Verdict",
    "second_speaker",
    "speaker_match",
    "two_means",
]

MIN_WINDOWS = 4  # fewer windows (~4 s of speech) in the whole upload: too little to split into voices
MERGE_GAP_S = 1.0  # stretches of the other voice this close in one file are one stretch
MAX_RANGES_LISTED = 8  # findings listed one by one; the rest are counted in one more finding
SPREAD_PERCENTILE = 5.0  # the upload's spread: this percentile of its windows' similarity to their centroid
KMEANS_ROUNDS = 30

# the consent voice against the uploads': the same person; unsure because the recordings sound like
# different rooms or microphones (refused, asking for a recording made where the uploads were); another person
Verdict = Literal["same", "other_room", "other_speaker"]


@dataclass(frozen=True, slots=True)
class SpeakerMatch:
    """A candidate voice against a reference (the upload). `similarity`: cosine of the candidate to
    the reference centroid; `spread`: the reference's own 5th-percentile window similarity to that
    centroid; `limit`: what `similarity` had to reach; `same`: it did. `verdict`: which of the three
    `Verdict`s; `rooms_differ`: the two sound like different rooms or microphones (set by
    lora_training.consent, which also gives `other_room`)."""

    similarity: float
    spread: float
    limit: float
    same: bool
    verdict: Verdict = "other_speaker"
    rooms_differ: bool = False


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def two_means(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spherical 2-means: (labels [N] of 0/1, centroids [2, D] unit). Deterministic: seeded by the
    sign of each vector on the first principal direction (where two voices differ most)."""
    x = _unit_rows(vectors.astype(np.float64))  # [N, D]
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    labels = (centred @ vt[0] > 0).astype(np.int64)
    if labels.min() == labels.max():
        labels[np.argmin(centred @ vt[0])] = 1 - labels[0]
    centroids = np.zeros((2, x.shape[1]))
    for _ in range(KMEANS_ROUNDS):
        for k in (0, 1):
            members = x[labels == k]
            centroids[k] = _unit(members.mean(axis=0)) if members.size else x[np.argmin(x @ centroids[1 - k])]
        new = np.argmax(x @ centroids.T, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels, centroids


def second_speaker(windows_by_file: dict[str, SpeakerWindows], thresholds: CheckThresholds) -> list[Finding]:
    """Findings for another voice in the upload: one per contiguous stretch of it (the first
    MAX_RANGES_LISTED, longest first, then one finding counting the rest), all at the level its
    share of speech reaches. No finding: one voice, or the other voice under the warn share."""
    files = [name for name, w in windows_by_file.items() if len(w)]
    if sum(len(windows_by_file[f]) for f in files) < MIN_WINDOWS:
        return []
    vectors = np.concatenate([windows_by_file[f].vectors for f in files])
    owner = np.concatenate([np.full(len(windows_by_file[f]), i) for i, f in enumerate(files)])
    labels, centroids = two_means(vectors)
    if float(centroids[0] @ centroids[1]) >= thresholds.second_speaker_centroid_similarity:
        return []  # one voice: the split's halves sound alike
    other = int(np.sum(labels == 1) < np.sum(labels == 0))  # the smaller cluster
    share = float(np.mean(labels == other))
    if share <= thresholds.warn_second_speaker_fraction:
        return []
    level = "block" if share > thresholds.block_second_speaker_fraction else "warn"
    limit = thresholds.block_second_speaker_fraction if level == "block" else thresholds.warn_second_speaker_fraction
    stretches = [
        (name, start, end)
        for i, name in enumerate(files)
        for start, end in _stretches(windows_by_file[name], labels[owner == i] == other)
    ]
    listed = sorted(stretches, key=lambda s: s[2] - s[1], reverse=True)[:MAX_RANGES_LISTED]
    listed.sort(key=lambda s: (files.index(s[0]), s[1]))
    percent = round(100 * share)
    findings = [
        Finding(
            level=level, code="second_speaker",
            message=f"another voice speaks at {clock(start)}–{clock(end)} in {name} "
                    f"({percent} % of the upload's speech is another voice: cut it out, or upload only your own voice)",
            file=name, start_s=start, end_s=end, value=100 * share, limit=100 * limit,
        )
        for name, start, end in listed
    ]
    if len(stretches) > len(listed):
        rest = len(stretches) - len(listed)
        findings.append(Finding(
            level=level, code="second_speaker",
            message=f"another voice also speaks in {rest} more shorter places in the upload "
                    f"(the {len(listed)} longest are listed)",
            value=100 * share, limit=100 * limit,
        ))
    return findings


def _stretches(windows: SpeakerWindows, is_other: np.ndarray) -> list[tuple[float, float]]:
    """Merged time ranges of one file's windows flagged `is_other`. A window stands for its middle
    hop (centre ± half the hop), so a stretch ends within half a hop of where the voice changes."""
    if not np.any(is_other):
        return []
    order = np.argsort(windows.start_s)
    start, end, flags = windows.start_s[order], windows.end_s[order], is_other[order]
    centre = (start + end) / 2
    half = float(np.median(np.diff(start))) / 2 if start.size > 1 else float(end[0] - start[0]) / 2
    ranges: list[list[float]] = []
    for i in np.flatnonzero(flags):
        lo = max(float(start[i]), float(centre[i]) - half)
        hi = min(float(end[i]), float(centre[i]) + half)
        if ranges and lo - ranges[-1][1] <= MERGE_GAP_S:
            ranges[-1][1] = max(ranges[-1][1], hi)
        else:
            ranges.append([lo, hi])
    return [(lo, hi) for lo, hi in ranges]


def speaker_match(
    reference: SpeakerWindows | list[np.ndarray],
    candidate: np.ndarray,
    thresholds: CheckThresholds | None = None,
) -> SpeakerMatch:
    """Is `candidate` (one clip's embedding) the reference's voice? Held to the reference's own
    spread (SPREAD_PERCENTILE of its windows' similarity to their centroid) less
    `consent_speaker_margin`, never below `consent_min_similarity`. Give the upload's windows: a
    whole clip lands nearer the centroid than its windows do, so the window spread is a fair,
    slightly generous bar; a reference of a few long files' embeddings has a much tighter spread
    than one short recording can meet."""
    limits = thresholds or CheckThresholds()
    vectors = reference.vectors if isinstance(reference, SpeakerWindows) else np.stack(list(reference))
    if vectors.shape[0] == 0:
        raise ValueError("the reference holds no speech windows: embed the upload's speech first")
    rows = _unit_rows(vectors.astype(np.float64))
    centroid = _unit(rows.mean(axis=0))
    spread = float(np.percentile(rows @ centroid, SPREAD_PERCENTILE))
    similarity = float(_unit(np.asarray(candidate, dtype=np.float64).ravel()) @ centroid)
    limit = max(limits.consent_min_similarity, spread - limits.consent_speaker_margin)
    same = similarity >= limit
    return SpeakerMatch(similarity=similarity, spread=spread, limit=limit, same=same,
                        verdict="same" if same else "other_speaker")
