"""Malformed adapters are `bad_adapter` for their voice, never an internal error: hand-built
safetensors headers and configs, no torch needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gpu_worker.adapters import CONFIG, WEIGHTS, AdapterCache, AdapterStore, validate_adapter
from gpu_worker.errors import AdapterError

TENSOR = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
GOOD_CONFIG = {"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"], "bias": "none"}


def write_safetensors(path: Path, entries: dict[str, object], data: bytes) -> None:
    header = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def write_adapter(path: Path, a_entry: object, *, config: dict | None = None) -> Path:
    """A q_proj LoRA whose lora_A header entry is ``a_entry`` (lora_B a valid [8, 4] F32 matrix)."""
    path.mkdir(parents=True)
    (path / CONFIG).write_text(json.dumps(config or GOOD_CONFIG))
    b_entry = {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]}
    write_safetensors(path / WEIGHTS, {TENSOR.format("B"): b_entry, TENSOR.format("A"): a_entry}, bytes(128 + 128))
    return path


def a(shape: object = (4, 8), dtype: object = "F32", offsets: object = (128, 256)) -> dict:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


def test_the_hand_built_adapter_is_valid(tmp_path):
    info = validate_adapter(write_adapter(tmp_path / "v", a()), voice_id="v", max_rank=8)
    assert info.rank == 4


@pytest.mark.parametrize(("entry", "needle"), [
    (a(shape=[]), "a LoRA weight is a matrix"),  # 0-d: indexed shape[0] before checking its length
    (a(shape=[4]), "a LoRA weight is a matrix"),
    (a(shape=[4, 8, 1]), "a LoRA weight is a matrix"),
    (a(shape=["4", 8]), "malformed header entry"),
    (a(shape=[-4, 8]), "malformed header entry"),
    (a(shape=None), "malformed header entry"),
    (a(dtype=["F32"]), "malformed header entry"),  # unhashable: was a TypeError
    (a(dtype="I64"), "dtype I64"),
    (a(offsets=[None, 256]), "malformed header entry"),
    (a(offsets=[256, 128]), "malformed header entry"),
    ([1, 2], "malformed header entry"),
])
def test_malformed_tensor_headers_are_bad_adapter(tmp_path, entry, needle):
    path = write_adapter(tmp_path / "v", entry)
    with pytest.raises(AdapterError) as err:
        validate_adapter(path, voice_id="acme/v", max_rank=8)
    assert err.value.code == "bad_adapter" and not err.value.retryable
    assert err.value.message.startswith("voice 'acme/v': ") and needle in err.value.message


@pytest.mark.parametrize(("changes", "needle"), [
    ({"rank_pattern": ["q_proj", 4]}, "is invalid"),  # not a mapping: was an AttributeError
    ({"rank_pattern": {"q_proj": "8"}}, "is invalid"),
    ({"r": True}, "is invalid"),
    ({"target_modules": [["q_proj"]]}, "target modules"),  # unhashable: was a TypeError
    ({"target_modules": {"q_proj": 1}}, "target modules"),
])
def test_malformed_configs_are_bad_adapter(tmp_path, changes, needle):
    path = write_adapter(tmp_path / "v", a(), config={**GOOD_CONFIG, **changes})
    with pytest.raises(AdapterError, match=needle):
        validate_adapter(path, voice_id="v", max_rank=8)


async def test_prewarm_reports_a_zero_dim_tensor_instead_of_raising(tmp_path):
    write_adapter(tmp_path / "store" / "flat", a(shape=[]))
    write_adapter(tmp_path / "store" / "fine", a())
    cache = AdapterCache(AdapterStore(tmp_path / "store", max_rank=8), None, capacity=2)
    report = await cache.prewarm(["flat", "fine"])
    assert report["fine"] == "ready"
    assert report["flat"].startswith("voice 'flat': tensor") and "a LoRA weight is a matrix" in report["flat"]
