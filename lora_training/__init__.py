"""lora_training: from a creator's audio to a validated voice LoRA in the adapter store.

Public names resolve lazily (importing the package imports nothing heavy): see `__all__`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainSettings": "settings", "DataParams": "settings", "TrainParams": "settings",
    "TrainingError": "errors", "InputError": "errors", "AudioError": "errors", "SpeechAmountError": "errors",
    "TranscriptError": "errors", "VoiceExistsError": "errors", "ConfigError": "errors", "JobStopped": "errors",
    "LeaseLost": "errors", "ValidationError": "errors", "InfrastructureError": "errors",
    "JobSpec": "pipeline", "JobState": "pipeline", "Reporter": "pipeline", "run_job": "pipeline",
    "JobQueue": "jobs", "JobStatus": "jobs", "TrainWorker": "consumer",
    "preprocess": "preprocess", "ClipSet": "clips", "Clip": "clips", "train_lora": "trainer", "TrainResult": "trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lora_training' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lora_training.{module}"), name)
