"""Training pipeline bench: preprocessing and encode speed, train steps/s, head silence before/after trimming.

Data: real speech made with espeak-ng, 68 known sentences (Harvard lists 1-8 excerpts), all spoken
by one espeak voice (en-us: a clone's uploads are one speaker, and the job's second-speaker check
blocks an upload that is half another voice), resampled to 24 kHz by sox and padded with 600 ms of
digital silence before it: 68 uploads, ~3.3 minutes. Models: the stand-in Orpheus (tiny random
Llama, full Orpheus vocabulary) and random SNAC weights; CPU. Figures:

- preprocess_s_per_audio_min: decode + checks + segmentation + transcript alignment + trimming,
  wall seconds per minute of uploaded audio;
- encode_x_realtime: seconds of clip audio SNAC-encoded per wall second (batched, first ~60 s);
- train_steps_per_s: optimizer steps per second on the stand-in (batch 1, rank 32, fp32, CPU);
- head_silence_{before,after}_ms_{p50,p90,min,max}: ground truth, not a detector. The uploads
  are clean (digital silence around espeak-ng speech, sox without dither), so speech starts at
  the first sample reaching -60 dBFS of the upload (the 600 ms pad + espeak-ng's own lead-in).
  Each upload is one sentence and becomes one clip, located in its upload by exact sample match
  (preprocessing neither resamples nor scales 24 kHz uploads; only the faded ends differ), so its
  head silence is that onset minus where the clip starts: negative would mean trimming cut speech. Targets: after p90
  <= 40 ms, after min >= 0 ms (margin 20 ms);
- head_silence_after_vad_ms_*: the same clips measured by silence_trim's silero VAD detector (the
  pipeline trims with its energy detector), as a cross-check; head_silence_*_trim_detector_ms_*:
  what the pipeline itself recorded (the trimming detector measuring its own result: circular,
  kept for comparison only).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.speech import SAMPLE_RATE, VOICES, first_loud_sample, locate, pad_silence, require, synthesize
from lora_training.espeak import HARVARD_SENTENCES

HEAD_PAD_S = 0.6
ENCODE_SECONDS = 60.0
TRAIN_STEPS = 10
TARGET_AFTER_P90_MS = 40.0
TARGET_AFTER_MIN_MS = 0.0  # below: speech was cut

VOICE = VOICES[0]  # one speaker: the creator

# Harvard sentences (IEEE 1969, lists 5-8 excerpts), public domain; with lists 1-4 below.
_LISTS_5_TO_8 = (
    "A king ruled the state in the early days.", "The ship was torn apart on the sharp reef.",
    "Sickness kept him home the third week.", "The wide road shimmered in the hot sun.",
    "The lazy cow lay in the cool grass.", "Lift the square stone over the fence.",
    "The rope will bind the seven books at once.", "Hop over the fence and plunge in.",
    "The friendly gang left the drug store.", "Mesh wire keeps chicks inside.",
    "The frosty air passed through the coat.", "The crooked maze failed to fool the mouse.",
    "Adding fast leads to wrong sums.", "The show was a flop from the very start.",
    "A saw is a tool used for making boards.", "The wagon moved on well oiled wheels.",
    "March the soldiers past the next hill.", "A cup of sugar makes sweet fudge.",
    "Place a rosebush near the porch steps.", "Both lost their lives in the raging storm.",
    "We talked of the side show in the circus.", "Use a pencil to write the first draft.",
    "He ran half way to the hardware store.", "The clock struck to mark the third period.",
    "A small creek cut across the field.", "Cars and busses stalled in snow drifts.",
    "The set of china hit the floor with a crash.", "This is a grand season for hikes on the road.",
    "The dune rose from the edge of the water.", "Those words were the cue for the actor to leave.",
    "A yacht slid around the point into the bay.", "The two met while playing on the sand.",
    "The ink stain dried on the finished page.", "The walled town was seized without a fight.",
    "The lease ran out in sixteen weeks.", "A tame squirrel makes a nice pet.",
)
SENTENCES = _LISTS_5_TO_8 + HARVARD_SENTENCES


def _espeak_dataset(folder: Path, sentences: tuple[str, ...]) -> tuple[list[Path], Path]:
    """Padded single-sentence uploads (68 in a full run), one speaker, and their JSON manifest."""
    import soundfile as sf

    texts: dict[str, str] = {}
    paths = []
    for i, text in enumerate(sentences):
        path = synthesize(text, VOICE, folder / f"{i:02d}-{VOICE.replace('+', '-')}.wav")
        audio, rate = sf.read(str(path), dtype="int16")
        sf.write(str(path), pad_silence(audio, rate, HEAD_PAD_S * 1000), rate, subtype="PCM_16")
        texts[path.name] = text
        paths.append(path)
    manifest = folder / "transcripts.json"
    manifest.write_text(json.dumps(texts))
    return paths, manifest


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1)


def _spread(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_p50": _pct(values, 50), f"{name}_p90": _pct(values, 90),
            f"{name}_min": round(min(values), 1), f"{name}_max": round(max(values), 1)}


def _true_head_silence(clips, uploads: list[Path]) -> tuple[list[float], list[float], int]:
    """Ground-truth head silence (ms) of each upload and of its clip, for the uploads that became
    exactly one clip (one sentence each here); also how many clips were not measured (their upload
    made several clips, or the clip is not an exact cut of it)."""
    import soundfile as sf

    per_source: dict[str, list] = {}
    for clip in clips:
        per_source.setdefault(clip.source, []).append(clip)
    before, after, unmeasured = [], [], 0
    for path in uploads:
        found = per_source.get(path.name, [])
        upload = sf.read(str(path), dtype="float32")[0]
        onset = first_loud_sample(upload)
        start = locate(found[0].audio, upload) if len(found) == 1 else None
        if start is None or onset is None:
            unmeasured += len(found)
            continue
        before.append(1000.0 * onset / SAMPLE_RATE)
        after.append(1000.0 * (onset - start) / SAMPLE_RATE)
    return before, after, unmeasured


def run(sentences: int = len(SENTENCES), encode_seconds: float = ENCODE_SECONDS, steps: int = TRAIN_STEPS) -> dict:
    """``sentences``/``encode_seconds``/``steps``: the smoke run's sizes (`--quick`); the published
    figures are the defaults'."""
    import torch
    from transformers import AutoTokenizer

    from gpu_worker.codec import SnacCodec
    from bench.weights import bench_stand_in
    from lora_training.dataset import FrameCache, build_examples, encode, split
    from lora_training.preprocess import preprocess
    from lora_training.settings import DataParams, TrainParams
    from lora_training.trainer import train_lora
    from silence_trim import SileroVad, measure

    for tool in ("espeak-ng", "sox"):
        require(tool)
    stand_in = bench_stand_in()  # the published SNAC shape: encode_x_realtime is what a real encoder costs
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        root = Path(tmp)
        (root / "uploads").mkdir()
        audio, manifest = _espeak_dataset(root / "uploads", SENTENCES[:sentences])
        data = DataParams(min_speech_s=min(60.0, sentences))  # ~2 s of speech a sentence

        started = time.perf_counter()
        clip_set = preprocess(audio, manifest, data, asr=None)
        preprocess_s = time.perf_counter() - started
        clips = clip_set.clips
        recorded_before = [c.head_silence_before_ms for c in clips]
        recorded_after = [c.head_silence_after_ms for c in clips]
        before, after, unmeasured = _true_head_silence(clips, audio)
        vad = SileroVad()
        after_vad = [measure(c.audio, SAMPLE_RATE, "vad", vad=vad).leading_silence_ms for c in clips]

        codec = SnacCodec.load(str(stand_in.codec), device="cpu")
        codec.encode(np.zeros(2048, np.float32))  # warm-up
        subset, total = [], 0.0
        for clip in clips:
            if total >= encode_seconds:
                break
            subset.append(clip)
            total += clip.duration_s
        started = time.perf_counter()
        frames = encode(codec, subset, FrameCache(None, "bench"), batch_s=60.0)
        encode_s = time.perf_counter() - started

        tokenizer = AutoTokenizer.from_pretrained(stand_in.model)
        examples = build_examples(tokenizer, "bench", subset, frames, dedup=False)
        train, held = split(examples, eval_fraction=0.0, eval_max=0, seed=0)
        params = TrainParams(max_steps=steps, save_steps=steps, batch_size=1, grad_accum=1,
                             logging_steps=1, eval_fraction=0.0)
        result = train_lora(str(stand_in.model), train, held, params, root / "run", device="cpu", console=False)

    return {
        "data": f"espeak-ng, {sentences} sentences, one voice ({VOICE}), {HEAD_PAD_S * 1000:.0f} ms head pad",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "uploads": len(audio),
        "audio_minutes": clip_set.report["audio_minutes"],
        "clips": len(clips),
        "preprocess_s": round(preprocess_s, 3),
        "preprocess_s_per_audio_min": round(preprocess_s / clip_set.report["audio_minutes"], 3),
        "encode_audio_s": round(total, 2),
        "encode_x_realtime": round(total / encode_s, 3),
        "train_steps": result.steps,
        "train_mean_tokens_per_step": round(float(np.mean([len(e.input_ids) for e in train])), 1),
        "train_rank": params.rank,
        "train_steps_per_s": result.steps_per_s,
        "head_silence_measure": "ground truth: first sample at -60 dBFS of the clean upload, clip located by exact match",
        **_spread("head_silence_before_ms", before),
        **_spread("head_silence_after_ms", after),
        "head_silence_clips_measured": len(after),
        "head_silence_clips_unmeasured": unmeasured,
        **_spread("head_silence_after_vad_ms", after_vad),
        **_spread("head_silence_before_trim_detector_ms", recorded_before),
        **_spread("head_silence_after_trim_detector_ms", recorded_after),
        "trim_detector": data.trim_detector,
        "trim_margin_ms": data.trim_margin_ms,
        "targets_met": {
            "head_silence_after_ms_p90": _pct(after, 90) <= TARGET_AFTER_P90_MS,
            "head_silence_after_ms_min": min(after) >= TARGET_AFTER_MIN_MS,
            "every_clip_measured": unmeasured == 0,
        },
    }
