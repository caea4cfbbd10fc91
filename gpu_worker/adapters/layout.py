"""What an adapter directory and an adapter store look like on disk, and the modules a voice may adapt.

A voice's adapter is ``<store>/<voice id>/`` holding `CONFIG` and `WEIGHTS` (and optionally
`METADATA`, and the clone report's samples under `REPORT_AUDIO`). Names starting with '.' are never
voice ids, so a store keeps its in-flight copies under `STAGING_DIR`; lora_training stages adapters
under validation under the `STAGING_TENANT` tenant, which workers resolve but never list.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["ALLOWED_TARGETS", "CONFIG", "LORA_TARGET_MODULES", "METADATA", "PICKLED_SUFFIXES", "REPORT_AUDIO",
           "REPORT_AUDIO_FILE", "REPORT_AUDIO_MAX_BYTES", "REPORT_AUDIO_MAX_FILES", "SERVED_FILES", "STAGING_DIR",
           "STAGING_TENANT", "WEIGHTS", "report_audio_kept"]

WEIGHTS: Final = "adapter_model.safetensors"
CONFIG: Final = "adapter_config.json"
METADATA: Final = "voicering.json"
SERVED_FILES: Final = (CONFIG, WEIGHTS, METADATA)  # all a worker ever copies or loads
# The clone report's samples (lora_training.report), published with the voice for the creator to
# hear (the gateway serves them); no worker copies or loads them.
REPORT_AUDIO: Final = "report"  # a folder beside the served files
REPORT_AUDIO_FILE: Final = re.compile(r"[0-9]{2}\.wav")  # 00.wav, 01.wav, ...: the only names kept
REPORT_AUDIO_MAX_FILES: Final = 64
REPORT_AUDIO_MAX_BYTES: Final = 4 << 20  # per file: ~87 s of 24 kHz PCM16, past any report sample
PICKLED_SUFFIXES: Final = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
STAGING_DIR: Final = ".staging"  # inside a store or cache: same filesystem, never a valid voice id
STAGING_TENANT: Final = "voicering-staging"  # lora_training's adapters under validation

# The projections vLLM serves LoRA on for a Llama model: the trainer targets exactly these and the
# worker refuses anything else. The single definition; stand-ins and lora_training import it.
LORA_TARGET_MODULES: Final = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALLOWED_TARGETS: Final = frozenset(LORA_TARGET_MODULES)


def report_audio_kept(kept: int, size: int) -> bool:
    """Whether a report sample of ``size`` bytes is kept after ``kept`` others: the one bound that
    the report's writer and the publish both apply."""
    return kept < REPORT_AUDIO_MAX_FILES and size <= REPORT_AUDIO_MAX_BYTES
