"""The full-size stand-in: Orpheus-3B's exact shape (Llama-3.2-3B + the Orpheus vocabulary), the
sharded writer and the hand-written rank-32 voices, checked without writing 6.6 GB: the shape
against transformers' own model built on the meta device, the writer on a small shape with tiny
shards loaded back by transformers and peft."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from gpu_worker.adapters import LORA_TARGET_MODULES, validate_adapter
from gpu_worker.adapters.validation import read_safetensors_header
from gpu_worker.orpheus import VOCAB_SIZE
from gpu_worker.stand_in import (CODECS, ORPHEUS_3B, SHAPES, SNAC_24KHZ_CONFIG, SNAC_SMALL_CONFIG, build_snac,
                                 build_stand_in, write_lora, write_sharded_llama)

SMALL = replace(ORPHEUS_3B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16)


def _hf_config(shape, tmp_path):
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(shape.config()))
    return AutoConfig.from_pretrained(tmp_path)


def test_orpheus_3b_config_is_llama_3_2_3b_with_the_orpheus_vocabulary(tmp_path):
    config = _hf_config(ORPHEUS_3B, tmp_path)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.head_dim) == (3072, 28, 24, 8, 8192, 128)
    assert config.vocab_size == VOCAB_SIZE == 156_940
    assert config.tie_word_embeddings is True
    assert config.max_position_embeddings == 131072 and config.rms_norm_eps == 1e-5
    rope = config.rope_parameters  # transformers 5 folds rope_theta + rope_scaling into one dict
    assert rope["rope_type"] == "llama3" and rope["rope_theta"] == 500000.0
    assert (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
            rope["original_max_position_embeddings"]) == (32.0, 1.0, 4.0, 8192)
    written = ORPHEUS_3B.config()  # the hub's own spelling, as Llama-3.2-3B and Orpheus ship it
    assert written["rope_scaling"]["rope_type"] == "llama3" and written["torch_dtype"] == "bfloat16"


def test_orpheus_3b_tensor_plan_is_transformers_own_state_dict(tmp_path):
    from transformers import LlamaForCausalLM

    config = _hf_config(ORPHEUS_3B, tmp_path)
    with torch.device("meta"):  # no memory: shapes only
        model = LlamaForCausalLM(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items() if name != "lm_head.weight"}  # tied
    planned = dict(ORPHEUS_3B.tensors())
    assert planned == expected
    assert ORPHEUS_3B.parameters() == sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert 3.2e9 < ORPHEUS_3B.parameters() < 3.4e9


def test_sharded_writer_round_trips_through_transformers(tmp_path):
    from transformers import LlamaForCausalLM

    out = tmp_path / "model"
    shards = write_sharded_llama(out, SMALL, max_shard_bytes=1 << 20)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) >= 2 and {p.name for p in shards} == set(index["weight_map"].values())
    assert set(index["weight_map"]) == dict(SMALL.tensors()).keys()
    on_disk = {}
    for shard in shards:
        for name, entry in read_safetensors_header(shard).items():
            assert entry["dtype"] == "BF16"
            on_disk[name] = tuple(entry["shape"])
    assert on_disk == dict(SMALL.tensors())
    assert index["metadata"]["total_size"] == 2 * SMALL.parameters()
    model, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.dtype == torch.bfloat16
    assert torch.equal(model.model.norm.weight, torch.ones(SMALL.hidden_size, dtype=torch.bfloat16))
    weight = model.model.layers[1].mlp.down_proj.weight.float()
    assert 0.015 < weight.std().item() < 0.025  # random, not zeros


def test_full_size_voice_is_rank_32_on_every_projection_and_servable(tmp_path):
    voice = tmp_path / "voice"
    write_lora(ORPHEUS_3B, tmp_path / "orpheus", voice, name="v0", seed=1)
    header = read_safetensors_header(voice / "adapter_model.safetensors")
    assert len(header) == ORPHEUS_3B.num_hidden_layers * len(LORA_TARGET_MODULES) * 2
    layer = "base_model.model.model.layers.27"
    assert header[f"{layer}.self_attn.k_proj.lora_A.weight"]["shape"] == [32, 3072]
    assert header[f"{layer}.self_attn.k_proj.lora_B.weight"]["shape"] == [1024, 32]
    assert header[f"{layer}.mlp.down_proj.lora_A.weight"]["shape"] == [32, 8192]
    info = validate_adapter(voice, voice_id="v0", max_rank=32, base_model=str(tmp_path / "orpheus"))
    assert info.rank == 32
    with pytest.raises(Exception, match="rank"):
        validate_adapter(voice, voice_id="v0", max_rank=16)


def test_hand_written_voice_loads_in_peft(tmp_path):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    write_sharded_llama(tmp_path / "model", SMALL)
    write_lora(SMALL, tmp_path / "model", tmp_path / "voice", name="v", seed=2, rank=8)
    base = LlamaForCausalLM.from_pretrained(tmp_path / "model")
    peft_model = PeftModel.from_pretrained(base, tmp_path / "voice")
    loaded = peft_model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    assert loaded.shape == (64, 8) and loaded.abs().sum() > 0  # the random B was read, not peft's zero init


def test_unknown_shape_is_refused(tmp_path):
    assert SHAPES == ("tiny", "orpheus-3b")
    with pytest.raises(ValueError, match="orpheus-3b"):
        build_stand_in(tmp_path, shape="orpheus-8b")  # type: ignore[arg-type]


def test_the_tiny_stand_in_s_small_codec_keeps_the_published_interface(stand_in, codec):
    """The suite's codec is narrow, but every rate, stride and code book is the published one: the
    same frames decode to the same number of samples, and encoding gives codes the decoder reads."""
    from gpu_worker.orpheus import SAMPLES_PER_FRAME, Frame

    config = json.loads((stand_in.codec / "config.json").read_text())
    assert config == SNAC_SMALL_CONFIG and CODECS["small"] is SNAC_SMALL_CONFIG
    interface = ("sampling_rate", "encoder_rates", "decoder_rates", "codebook_size", "codebook_dim", "vq_strides")
    assert {k: config[k] for k in interface} == {k: SNAC_24KHZ_CONFIG[k] for k in interface}
    assert (config["decoder_dim"], config["encoder_dim"]) < (SNAC_24KHZ_CONFIG["decoder_dim"], SNAC_24KHZ_CONFIG["encoder_dim"])
    frames = [Frame(i, (i + 1, 4095), (0, 7, 4094, i)) for i in range(5)]
    audio = codec.decode_frames(frames)
    assert audio.shape == (5 * SAMPLES_PER_FRAME,) and np.isfinite(audio).all() and np.abs(audio).max() > 0
    encoded = codec.encode(audio)  # what the trainer's SNAC-codes step does to a creator's clip
    assert len(encoded) == 5 and all(0 <= c < 4096 for f in encoded for c in f.slot_codes())
    assert codec.decode_frames(encoded).shape == audio.shape


def test_the_codec_follows_the_shape_unless_asked(tmp_path):
    with pytest.raises(ValueError, match="snac-24khz"):
        build_stand_in(tmp_path, codec="large")  # type: ignore[arg-type]
    build_snac(tmp_path / "published", codec="snac-24khz")
    assert json.loads((tmp_path / "published" / "config.json").read_text()) == SNAC_24KHZ_CONFIG


def test_a_build_waits_for_another_process_s_build_of_the_same_root_and_reuses_it(tmp_path):
    """`voicering up` beside a bench (or two test runs) build one root at a time: a second build
    that finds it incomplete waits on the root's lock, then reuses what the first one wrote instead
    of deleting it from under it."""
    import fcntl
    import threading

    paths = build_stand_in(tmp_path / "si", voices=1)
    weights = next(paths.model.glob("*.safetensors"))
    before = weights.stat().st_ino
    stamp = paths.stamp.read_text()
    with open(tmp_path / ".si.lock", "w") as lock:  # another process is building it now
        fcntl.flock(lock, fcntl.LOCK_EX)
        paths.stamp.unlink()
        second = threading.Thread(target=build_stand_in, args=(tmp_path / "si",), kwargs={"voices": 1})
        second.start()
        second.join(1.0)
        assert second.is_alive()  # waiting on the lock, not rebuilding
        paths.stamp.write_text(stamp)  # the other build finishes
    second.join(60)
    assert not second.is_alive()
    assert next(paths.model.glob("*.safetensors")).stat().st_ino == before  # reused, not rewritten
