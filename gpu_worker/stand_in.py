"""Stand-in weights, built offline: a tiny random Orpheus-shaped Llama, its tokenizer, a random SNAC
24 kHz checkpoint and random LoRA voices.

They are laid out exactly like hub snapshots so the production loaders (`engine.py`, `codec.py`)
read them with the same code that reads real Orpheus/SNAC weights. Random weights make noise,
not speech; they exist so the whole serving path runs on a machine with no hub access.

Layout under the target directory::

    orpheus/       config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json
    snac_24khz/    config.json, pytorch_model.bin
    voices/<id>/   adapter_config.json, adapter_model.safetensors, voicering.json
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpu_worker.adapters import LORA_TARGET_MODULES
from gpu_worker.orpheus import AUDIO_BASE, END_OF_TEXT, START_OF_TEXT, VOCAB_SIZE

STAND_IN_VERSION = 1
VOICE_NAMES = ("tara", "leo", "mia", "zac", "leah", "dan", "jess", "zoe")

# SNAC 24 kHz, as published (hubertsiuzdak/snac_24khz).
SNAC_24KHZ_CONFIG = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello there, how are you today? "
    "I am a voice that lives on a ring of workers, and I speak as soon as you ask. "
    "Numbers like one, two, three and 2026 appear in text; so do questions, commas and quotes. "
    "She sells sea shells by the sea shore. We will meet at noon near the old station. "
    "<laugh> <sigh> <chuckle> <gasp> Emotions are written in angle brackets. "
)


@dataclass(frozen=True, slots=True)
class StandInPaths:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "orpheus"

    @property
    def codec(self) -> Path:
        return self.root / "snac_24khz"

    @property
    def voices(self) -> Path:
        return self.root / "voices"

    def voice(self, name: str) -> Path:
        return self.voices / name

    @property
    def stamp(self) -> Path:
        return self.root / "stand-in.json"


def _special_tokens() -> dict[int, str]:
    """Llama-3 special token names 128000..128255, then Orpheus custom tokens."""
    names = {START_OF_TEXT: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
             128007: "<|end_header_id|>", END_OF_TEXT: "<|eot_id|>"}
    reserved = 0
    for i in range(START_OF_TEXT, 128256):
        if i not in names:
            names[i] = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
    for i in range(128256, VOCAB_SIZE):
        names[i] = f"<custom_token_{i - 128256}>"
    return names


def build_tokenizer(out: Path) -> None:
    """A byte-level BPE trained on a small corpus, padded to the full 156,940-id Orpheus vocabulary.

    Ids keep their Orpheus meaning: BOS 128000, <|eot_id|> 128009, <custom_token_N> at 128256 + N.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator([_CORPUS] * 4, trainer)
    trained = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = dict(trained["vocab"])
    for i in range(len(vocab), START_OF_TEXT):
        vocab[f"<|filler_{i}|>"] = i
    specials = _special_tokens()
    for i in range(START_OF_TEXT, VOCAB_SIZE):
        vocab[specials[i]] = i
    assert len(vocab) == VOCAB_SIZE

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                                                     for m in trained["merges"]]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([specials[i] for i in range(START_OF_TEXT, 128256)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", START_OF_TEXT)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|end_of_text|>"
    )
    fast.model_max_length = 4096
    fast.save_pretrained(out)


def build_llama(out: Path, *, seed: int = 0) -> None:
    """A 2-layer Llama with the Orpheus vocabulary; audio rows of the embedding scaled up so the
    random model's hidden states carry position/slot signal (purely cosmetic for a stand-in)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=START_OF_TEXT,
        eos_token_id=END_OF_TEXT,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        model.model.embed_tokens.weight[AUDIO_BASE:] *= 4.0
    model.save_pretrained(out, safe_serialization=True)


def build_snac(out: Path, *, seed: int = 0) -> None:
    import torch
    from snac import SNAC

    torch.manual_seed(seed)
    model = SNAC(**SNAC_24KHZ_CONFIG)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG, indent=2))
    torch.save(model.state_dict(), out / "pytorch_model.bin")


def build_voice(model_dir: Path, out: Path, *, name: str, seed: int, rank: int = 16, alpha: int = 32) -> None:
    """A random peft LoRA on attention + MLP projections; never modules_to_save (vLLM rejects it)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    peft_model = get_peft_model(
        base,
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(LORA_TARGET_MODULES), lora_dropout=0.0,
                   bias="none", task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for pname, param in peft_model.named_parameters():
            if "lora_A" in pname or "lora_B" in pname:
                param.normal_(0.0, 0.08)
    peft_model.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = str(model_dir)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    (out / "voicering.json").write_text(json.dumps({"voice": name, "prompt_name": name, "stand_in": True}, indent=2))


def voice_names(count: int) -> list[str]:
    return [VOICE_NAMES[i] if i < len(VOICE_NAMES) else f"voice{i}" for i in range(count)]


def build_stand_in(root: Path, *, voices: int = 2, seed: int = 0, force: bool = False) -> StandInPaths:
    """Write (or reuse, when already complete with the same settings) the stand-in models under root."""
    paths = StandInPaths(Path(root))
    wanted = {"version": STAND_IN_VERSION, "voices": voice_names(voices), "seed": seed}
    if not force and paths.stamp.exists() and json.loads(paths.stamp.read_text()) == wanted:
        return paths
    if paths.root.exists():
        for sub in (paths.model, paths.codec, paths.voices):
            shutil.rmtree(sub, ignore_errors=True)
        paths.stamp.unlink(missing_ok=True)
    paths.root.mkdir(parents=True, exist_ok=True)
    build_llama(paths.model, seed=seed)
    build_tokenizer(paths.model)
    build_snac(paths.codec, seed=seed)
    for i, name in enumerate(wanted["voices"]):
        build_voice(paths.model, paths.voice(name), name=name, seed=seed + 1000 + i)
    paths.stamp.write_text(json.dumps(wanted))
    return paths
