"""Voices -> LoRA adapters: where they live, whether they are safe to load, and their stable ids.

A voice id is ``name`` or ``tenant/name``; its adapter is the directory ``<store>/<voice id>/``
holding ``adapter_config.json`` and ``adapter_model.safetensors`` (and optionally
``voicering.json`` metadata). Validation runs before vLLM ever sees the adapter, so a bad adapter
is a clear error for that voice only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpu_worker.engine import Voice
from gpu_worker.errors import AdapterError, UnknownVoice

VOICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,127})?$")
ALLOWED_TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
METADATA = "voicering.json"


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    voice_id: str
    path: Path
    rank: int
    prompt_name: str


def validate_adapter(path: Path, *, voice_id: str, max_rank: int) -> AdapterInfo:
    """Check an adapter directory the way vLLM would fail on it, but with a message for the voice."""
    config_path = path / CONFIG
    if not config_path.is_file():
        raise AdapterError(f"voice '{voice_id}': adapter has no {CONFIG}")
    if not (path / WEIGHTS).is_file():
        pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found {', '.join(pickled)}: pickled weights are never loaded)" if pickled else ""
        raise AdapterError(f"voice '{voice_id}': adapter has no {WEIGHTS}{hint}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"voice '{voice_id}': {CONFIG} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"voice '{voice_id}': not a LoRA adapter config")
    if config.get("modules_to_save"):
        raise AdapterError(f"voice '{voice_id}': modules_to_save {config['modules_to_save']} is not servable (vLLM rejects it)")
    if config.get("use_dora"):
        raise AdapterError(f"voice '{voice_id}': DoRA adapters are not servable; retrain as plain LoRA")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"voice '{voice_id}': adapter rank {rank!r} is invalid")
    if rank > max_rank:
        raise AdapterError(f"voice '{voice_id}': adapter rank {rank} exceeds this worker's max_lora_rank {max_rank}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str) or not set(targets) <= ALLOWED_TARGETS:
        raise AdapterError(f"voice '{voice_id}': target modules {targets!r} outside attention/MLP projections")
    prompt_name = voice_id.rsplit("/", 1)[-1]
    meta_path = path / METADATA
    if meta_path.is_file():
        try:
            prompt_name = json.loads(meta_path.read_text()).get("prompt_name") or prompt_name
        except json.JSONDecodeError:
            raise AdapterError(f"voice '{voice_id}': {METADATA} is not valid JSON") from None
    return AdapterInfo(voice_id, path, rank, prompt_name)


@dataclass(slots=True)
class AdapterStore:
    """Resolves voice ids against a directory tree; integer LoRA ids are stable within a process."""

    root: Path
    max_rank: int = 32
    base_voices: tuple[str, ...] = ()
    _ids: dict[str, int] = field(default_factory=dict)

    def resolve(self, voice_id: str) -> Voice:
        if voice_id in self.base_voices:
            return Voice(voice_id, voice_id)
        if not VOICE_ID.match(voice_id):
            raise UnknownVoice(f"voice '{voice_id}' is not a valid voice id (letters, digits, '._-', optional 'tenant/')")
        path = self.root / voice_id
        if not path.is_dir():
            raise UnknownVoice(f"unknown voice '{voice_id}': no adapter published for it on this worker")
        info = validate_adapter(path, voice_id=voice_id, max_rank=self.max_rank)
        lora_id = self._ids.setdefault(voice_id, len(self._ids) + 1)
        return Voice(voice_id, info.prompt_name, str(path), lora_id)

    def voices(self) -> list[str]:
        found = sorted(
            str(cfg.parent.relative_to(self.root)) for cfg in self.root.glob(f"**/{CONFIG}") if cfg.parent != self.root
        ) if self.root.is_dir() else []
        return [*self.base_voices, *found]
