"""Whether an adapter is safe to hand to vLLM: safetensors header, LoRA config, base model.

Every failure is an `AdapterError` (``bad_adapter``, not retryable) naming the voice and the fix,
never a stray IndexError/TypeError: a hostile or broken adapter is its own voice's problem only.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpu_worker.adapters.layout import ALLOWED_TARGETS, CONFIG, METADATA, PICKLED_SUFFIXES, WEIGHTS
from gpu_worker.errors import AdapterError
from hashring.records import shown_voice_id

__all__ = ["FOREIGN_INITS", "SAFETENSORS_DTYPES", "AdapterInfo", "adapter_error", "base_model_key",
           "read_safetensors_header", "same_base_model", "validate_adapter"]

SAFETENSORS_DTYPES: Final = frozenset({"F32", "F16", "BF16"})
# peft inits that rewrite base weights at load (vLLM refuses them); plain ones load as LoRA
FOREIGN_INITS: Final = frozenset({"pissa", "olora", "loftq", "corda"})
_TENSOR_NAME = re.compile(
    r"\Abase_model\.model\.model\.layers\.\d+\.(self_attn|mlp)\.(?P<module>[a-z_]+)\.lora_(?P<ab>[AB])\.weight\Z"
)
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    voice_id: str
    path: Path
    rank: int
    prompt_name: str
    base_model: str | None = None  # what the adapter says it was trained on


def adapter_error(voice_id: str, message: str) -> AdapterError:
    return AdapterError(f"voice {shown_voice_id(voice_id)}: {message}")


def base_model_key(name: str) -> str:
    """A comparable name for a base model given as a hub id, a local path or a hub cache snapshot.

    ``canopylabs/orpheus-3b-0.1-ft``, ``/models/orpheus-3b-0.1-ft`` and
    ``~/.cache/huggingface/hub/models--canopylabs--orpheus-3b-0.1-ft/snapshots/<sha>`` all map to
    ``orpheus-3b-0.1-ft``.
    """
    parts = [p for p in name.replace("\\", "/").rstrip("/").split("/") if p]
    for i, part in enumerate(parts):
        if part.startswith("models--"):
            return part.split("--")[-1].lower()
        if part == "snapshots" and i > 0 and parts[i - 1].startswith("models--"):
            return parts[i - 1].split("--")[-1].lower()
    return parts[-1].lower() if parts else ""


def same_base_model(declared: str, served: str) -> bool:
    if declared == served:
        return True
    declared_path, served_path = Path(declared).expanduser(), Path(served).expanduser()
    if declared_path.exists() and served_path.exists() and declared_path.resolve() == served_path.resolve():
        return True
    return base_model_key(declared) == base_model_key(served)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _well_formed(entry: object) -> bool:
    """A header entry with the types the checks below index into (a 0-d shape is well formed)."""
    if not isinstance(entry, dict):
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    return (isinstance(entry.get("dtype"), str)
            and isinstance(shape, list) and all(_is_count(d) for d in shape)
            and isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1])


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {dtype: str, shape: [int, ...], data_offsets: [int, int]}; raises ValueError
    when the file is not a whole safetensors file (bad header, a malformed entry, or fewer bytes than
    the header promises: a half-written file)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError("file is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, _MAX_HEADER):
            raise ValueError("safetensors header length is past the end of the file")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not an object")
    header.pop("__metadata__", None)
    end = 0
    for name, entry in header.items():
        if not _well_formed(entry):
            raise ValueError(f"tensor '{name}' has a malformed header entry")
        end = max(end, entry["data_offsets"][1])
    if 8 + length + end != size:
        raise ValueError(f"file has {size} bytes but its header describes {8 + length + end} (incomplete or padded)")
    return header


def validate_adapter(path: Path, *, voice_id: str, max_rank: int, base_model: str | None = None) -> AdapterInfo:
    """Check an adapter directory the way vLLM would fail on it, but with a message for the voice.

    ``base_model``: the model this worker serves; when given, the adapter's declared base (its
    voicering.json ``base_model``, else adapter_config ``base_model_name_or_path``) must match it.
    """
    path = Path(path)
    config_path = path / CONFIG
    if not config_path.is_file():
        raise adapter_error(voice_id, f"adapter has no {CONFIG}")
    pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLED_SUFFIXES)
    if pickled:
        raise adapter_error(voice_id, f"adapter holds pickled weights ({', '.join(pickled)}); only {WEIGHTS} is "
                                      "ever loaded: remove them and republish")
    if not (path / WEIGHTS).is_file():
        raise adapter_error(voice_id, f"adapter has no {WEIGHTS}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise adapter_error(voice_id, f"{CONFIG} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise adapter_error(voice_id, "not a LoRA adapter config")
    _check_features(voice_id, config)
    rank = _check_rank(voice_id, config, max_rank)
    targets = config.get("target_modules") or []
    if (not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets)
            or not set(targets) <= ALLOWED_TARGETS):
        raise adapter_error(voice_id, f"target modules {targets!r} outside attention/MLP projections "
                                      f"({', '.join(sorted(ALLOWED_TARGETS))})")
    _check_weights(voice_id, path / WEIGHTS, max_rank)
    meta = _metadata(voice_id, path)
    declared = meta.get("base_model") or config.get("base_model_name_or_path")
    if base_model and declared and not same_base_model(str(declared), base_model):
        raise adapter_error(voice_id, f"adapter was trained on '{declared}' but this worker serves '{base_model}'")
    prompt_name = meta.get("prompt_name") or voice_id.rsplit("/", 1)[-1]
    return AdapterInfo(voice_id, path, rank, str(prompt_name), str(declared) if declared else None)


def _check_rank(voice_id: str, config: dict, max_rank: int) -> int:
    rank, pattern = config.get("r"), config.get("rank_pattern") or {}
    ranks = [rank, *pattern.values()] if isinstance(pattern, dict) else [rank, None]
    if not all(_is_count(r) and r >= 1 for r in ranks):
        raise adapter_error(voice_id, f"adapter rank {rank!r} (rank_pattern {pattern!r}) is invalid")
    if max(ranks) > max_rank:
        raise adapter_error(voice_id, f"adapter rank {max(ranks)} exceeds this worker's max_lora_rank {max_rank}; "
                                      f"retrain with r <= {max_rank}")
    return max(ranks)


def _check_features(voice_id: str, config: dict) -> None:
    if config.get("modules_to_save"):
        raise adapter_error(voice_id, f"modules_to_save {config['modules_to_save']} is not servable (vLLM rejects it)")
    if config.get("use_dora"):
        raise adapter_error(voice_id, "DoRA adapters are not servable; retrain as plain LoRA")
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        raise adapter_error(voice_id, "adapters with bias terms are not servable; retrain with bias='none'")
    if config.get("trainable_token_indices") or config.get("layer_replication"):
        raise adapter_error(voice_id, "token-embedding training and layer replication are not servable")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().split("_")[0] in FOREIGN_INITS:
        raise adapter_error(voice_id, f"init_lora_weights={init!r} changes base weights; convert it to a plain LoRA")


def _check_weights(voice_id: str, weights: Path, max_rank: int) -> None:
    try:
        header = read_safetensors_header(weights)
    except (OSError, ValueError) as exc:
        raise adapter_error(voice_id, f"{WEIGHTS} is not a complete safetensors file: {exc}") from None
    if not header:
        raise adapter_error(voice_id, f"{WEIGHTS} holds no tensors")
    for name, entry in header.items():
        match = _TENSOR_NAME.match(name)
        if match is None or match["module"] not in ALLOWED_TARGETS:
            raise adapter_error(voice_id, f"{WEIGHTS} holds '{name}', which is not a LoRA A/B weight of an "
                                          "attention/MLP projection")
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise adapter_error(voice_id, f"tensor '{name}' has dtype {entry['dtype']}; expected F32, F16 or BF16")
        shape = entry["shape"]  # lora_A: [rank, in], lora_B: [out, rank]
        if len(shape) != 2:
            raise adapter_error(voice_id, f"tensor '{name}' has shape {shape}; a LoRA weight is a matrix")
        rank = shape[0] if match["ab"] == "A" else shape[1]
        if rank > max_rank:
            raise adapter_error(voice_id, f"tensor '{name}' has shape {shape}: rank above max_lora_rank {max_rank}")


def _metadata(voice_id: str, path: Path) -> dict:
    meta_path = path / METADATA
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise adapter_error(voice_id, f"{METADATA} is not valid JSON") from None
    return meta if isinstance(meta, dict) else {}
