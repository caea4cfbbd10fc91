"""The clone report: how much the trained voice sounds like the creator, and how well it is understood.

In the validating step, through the same worker that spoke the validation sample, the staged clone
and each base voice (the impostors) speak a fixed sentence list (`TrainSettings.report_sentences`).
Scores, with the speaker model of lora_training.quality.speaker and the job's ASR:

- similarity: ``s`` = cosine(centroid of the clone's samples, centroid of the creator's held-out
  clips); ``s_imp`` = the same for each base voice's samples, averaged over the base voices;
  ``s_self`` = held-out centroid against the training clips' centroid; ``normalized`` =
  (s - s_imp) / (s_self - s_imp): 0 sounds like a platform voice, 1 like the creator's own clips.
- intelligibility: WER of each sample against its sentence, the clone's beside the base voices'.
- MOS: only with a predictor installed (none is: ``mos`` is null and says why).

Without a hold-out (too little speech to spare, `dataset.hold_out`) the reference is the training
clips, split in two halves for ``s_self``, and the report says so: the clone was trained on them.
`gate` turns failed thresholds into warn findings or a `CloneQualityError` (the tenant's
report_gate); on the stand-in base model (random weights: noise) the scores mean nothing, the report
says so and "block" acts as "warn".
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.clips import Clip
from lora_training.errors import CloneQualityError, TrainingError
from lora_training.quality.findings import Finding
from lora_training.quality.thresholds import CheckThresholds
from lora_training.text import normalize

__all__ = ["CLONE", "MIN_SELF_GAP", "REFERENCE_MAX_S", "REPORT_VERSION", "Gate", "ReportSpeaker", "WorkerSpeaker",
           "block_message", "centroid", "gate", "is_stand_in", "make_report", "normalized_similarity", "report_findings", "wer",
           "word_errors"]

REPORT_VERSION = 1
CLONE = "clone"  # the clone's samples in `samples[].voice` (base voices go by their names)
WAV_HEADER_BYTES = 44
MIN_SELF_GAP = 0.02  # s_self - s_imp below this: impostors and self are not told apart, no normalized score
REFERENCE_MAX_S = 300.0  # speech of the training clips embedded as the reference (bounds the report's cost)
MOS_NOTE = "no MOS predictor is installed on this trainer (UTMOS and the like are not packaged here)"
STAND_IN_NOTE = ("the base model is the stand-in (random weights that make noise, not speech): these scores mean "
                 "nothing about a real clone, and the report gate only warns")
_WORD = re.compile(r"[a-z0-9']+")

Gate = Literal["off", "warn", "block"]


class ReportSpeaker(Protocol):
    def speak(self, voice: str, text: str, *, max_tokens: int) -> np.ndarray:
        """The voice's int16 PCM (24 kHz) for `text`."""
        ...


class WorkerSpeaker:
    """A worker's PCM (int16, 24 kHz) for a voice and text, on the production websocket path."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 300.0) -> None:
        self.url = url
        self._token = token
        self.timeout_s = timeout_s

    def speak(self, voice: str, text: str, *, max_tokens: int) -> np.ndarray:
        from lora_training.publish import say_on_worker

        speech = say_on_worker(self.url, voice, text, max_tokens=max_tokens, token=self._token,
                               timeout_s=self.timeout_s, what="report worker",
                               refused=f"the worker refused voice '{voice}'")
        return np.frombuffer(speech.pcm, dtype="<i2").copy()


def words(text: str) -> list[str]:
    return _WORD.findall(normalize(text).lower())


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, words in the reference): Levenshtein over words."""
    ref, hyp = words(reference), words(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)], len(ref)


def wer(reference: str, heard: str) -> float:
    errors, total = word_errors(reference, heard)
    return errors / total if total else float(errors > 0)


def normalized_similarity(s: float, s_imp: float, s_self: float, *, min_gap: float = MIN_SELF_GAP) -> float | None:
    """(s - s_imp) / (s_self - s_imp); None when self and impostors are less than `min_gap` apart."""
    gap = s_self - s_imp
    return None if gap < min_gap else (s - s_imp) / gap


def centroid(vectors: Sequence[np.ndarray]) -> np.ndarray | None:
    if not vectors:
        return None
    mean = np.mean(np.stack(vectors).astype(np.float64), axis=0)
    norm = float(np.linalg.norm(mean))
    return mean / norm if norm > 0 else None


def is_stand_in(base_model: str | Path) -> bool:
    """The base model is gpu_worker.stand_in's (its stamp file sits beside the model folder)."""
    from gpu_worker.stand_in import StandInPaths

    model = Path(base_model)
    return model.is_dir() and StandInPaths(model.parent).stamp.is_file() and StandInPaths(model.parent).model == model


@dataclass(frozen=True)
class _Heard:
    voice: str
    sentence: int
    text: str
    heard: str | None
    wer: float | None
    seconds: float
    vector: np.ndarray | None
    error: str | None = None
    pcm: np.ndarray | None = None  # int16, 24 kHz: what the creator can play back


def _embed(encoder, audio: np.ndarray) -> np.ndarray | None:
    from lora_training.quality.speaker import NoSpeech

    try:
        return encoder.embed(audio, SAMPLE_RATE)
    except NoSpeech:
        return None


def _clip_vectors(encoder, clips: Sequence[Clip], max_s: float) -> list[np.ndarray]:
    out, used = [], 0.0
    for clip in clips:
        if used >= max_s:
            break
        vector = _embed(encoder, clip.audio)
        if vector is not None:
            out.append(vector)
            used += clip.duration_s
    return out


def _cos(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    from lora_training.quality.speaker import cosine

    return None if a is None or b is None else round(cosine(a, b), 4)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(float(np.mean(known)), 4) if known else None


def make_report(*, clone_voice: str, base_voices: Sequence[str], sentences: Sequence[str], max_tokens: int,
                speaker: ReportSpeaker, encoder, asr, held: Sequence[Clip], train: Sequence[Clip],
                holdout_reason: str | None, models: dict, stand_in: bool,
                thresholds: CheckThresholds | None = None, audio_dir: Path | None = None) -> dict:
    """Speak, embed, transcribe and score (see the module docstring). A sample a worker refuses is
    listed with its error and left out of the scores; nothing here invents a figure. With
    `audio_dir`, each sample's audio is written there as a wav (`samples[].audio` names it; the
    voice publishes them, gpu_worker.adapters.layout.REPORT_AUDIO, for the creator to play)."""
    thresholds = thresholds or CheckThresholds()
    started = time.perf_counter()
    samples: list[_Heard] = []
    for voice in (clone_voice, *base_voices):
        for i, text in enumerate(sentences):
            name = CLONE if voice == clone_voice else voice
            try:
                pcm = speaker.speak(voice, text, max_tokens=max_tokens)
            except TrainingError as err:
                samples.append(_Heard(name, i, text, None, None, 0.0, None, err.message))
                continue
            audio = pcm.astype(np.float32) / 32768.0 if pcm.dtype == np.int16 else pcm.astype(np.float32)
            heard = asr.transcribe(audio).text if audio.size else ""  # whisper reads float in [-1, 1]
            samples.append(_Heard(name, i, text, heard, round(wer(text, heard), 4),
                                  round(audio.size / SAMPLE_RATE, 3), _embed(encoder, audio) if audio.size else None,
                                  pcm=_pcm16(pcm, audio) if audio.size else None))
    files = _write_audio(samples, audio_dir) if audio_dir is not None else [None] * len(samples)

    if held:
        reference_kind, reference = "held_out", centroid(_clip_vectors(encoder, held, REFERENCE_MAX_S))
        s_self = _cos(reference, centroid(_clip_vectors(encoder, train, REFERENCE_MAX_S)))
    else:  # the clone was trained on these: its similarity to them is optimistic
        reference_kind = "training_clips"
        vectors = _clip_vectors(encoder, train, REFERENCE_MAX_S)
        reference = centroid(vectors)
        s_self = _cos(centroid(vectors[0::2]), centroid(vectors[1::2])) if len(vectors) >= 2 else None

    def voice_vector(name: str) -> np.ndarray | None:
        return centroid([h.vector for h in samples if h.voice == name and h.vector is not None])

    s = _cos(voice_vector(CLONE), reference)
    per_base = {v: _cos(voice_vector(v), reference) for v in base_voices}
    s_imp = _mean(list(per_base.values()))
    normalized = None
    if s is not None and s_imp is not None and s_self is not None:
        value = normalized_similarity(s, s_imp, s_self)
        normalized = None if value is None else round(value, 4)
    clone_wer = _mean([h.wer for h in samples if h.voice == CLONE])
    base_wer = {v: _mean([h.wer for h in samples if h.voice == v]) for v in base_voices}
    report = {
        "version": REPORT_VERSION,
        "reference": {"kind": reference_kind, "clips": len(held) if held else len(train),
                      "seconds": round(sum(c.duration_s for c in (held or train)), 2),
                      "note": holdout_reason and (holdout_reason + "; similarity is scored against the training "
                                                  "clips (the clone learnt from them: optimistic), self as one half "
                                                  "of them against the other")},
        "similarity": {"clone": s, "base_voices": s_imp, "self": s_self, "normalized": normalized,
                       "per_base_voice": per_base},
        "wer": {"clone": clone_wer, "base_voices": _mean(list(base_wer.values())), "per_base_voice": base_wer},
        "mos": None, "mos_note": MOS_NOTE,
        "sentences": list(sentences), "max_tokens": max_tokens,
        "samples": [{"voice": h.voice, "sentence": h.sentence, "heard": h.heard, "similarity": _cos(h.vector, reference),
                     "wer": h.wer, "seconds": h.seconds, "audio": file, **({"error": h.error} if h.error else {})}
                    for h, file in zip(samples, files)],
        "models": models,
        "thresholds_version": thresholds.version,
        "thresholds": {"warn_similarity_normalized": thresholds.warn_similarity_normalized,
                       "warn_wer_over_base": thresholds.warn_wer_over_base},
        "stand_in": stand_in, "note": STAND_IN_NOTE if stand_in else None,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    return report


def _pcm16(pcm: np.ndarray, audio: np.ndarray) -> np.ndarray:
    """A sample's int16 samples: the worker's own, else its float audio scaled."""
    return pcm.astype("<i2") if pcm.dtype == np.int16 else (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")


def _write_audio(samples: Sequence[_Heard], folder: Path) -> list[str | None]:
    """Each sample's audio as `NN.wav` in `folder`, as many as `report_audio_kept` lets the publish
    keep; their names, None where none was written."""
    from gpu_worker.adapters.layout import report_audio_kept
    from gpu_worker.wav import write_wav

    folder.mkdir(parents=True, exist_ok=True)
    names: list[str | None] = []
    written = 0
    for h in samples:
        data = h.pcm.tobytes() if h.pcm is not None else b""
        if not data or not report_audio_kept(written, len(data) + WAV_HEADER_BYTES):
            names.append(None)
            continue
        name = f"{written:02d}.wav"
        write_wav(folder / name, data, SAMPLE_RATE)
        names.append(name)
        written += 1
    return names


def report_findings(report: dict, thresholds: CheckThresholds | None = None) -> list[Finding]:
    """The report's failed thresholds as findings, in the creator's words."""
    thresholds = thresholds or CheckThresholds()
    out: list[Finding] = []
    normalized = report["similarity"]["normalized"]
    if normalized is not None and normalized < thresholds.warn_similarity_normalized:
        out.append(Finding("warn", "report_similarity",
                           f"the clone does not sound enough like you yet: on a scale from the platform's voices (0) "
                           f"to your own recordings (1) it scores {normalized:.2f}, where "
                           f"{thresholds.warn_similarity_normalized:.2f} is expected; upload more recordings of your "
                           "voice alone (about 10 minutes, one microphone, a quiet room) and clone again",
                           value=normalized, limit=thresholds.warn_similarity_normalized))
    clone, base = report["wer"]["clone"], report["wer"]["base_voices"]
    if clone is not None and base is not None and clone - base > thresholds.warn_wer_over_base:
        out.append(Finding("warn", "report_intelligibility",
                           f"the clone is harder to understand than the platform's voices: speech recognition got "
                           f"{clone:.0%} of its words wrong where the platform's voices score {base:.0%}; check that "
                           "the transcripts say exactly what is spoken (or leave them out), upload clearer recordings "
                           "and clone again", value=clone - base, limit=thresholds.warn_wer_over_base))
    return out


def gate(report: dict | None, policy: Gate, thresholds: CheckThresholds | None = None) -> list[Finding]:
    """What the tenant's report_gate makes of the report: the warn findings to add to the voice's
    checks ("warn"; "block" on the stand-in), or a CloneQualityError ("block"). Also records in the
    report which gate was applied."""
    if report is None or policy == "off":
        return []
    found = report_findings(report, thresholds)
    applied: Gate = "warn" if policy == "block" and report.get("stand_in") else policy
    report["gate"] = {"policy": policy, "applied": applied, "failed": [f.code for f in found],
                      **({"note": "block acts as warn on the stand-in base model"} if applied != policy else {})}
    if applied == "block" and found:
        raise CloneQualityError(block_message(found), report=report)
    return found


def block_message(found: Sequence[Finding]) -> str:
    """One short reason (the API shows at most 400 characters): what scored low, then what to do."""
    low = []
    for f in found:
        if f.code == "report_similarity":
            low.append(f"its likeness to your voice scored {f.value:.2f} where {f.limit:.2f} is needed")
        else:
            low.append(f"speech recognition got {f.value:.0%} more of its words wrong than the platform's voices "
                       f"({f.limit:.0%} allowed)")
    return ("the clone failed its quality report and was not published: " + "; ".join(low) + ". Upload about "
            "10 minutes of your voice alone, clearly spoken in a quiet room (transcripts, if any, saying exactly "
            "what is spoken), and clone again")
