"""Stand-in weights, built offline: a random Orpheus-vocabulary Llama, its tokenizer, a random SNAC
24 kHz checkpoint and random LoRA voices.

They are laid out exactly like hub snapshots so the production loaders (`engine.py`, `codec.py`)
read them with the same code that reads real Orpheus/SNAC weights. Random weights make noise,
not speech; they exist so the whole serving path runs on a machine with no hub access.

Two shapes (`SHAPES`): ``tiny`` (the default: 2 layers, hidden 256, for CPU tests) and
``orpheus-3b`` (`ORPHEUS_3B`: Llama-3.2-3B's exact shape with the Orpheus vocabulary, ~3.3 B
parameters). Two codecs (`CODECS`): ``snac-24khz`` (the published shape, 19.8 M parameters) and
``small`` (the same rates, hop, codebooks and token interface with narrow convolutions: 1.1 M
parameters, ~9x faster to decode and ~7x faster to encode on a CPU). ``tiny`` comes with the
``small`` codec, since on a CPU the published decoder, not the model, bounded every test's speed
(270 ms per 4-frame window against 31 ms); whatever measures codec cost asks for ``snac-24khz``.

A decode step's cost does not depend on the weights' values, so the full-size
stand-in measures real capacity. It is written tensor by tensor into bf16 safetensors shards with
an index (`write_sharded_llama`), never holding more than one shard, and its rank-32 voices are
written directly (`write_lora`) rather than through peft, which would need the whole base model.

Layout under the target directory::

    orpheus/       config.json, model.safetensors (bf16; or model-0000k-of-0000n.safetensors +
                   model.safetensors.index.json), tokenizer.json, tokenizer_config.json
    snac_24khz/    config.json, pytorch_model.bin
    voices/<id>/   adapter_config.json, adapter_model.safetensors, voicering.json
"""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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

# The same codec with narrow convolutions: identical sample rate, hop (512), level strides and
# 4096-code books, so every id, frame and window is what the published codec sees.
SNAC_SMALL_CONFIG = {**SNAC_24KHZ_CONFIG, "encoder_dim": 16, "decoder_dim": 128}

CodecName = Literal["snac-24khz", "small"]
CODECS: dict[CodecName, dict] = {"snac-24khz": SNAC_24KHZ_CONFIG, "small": SNAC_SMALL_CONFIG}

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello there, how are you today? "
    "I am a voice that lives on a ring of workers, and I speak as soon as you ask. "
    "Numbers like one, two, three and 2026 appear in text; so do questions, commas and quotes. "
    "She sells sea shells by the sea shore. We will meet at noon near the old station. "
    "<laugh> <sigh> <chuckle> <gasp> Emotions are written in angle brackets. "
)


def __getattr__(name: str) -> object:
    """`LORA_TARGET_MODULES` is the adapter package's (one source), imported on first use: the GPU
    check imports this module on a machine without hashring's dependencies (mmh3)."""
    if name == "LORA_TARGET_MODULES":
        from gpu_worker.adapters import LORA_TARGET_MODULES

        return LORA_TARGET_MODULES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ShapeName = Literal["tiny", "orpheus-3b"]
SHAPES: tuple[ShapeName, ...] = ("tiny", "orpheus-3b")
DEFAULT_SHARD_BYTES = 2 << 30  # a shard holds at least one tensor (the 0.96 GB embedding is the largest)
PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A Llama's shape as its hub config.json states it; the tensors follow from it."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = field(default=None, hash=False)
    tie_word_embeddings: bool = True
    vocab_size: int = VOCAB_SIZE
    lora_rank: int = 32  # the trainer's default rank (Orpheus guidance)

    def config(self) -> dict:
        """config.json as a hub snapshot writes it (``rope_scaling``, as Llama-3.2 and Orpheus ship)."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu", "initializer_range": 0.02,
                "pretraining_tp": 1, "use_cache": True, "torch_dtype": "bfloat16",
                "bos_token_id": START_OF_TEXT, "eos_token_id": END_OF_TEXT,
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
                "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
                "tie_word_embeddings": self.tie_word_embeddings, "vocab_size": self.vocab_size}

    def projection_shape(self, module: str) -> tuple[int, int]:
        """(out, in) of one attention/MLP projection."""
        h, q, kv, i = (self.hidden_size, self.num_attention_heads * self.head_dim,
                       self.num_key_value_heads * self.head_dim, self.intermediate_size)
        return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
                "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}[module]

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every weight's name and shape, in LlamaForCausalLM's state-dict order."""
        yield "model.embed_tokens.weight", (self.vocab_size, self.hidden_size)
        for layer in range(self.num_hidden_layers):
            prefix = f"model.layers.{layer}"
            for module, block in PROJECTIONS.items():
                if block == "self_attn":
                    yield f"{prefix}.self_attn.{module}.weight", self.projection_shape(module)
            for module, block in PROJECTIONS.items():
                if block == "mlp":
                    yield f"{prefix}.mlp.{module}.weight", self.projection_shape(module)
            yield f"{prefix}.input_layernorm.weight", (self.hidden_size,)
            yield f"{prefix}.post_attention_layernorm.weight", (self.hidden_size,)
        yield "model.norm.weight", (self.hidden_size,)
        if not self.tie_word_embeddings:
            yield "lm_head.weight", (self.vocab_size, self.hidden_size)

    def parameters(self) -> int:
        return sum(_numel(dims) for _, dims in self.tensors())


# Llama-3.2-3B (meta-llama/Llama-3.2-3B config.json), which Orpheus 3B fine-tunes, with Orpheus'
# 156,940-token vocabulary (128,256 Llama-3 ids + 28,684 custom tokens); embeddings tied as in both.
ORPHEUS_3B = ModelShape(
    hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    tie_word_embeddings=True,
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


def _shards(shape: ModelShape, max_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Tensors grouped in state-dict order into shards of at most ``max_bytes`` of bf16 (a tensor
    larger than that gets a shard of its own)."""
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in shape.tensors():
        nbytes = 2 * _numel(dims)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += nbytes
    return shards


def _numel(dims: tuple[int, ...]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def write_sharded_llama(out: Path, shape: ModelShape, *, seed: int = 0, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Path]:
    """Random bf16 weights of ``shape`` (projections and embeddings N(0, 0.02), norms 1), written one
    shard at a time with `model.safetensors.index.json`, so memory peaks at one shard."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    groups = _shards(shape, max_shard_bytes)
    weight_map: dict[str, str] = {}
    written = []
    for k, group in enumerate(groups, start=1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        shard = {}
        for name, dims in group:
            tensor = torch.empty(dims, dtype=torch.bfloat16)
            if name.endswith("norm.weight"):
                tensor.fill_(1.0)
            else:
                tensor.normal_(0.0, 0.02, generator=generator)
            shard[name] = tensor
            weight_map[name] = file
        save_file(shard, out / file, metadata={"format": "pt"})
        written.append(out / file)
        del shard
    total = 2 * sum(_numel(dims) for _, dims in shape.tensors())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(shape.config(), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": START_OF_TEXT, "eos_token_id": END_OF_TEXT, "do_sample": True}, indent=2))
    return written


def write_lora(shape: ModelShape, model_dir: Path, out: Path, *, name: str, seed: int, rank: int | None = None) -> None:
    """A random bf16 LoRA voice on every attention/MLP projection, written as peft lays it out
    (alpha = 2 x rank, as the trainer sets it; no modules_to_save, no DoRA: vLLM rejects both)."""
    import torch
    from safetensors.torch import save_file

    from gpu_worker.adapters import LORA_TARGET_MODULES

    rank = rank or shape.lora_rank
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shape.num_hidden_layers):
        for module in LORA_TARGET_MODULES:
            rows, cols = shape.projection_shape(module)
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[module]}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.empty((rank, cols), dtype=torch.bfloat16).normal_(0.0, 0.02, generator=generator)
            tensors[f"{prefix}.lora_B.weight"] = torch.empty((rows, rank), dtype=torch.bfloat16).normal_(0.0, 0.02, generator=generator)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(LORA_TARGET_MODULES), "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              "use_dora": False, "modules_to_save": None, "fan_in_fan_out": False, "init_lora_weights": True,
              "inference_mode": True, "base_model_name_or_path": str(model_dir)}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (out / "voicering.json").write_text(json.dumps({"voice": name, "prompt_name": name, "stand_in": True}, indent=2))


def build_snac(out: Path, *, seed: int = 0, codec: CodecName = "snac-24khz") -> None:
    import torch
    from snac import SNAC

    config = CODECS[codec]
    torch.manual_seed(seed)
    model = SNAC(**config)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(model.state_dict(), out / "pytorch_model.bin")


def build_voice(model_dir: Path, out: Path, *, name: str, seed: int, rank: int = 16, alpha: int = 32) -> None:
    """A random peft LoRA on attention + MLP projections; never modules_to_save (vLLM rejects it)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from gpu_worker.adapters import LORA_TARGET_MODULES

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


def stand_in_codec(shape: str, codec: str | None) -> CodecName:
    """The codec a stand-in of ``shape`` gets (``small`` for tiny, ``snac-24khz`` for the full
    size, unless ``codec`` is given); ValueError names the choices for an unknown shape or codec."""
    if shape not in SHAPES:
        raise ValueError(f"unknown stand-in shape {shape!r}; choose one of {', '.join(SHAPES)}")
    codec = codec or ("small" if shape == "tiny" else "snac-24khz")
    if codec not in CODECS:
        raise ValueError(f"unknown stand-in codec {codec!r}; choose one of {', '.join(CODECS)}")
    return codec  # type: ignore[return-value]


def build_stand_in(root: Path, *, voices: int = 2, seed: int = 0, force: bool = False,
                   shape: ShapeName = "tiny", codec: CodecName | None = None) -> StandInPaths:
    """Write (or reuse, when already complete with the same settings) the stand-in models under root.

    ``shape="orpheus-3b"`` writes the full-size model (~6.6 GB of bf16 shards) and rank-32 voices.
    ``codec``: ``small`` for the tiny shape and ``snac-24khz`` for the full one unless given."""
    codec = stand_in_codec(shape, codec)
    paths = StandInPaths(Path(root))
    wanted = {"version": STAND_IN_VERSION, "voices": voice_names(voices), "seed": seed, "codec": codec}
    if shape != "tiny":
        wanted["shape"] = shape
    if not force and _complete(paths, wanted):
        return paths
    paths.root.parent.mkdir(parents=True, exist_ok=True)
    # two processes building the same root at once (`voicering up` beside a bench, a parallel test
    # run) would delete each other's half-written files: one builds, the others wait and reuse it
    with open(paths.root.parent / f".{paths.root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _complete(paths, wanted):
            return paths
        _build(paths, wanted, shape=shape, seed=seed, codec=codec)
    return paths


def _complete(paths: StandInPaths, wanted: dict) -> bool:
    return paths.stamp.exists() and json.loads(paths.stamp.read_text()) == wanted


def _build(paths: StandInPaths, wanted: dict, *, shape: ShapeName, seed: int, codec: CodecName) -> None:
    if paths.root.exists():
        for sub in (paths.model, paths.codec, paths.voices):
            shutil.rmtree(sub, ignore_errors=True)
        paths.stamp.unlink(missing_ok=True)
    paths.root.mkdir(parents=True, exist_ok=True)
    if shape == "tiny":
        build_llama(paths.model, seed=seed)
    else:
        write_sharded_llama(paths.model, ORPHEUS_3B, seed=seed)
    build_tokenizer(paths.model)
    build_snac(paths.codec, seed=seed, codec=codec)
    for i, name in enumerate(wanted["voices"]):
        if shape == "tiny":
            build_voice(paths.model, paths.voice(name), name=name, seed=seed + 1000 + i)
        else:
            write_lora(ORPHEUS_3B, paths.model, paths.voice(name), name=name, seed=seed + 1000 + i)
    paths.stamp.write_text(json.dumps(wanted))
