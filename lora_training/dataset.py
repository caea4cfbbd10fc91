"""Clips -> SNAC frames -> Orpheus training sequences, with the encoded frames cached.

Sequence layout (gpu_worker.orpheus.training_ids):
``[128259] + tok("{voice}: {text}") + [128009, 128260, 128261, 128257] + audio ids + [128258, 128262]``.

Loss is taken on the audio part only (labels -100 over the prompt, the audio ids and the two
closing ids trained): at inference the text is given, so predicting it spends capacity on
nothing a voice needs, while the closing 128258 must be learnt or the clone never stops.
(The Orpheus reference fine-tune trains on the whole sequence; with ~10 minutes of data the
audio-only loss is the one that measures the voice, and the one we report.)

Frame de-duplication (off by default) follows the public Orpheus data recipe: a frame whose
level-0 code equals the previous kept frame's is dropped. It shortens sequences a little and
changes timing a little; we keep it optional because the effect is unmeasured here.

Encoded frames are cached per clip content and codec, so a retried job never encodes again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_worker.orpheus import SAMPLE_RATE, Frame, TextTokenizer, training_ids
from lora_training.clips import Clip

IGNORE = -100

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Example:
    clip_id: str
    input_ids: tuple[int, ...]
    audio_start: int  # index of the first audio id; labels before it are IGNORE

    def labels(self) -> list[int]:
        return [IGNORE] * self.audio_start + list(self.input_ids[self.audio_start:])


def dedup_frames(frames: Sequence[Frame]) -> list[Frame]:
    """Drop each frame whose level-0 code repeats the previous kept frame's (the field's recipe)."""
    kept: list[Frame] = []
    for frame in frames:
        if not kept or frame.c0 != kept[-1].c0:
            kept.append(frame)
    return kept


def clip_digest(clip: Clip) -> str:
    return hashlib.sha256(clip.audio.tobytes()).hexdigest()[:24]


def batches(clips: Sequence[Clip], batch_s: float) -> list[list[Clip]]:
    """Clips sorted by length, grouped so each batch's padded audio stays under batch_s seconds."""
    budget = batch_s * SAMPLE_RATE
    ordered = sorted(clips, key=lambda c: c.audio.size)
    out: list[list[Clip]] = []
    for clip in ordered:
        if out and clip.audio.size * (len(out[-1]) + 1) <= budget:
            out[-1].append(clip)
        else:
            out.append([clip])
    return out


class FrameCache:
    """Encoded frames per (codec, clip audio), one JSON file per codec under `root`."""

    def __init__(self, root: Path | None, codec_id: str) -> None:
        self.path = root / f"frames-{hashlib.sha256(codec_id.encode()).hexdigest()[:12]}.json" if root else None
        self._frames: dict[str, list[list[int]]] = {}
        if self.path is not None and self.path.is_file():
            try:
                self._frames = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                self._frames = {}

    def get(self, clip: Clip) -> list[Frame] | None:
        codes = self._frames.get(clip_digest(clip))
        return None if codes is None else [Frame.from_slot_codes(c) for c in codes]

    def put(self, clip: Clip, frames: Sequence[Frame]) -> None:
        self._frames[clip_digest(clip)] = [list(f.slot_codes()) for f in frames]

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps(self._frames))
        os.replace(tmp, self.path)


def encode(codec, clips: Sequence[Clip], cache: FrameCache, *, batch_s: float,
           progress: Progress | None = None, check: Callable[[], None] | None = None) -> dict[str, list[Frame]]:
    """SNAC frames of every clip (clip_id -> frames), encoding only what the cache lacks.

    `check` is called before each batch (the job's stop: what it raises ends the work there; the
    batches encoded so far stay in the cache)."""
    out: dict[str, list[Frame]] = {}
    todo = []
    for clip in clips:
        found = cache.get(clip)
        if found is None:
            todo.append(clip)
        else:
            out[clip.clip_id] = found
    done_s, total_s = 0.0, sum(c.duration_s for c in todo)
    for batch in batches(todo, batch_s):
        if check is not None:
            check()
        for clip, frames in zip(batch, codec.encode_batch([c.audio for c in batch]), strict=True):
            cache.put(clip, frames)
            out[clip.clip_id] = frames
        done_s += sum(c.duration_s for c in batch)
        if progress is not None:
            progress(done_s / total_s, f"encoded {done_s:.0f} of {total_s:.0f} s")
        cache.save()  # a crash mid-way keeps what was encoded
    return out


def build_examples(tokenizer: TextTokenizer, prompt_name: str, clips: Sequence[Clip],
                   frames: dict[str, list[Frame]], *, dedup: bool) -> list[Example]:
    examples = []
    for clip in clips:
        clip_frames = dedup_frames(frames[clip.clip_id]) if dedup else frames[clip.clip_id]
        ids, audio_start = training_ids(tokenizer, prompt_name, clip.text, clip_frames)
        examples.append(Example(clip.clip_id, tuple(ids), audio_start))
    return examples


def split(examples: Sequence[Example], *, eval_fraction: float, eval_max: int, seed: int) -> tuple[list[Example], list[Example]]:
    """Held-out split, fixed by the seed; at least one clip held out once there are 4 or more."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held = 0 if len(examples) < 4 or eval_fraction <= 0 else min(eval_max, max(1, round(eval_fraction * len(examples))))
    held_ids = set(order[:held])
    train = [e for i, e in enumerate(examples) if i not in held_ids]
    evaluation = [e for i, e in enumerate(examples) if i in held_ids]
    return train, evaluation


@dataclass(frozen=True)
class HoldOut:
    """Clips kept out of training and of the eval split, for the clone report. `held` is empty when
    the upload cannot spare them (`reason` says why: the report then scores what it can)."""

    train: list[Clip]
    held: list[Clip]
    reason: str | None = None

    @property
    def held_s(self) -> float:
        return sum(c.duration_s for c in self.held)


def hold_out(clips: Sequence[Clip], *, fraction: float, min_s: float, min_clips: int, max_share: float,
             seed: int) -> HoldOut:
    """About `fraction` of the speech (at least `min_s` and `min_clips`), clips drawn in an order
    fixed by `seed`, never more than `max_share` of it: with less data than that allows, nothing is
    held out (training keeps every clip) and `reason` says so."""
    total = sum(c.duration_s for c in clips)
    target = max(fraction * total, min_s)
    cap = max_share * total
    if fraction <= 0:
        return HoldOut(list(clips), [], "no hold-out: report_holdout_fraction is 0")
    if target > cap or len(clips) < 2 * min_clips:
        return HoldOut(list(clips), [], f"no hold-out: {total:.0f} s of speech in {len(clips)} clips cannot spare "
                       f"{target:.0f} s ({min_clips} clips or more) while training keeps {1 - max_share:.0%} of it")
    order = list(range(len(clips)))
    random.Random(seed).shuffle(order)
    held_ids: set[int] = set()
    held_s = 0.0
    for i in order:
        if held_s >= target and len(held_ids) >= min_clips:
            break
        if held_s + clips[i].duration_s <= cap:
            held_ids.add(i)
            held_s += clips[i].duration_s
    if len(held_ids) < min_clips:
        return HoldOut(list(clips), [], f"no hold-out: the clips are too long to hold out {min_clips} of them "
                       f"within {max_share:.0%} of the speech")
    return HoldOut([c for i, c in enumerate(clips) if i not in held_ids],
                   [c for i, c in enumerate(clips) if i in held_ids])


def fingerprint(examples: Sequence[Example]) -> str:
    """Identity of a training set (checkpoints are only resumed on the very same data)."""
    h = hashlib.sha256()
    for e in examples:
        h.update(e.clip_id.encode() + b"\0" + str(e.audio_start).encode() + b"\0")
        h.update(",".join(map(str, e.input_ids)).encode())
    return h.hexdigest()[:16]
