"""End to end on real components: espeak-ng speech padded with 600 ms of silence -> clips trimmed by
silence_trim -> SNAC frames -> a LoRA trained on the stand-in Orpheus -> validated, sampled by the real
vLLM worker, published atomically, and served by that worker."""

import asyncio
import json

import numpy as np
from typer.testing import CliRunner

from gpu_worker.adapters import validate_adapter
from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.preprocess import preprocess
from lora_training.publish import STAGING_TENANT
from lora_training.text import normalize, sentences
from silence_trim.detect import measure
from tests.lora_training.conftest import HEAD_PAD_MS, LONG_SENTENCES, SINGLE_FILES


def test_clips_are_cut_per_sentence_and_trimmed_to_the_margin(uploads, train_settings):
    data = train_settings.data
    clip_set = preprocess(uploads.audio, uploads.manifest, data, asr=None, cache_dir=train_settings.work_dir / "cache")
    clips = clip_set.clips
    singles = [c for c in clips if c.source.startswith("single-")]
    from_long = [c for c in clips if c.source == uploads.long_file.name]
    assert len(singles) == SINGLE_FILES
    assert LONG_SENTENCES // 2 <= len(from_long) <= LONG_SENTENCES  # sentences under clip_min_s are joined
    assert " ".join(c.text for c in from_long) == " ".join(sentences(normalize(uploads.texts[uploads.long_file.name])))
    for clip in clips:
        assert clip.head_silence_after_ms <= data.trim_margin_ms, clip.clip_id
        assert measure(clip.audio, SAMPLE_RATE).leading_silence_ms <= data.trim_margin_ms  # measured again, from scratch
        assert data.clip_drop_s <= clip.duration_s <= data.clip_max_s
    assert min(c.head_silence_before_ms for c in singles) >= HEAD_PAD_MS
    assert np.median([c.head_silence_before_ms for c in clips]) >= 250  # the long take is cut mid-pause
    assert clip_set.report["clips"] == len(clips) and clip_set.speech_s >= data.min_speech_s


def test_train_cli_publishes_a_voice_that_the_worker_serves(uploads, train_settings, worker, adapter_store, monkeypatch):
    from voicering.cli import app

    for key, value in {"PARAMS__SAVE_STEPS": "2", "PARAMS__BATCH_SIZE": "1", "PARAMS__GRAD_ACCUM": "1",
                       "PARAMS__LOGGING_STEPS": "1", "PARAMS__EVAL_MAX_CLIPS": "2", "DEVICE": "cpu",
                       "SAMPLE_MAX_TOKENS": str(7 * 6 + 1)}.items():  # a 6-frame validation sample
        monkeypatch.setenv(f"VOICERING_TRAIN_{key}", value)
    args = ["train", "alice", "--tenant", "acme", "--audio", str(uploads.folder), "--transcripts", str(uploads.manifest),
            "--model", str(train_settings.base_model), "--codec", str(train_settings.codec), "--store", str(adapter_store),
            "--work-dir", str(train_settings.work_dir), "--worker-url", worker.url, "--steps", "4", "--rank", "8",
            "--min-speech-s", "30", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = json.loads(result.stdout)
    assert meta["voice"] == "acme/alice" and meta["prompt_name"] == "alice" and meta["steps"] == 4
    assert meta["rank"] == 8 and meta["base_model"] == train_settings.base_model
    assert meta["clip_count"] >= SINGLE_FILES + LONG_SENTENCES // 2 and meta["data_minutes"] >= 0.5
    assert meta["final_train_loss"] > 0 and meta["final_eval_loss"] > 0
    assert meta["clip_head_silence_after_ms"]["max"] <= 20.0 <= HEAD_PAD_MS <= meta["clip_head_silence_before_ms"]["max"]
    sample = meta["sample"]
    assert sample["frames"] > 0 and sample["audio_s"] > 0 and sample["head_silence_ms"] >= 0

    voice_dir = adapter_store / "acme" / "alice"
    info = validate_adapter(voice_dir, voice_id="acme/alice", max_rank=32)
    assert info.rank == 8 and info.prompt_name == "alice"
    config = json.loads((voice_dir / "adapter_config.json").read_text())
    assert config["use_rslora"] and not config.get("modules_to_save") and not config.get("use_dora")
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert json.loads((voice_dir / "voicering.json").read_text())["sample"] == sample
    assert not [p for p in (adapter_store / STAGING_TENANT).iterdir()]  # nothing left under validation

    async def say() -> bytes:
        from gpu_worker.client.connection import WorkerClient
        from gpu_worker.protocol import ContextOptions

        async with await WorkerClient.connect(worker.url) as client:
            speech = await client.say("acme/alice", "Hello from a cloned voice.", options=ContextOptions(max_tokens=71, seed=1))
        return speech.pcm

    assert len(asyncio.run(say())) > 0

    again = CliRunner().invoke(app, args)  # same local job: already published, nothing trained again
    assert again.exit_code == 0 and json.loads(again.stdout)["trained_at"] == meta["trained_at"]
    other = CliRunner().invoke(app, [*args, "--job-id", "another-job"])
    assert other.exit_code == 1 and "voice 'acme/alice' already exists" in other.output
