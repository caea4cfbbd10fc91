"""Speech recognition for uploads without transcripts: a small seam with one real backend.

`AsrBackend.transcribe(audio_24k)` returns the text of one clip. The backend shipped here is
faster-whisper (CTranslate2) loaded from a *local* model directory (settings.asr_model); it is
an optional dependency (`pip install faster-whisper`) and no model is ever downloaded by the
trainer. With no model configured, `make_asr` returns None and the pipeline asks for transcripts.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.errors import ConfigError
from lora_training.settings import TrainSettings

WHISPER_RATE = 16_000


class AsrBackend(Protocol):
    name: str

    def transcribe(self, audio: np.ndarray) -> str:
        """24 kHz mono float32 clip -> its text."""
        ...


class FasterWhisperAsr:
    """faster-whisper on a local model directory (CPU int8, or CUDA float16)."""

    name = "faster-whisper"

    def __init__(self, model_path: str, *, device: str, language: str | None) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise ConfigError(
                "ASR is configured (asr_model) but faster-whisper is not installed: `pip install faster-whisper`, "
                "or give transcripts instead"
            ) from None
        compute_type = "float16" if device == "cuda" else "int8"
        try:
            self._model = WhisperModel(model_path, device=device, compute_type=compute_type, local_files_only=True)
        except Exception as err:  # CTranslate2/huggingface_hub raise several types for a bad model dir
            raise ConfigError(f"cannot load the faster-whisper model at {model_path}: {err}") from None
        self._language = language

    def transcribe(self, audio: np.ndarray) -> str:
        import soxr

        x = soxr.resample(audio, SAMPLE_RATE, WHISPER_RATE, quality="HQ").astype(np.float32)  # [n * 2/3]
        segments, _ = self._model.transcribe(x, language=self._language, beam_size=5, vad_filter=False)
        return " ".join(segment.text.strip() for segment in segments).strip()


def make_asr(settings: TrainSettings) -> AsrBackend | None:
    """The configured backend, or None when no ASR model is set."""
    if settings.asr_model is None:
        return None
    if not settings.asr_model.exists():
        raise ConfigError(f"ASR model directory {settings.asr_model} does not exist (asr_model)")
    if settings.asr_backend == "faster-whisper":
        return FasterWhisperAsr(str(settings.asr_model), device=settings.resolved_device(), language=settings.asr_language)
    raise ConfigError(f"unknown ASR backend {settings.asr_backend!r}")
