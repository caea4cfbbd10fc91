"""Voices -> LoRA adapters: where they live, whether they are safe to load, and which are resident.

A voice id is ``name`` or ``tenant/name``; its adapter is the directory ``<store>/<voice id>/``
holding ``adapter_config.json`` and ``adapter_model.safetensors`` (and optionally
``voicering.json`` metadata: ``prompt_name``, ``base_model``). Three tiers:

    engine slots (max_loras)  <-  engine CPU cache (max_cpu_loras, LRU)  <-  local disk  <-  store
    vLLM's own LRU              `AdapterCache` mirrors it, loads on miss      `AdapterStore`

- `AdapterStore` resolves a voice id to a validated adapter directory. The store root is a local
  directory (or a shared filesystem path), or an fsspec URL (``s3://...``, ``memory://...``) whose
  adapters are copied into a local cache directory on first use. Validation runs before vLLM ever
  sees an adapter, so a bad adapter is a clear error for that voice only. LoRA ids are stable per
  voice within a process (a republished voice gets a new id, so stale weights are never served).
- `AdapterCache` loads an adapter into the engine on first use (timed, counted), keeps an LRU
  mirror of the engine's CPU cache to count loads and evictions, and prewarms voices.
- `publish_adapter` makes a voice visible only when complete: copy into a hidden temp directory
  inside the store, fsync, then one ``rename(2)``.

No torch or vLLM here (the engine's loader is passed in), so lora_training and the gateway may
import this module cheaply.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import re
import shutil
import struct
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_worker.errors import AdapterError, UnknownVoice

if TYPE_CHECKING:
    from gpu_worker.engine import Voice
    from gpu_worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

VOICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,127})?$")
ALLOWED_TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
METADATA = "voicering.json"
SERVED_FILES = (CONFIG, WEIGHTS, METADATA)  # all a worker ever copies or loads
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
STAGING_DIR = ".staging"  # inside the store: same filesystem, never a valid voice id
SAFETENSORS_DTYPES = frozenset({"F32", "F16", "BF16"})
# peft inits that rewrite base weights at load (vLLM refuses them); plain ones load as LoRA
FOREIGN_INITS = frozenset({"pissa", "olora", "loftq", "corda"})
_TENSOR_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.\d+\.(self_attn|mlp)\.(?P<module>[a-z_]+)\.lora_(?P<ab>[AB])\.weight$"
)
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    voice_id: str
    path: Path
    rank: int
    prompt_name: str
    base_model: str | None = None  # what the adapter says it was trained on


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


def _fail(voice_id: str, message: str) -> AdapterError:
    return AdapterError(f"voice '{voice_id}': {message}")


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {dtype, shape, data_offsets}; raises ValueError when the file is not a whole
    safetensors file (bad header, or fewer bytes than the header promises: a half-written file)."""
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
        try:
            begin, stop = entry["data_offsets"]
            entry["dtype"], list(entry["shape"])
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"tensor '{name}' has a malformed header entry") from None
        end = max(end, int(stop))
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
        raise _fail(voice_id, f"adapter has no {CONFIG}")
    pickled = sorted(p.name for p in path.iterdir() if p.suffix in PICKLED_SUFFIXES)
    if pickled:
        raise _fail(voice_id, f"adapter holds pickled weights ({', '.join(pickled)}); only {WEIGHTS} is ever loaded: "
                              "remove them and republish")
    if not (path / WEIGHTS).is_file():
        raise _fail(voice_id, f"adapter has no {WEIGHTS}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(voice_id, f"{CONFIG} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise _fail(voice_id, "not a LoRA adapter config")
    _check_features(voice_id, config)
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise _fail(voice_id, f"adapter rank {rank!r} is invalid")
    ranks = [rank, *(config.get("rank_pattern") or {}).values()]
    if max(ranks) > max_rank:
        raise _fail(voice_id, f"adapter rank {max(ranks)} exceeds this worker's max_lora_rank {max_rank}; "
                              f"retrain with r <= {max_rank}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str) or not targets or not set(targets) <= ALLOWED_TARGETS:
        raise _fail(voice_id, f"target modules {targets!r} outside attention/MLP projections "
                              f"({', '.join(sorted(ALLOWED_TARGETS))})")
    _check_weights(voice_id, path / WEIGHTS, max_rank)
    meta = _metadata(voice_id, path)
    declared = meta.get("base_model") or config.get("base_model_name_or_path")
    if base_model and declared and not same_base_model(str(declared), base_model):
        raise _fail(voice_id, f"adapter was trained on '{declared}' but this worker serves '{base_model}'")
    prompt_name = meta.get("prompt_name") or voice_id.rsplit("/", 1)[-1]
    return AdapterInfo(voice_id, path, max(ranks), str(prompt_name), str(declared) if declared else None)


def _check_features(voice_id: str, config: dict) -> None:
    if config.get("modules_to_save"):
        raise _fail(voice_id, f"modules_to_save {config['modules_to_save']} is not servable (vLLM rejects it)")
    if config.get("use_dora"):
        raise _fail(voice_id, "DoRA adapters are not servable; retrain as plain LoRA")
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        raise _fail(voice_id, "adapters with bias terms are not servable; retrain with bias='none'")
    if config.get("trainable_token_indices") or config.get("layer_replication"):
        raise _fail(voice_id, "token-embedding training and layer replication are not servable")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().split("_")[0] in FOREIGN_INITS:
        raise _fail(voice_id, f"init_lora_weights={init!r} changes base weights; convert it to a plain LoRA")


def _check_weights(voice_id: str, weights: Path, max_rank: int) -> None:
    try:
        header = read_safetensors_header(weights)
    except (OSError, ValueError) as exc:
        raise _fail(voice_id, f"{WEIGHTS} is not a complete safetensors file: {exc}") from None
    if not header:
        raise _fail(voice_id, f"{WEIGHTS} holds no tensors")
    for name, entry in header.items():
        match = _TENSOR_NAME.match(name)
        if match is None or match["module"] not in ALLOWED_TARGETS:
            raise _fail(voice_id, f"{WEIGHTS} holds '{name}', which is not a LoRA A/B weight of an "
                                  "attention/MLP projection")
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise _fail(voice_id, f"tensor '{name}' has dtype {entry['dtype']}; expected F32, F16 or BF16")
        shape = entry["shape"]
        rank = shape[0] if match["ab"] == "A" else shape[-1]
        if len(shape) != 2 or rank > max_rank:
            raise _fail(voice_id, f"tensor '{name}' has shape {shape}: rank above max_lora_rank {max_rank}")


def _metadata(voice_id: str, path: Path) -> dict:
    meta_path = path / METADATA
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _fail(voice_id, f"{METADATA} is not valid JSON") from None
    return meta if isinstance(meta, dict) else {}


def publish_adapter(src_dir: Path, store_root: Path, voice_id: str, *, max_rank: int = 64,
                    base_model: str | None = None, replace: bool = False) -> AdapterInfo:
    """Validate ``src_dir`` and make it voice ``voice_id`` in a local store, atomically.

    The served files are copied into ``<store>/.staging/<random>/`` (same filesystem), fsynced,
    then renamed to ``<store>/<voice id>`` in one step: a worker sees the whole adapter or nothing.
    An existing voice is left alone (FileExistsError) unless ``replace``; a replacement is swapped
    in with one ``renameat2(RENAME_EXCHANGE)`` where the kernel has it, else two renames.
    """
    if not VOICE_ID.match(voice_id):
        raise ValueError(f"voice id '{voice_id}' is invalid (letters, digits, '._-', optional 'tenant/')")
    validate_adapter(Path(src_dir), voice_id=voice_id, max_rank=max_rank, base_model=base_model)
    store_root = Path(store_root)
    target = store_root / voice_id
    if target.exists() and not replace:
        raise FileExistsError(f"voice '{voice_id}' already exists in {store_root}")
    staging = store_root / STAGING_DIR / uuid.uuid4().hex
    staging.mkdir(parents=True)
    try:
        for name in SERVED_FILES:
            if (Path(src_dir) / name).is_file():
                shutil.copyfile(Path(src_dir) / name, staging / name)
                _fsync(staging / name)
        _fsync(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            _swap_in(staging, target)
        else:
            os.rename(staging, target)
        _fsync(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return validate_adapter(target, voice_id=voice_id, max_rank=max_rank, base_model=base_model)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_in(new: Path, target: Path) -> None:
    """Exchange ``new`` and ``target`` (afterwards ``new`` holds the old version, removed by the caller)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(target), rename_exchange) == 0:
            return
    old = new.with_name(new.name + ".old")
    os.rename(target, old)  # a few microseconds where the voice is absent: resolve says unknown_voice
    os.rename(new, target)
    os.rename(old, new)


def _is_url(root: str | Path) -> bool:
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


@dataclass(slots=True)
class AdapterStore:
    """Resolves voice ids to validated adapters; integer LoRA ids are stable within a process.

    ``root``: a local directory, or an fsspec URL whose adapters are copied into ``cache_dir``
    (``<tmp>/voicering-adapters`` when not given) on first use, served from there afterwards.
    """

    root: Path | str
    max_rank: int = 32
    base_voices: tuple[str, ...] = ()
    base_model: str | None = None
    cache_dir: Path | None = None
    _ids: dict[tuple[str, tuple], int] = field(default_factory=dict)
    _infos: dict[tuple[str, tuple], AdapterInfo] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # remote resolves run in threads

    def __post_init__(self) -> None:
        if _is_url(self.root):
            if self.cache_dir is None:
                import tempfile

                self.cache_dir = Path(tempfile.gettempdir()) / "voicering-adapters"
        else:
            self.root = Path(str(self.root).removeprefix("file://"))

    @property
    def remote(self) -> bool:
        return _is_url(self.root)

    def resolve(self, voice_id: str) -> Voice:
        """Voice id -> engine voice. Blocking (filesystem or network): call it off the event loop for
        a remote store. Raises UnknownVoice, or AdapterError for an adapter that fails validation."""
        from gpu_worker.engine import Voice

        if voice_id in self.base_voices:
            return Voice(voice_id, voice_id)
        if not VOICE_ID.match(voice_id):
            raise UnknownVoice(f"voice '{voice_id}' is not a valid voice id (letters, digits, '._-', optional 'tenant/')")
        path = self._fetch(voice_id) if self.remote else self._local(voice_id)
        version = _version(path)
        key = (voice_id, version)
        info = self._infos.get(key)
        if info is None:
            info = validate_adapter(path, voice_id=voice_id, max_rank=self.max_rank, base_model=self.base_model)
            self._infos[key] = info
        with self._lock:
            lora_id = self._ids.setdefault(key, len(self._ids) + 1)
        return Voice(voice_id, info.prompt_name, str(path), lora_id)

    def _local(self, voice_id: str) -> Path:
        path = Path(self.root) / voice_id
        if not path.is_dir():
            raise UnknownVoice(f"unknown voice '{voice_id}': no adapter published for it on this worker")
        return path

    def _fetch(self, voice_id: str) -> Path:
        """Copy a remote adapter into the local cache once (served files only, renamed into place)."""
        import fsspec

        local = Path(self.cache_dir) / voice_id
        if (local / CONFIG).is_file():
            return local
        fs, base = fsspec.core.url_to_fs(str(self.root))
        remote = f"{base.rstrip('/')}/{voice_id}"
        try:
            names = {Path(p).name for p in fs.ls(remote, detail=False)}
        except FileNotFoundError:
            names = set()
        if CONFIG not in names:
            raise UnknownVoice(f"unknown voice '{voice_id}': no adapter published for it in {self.root}")
        pickled = sorted(n for n in names if n.endswith(PICKLED_SUFFIXES))
        if pickled:
            raise _fail(voice_id, f"adapter holds pickled weights ({', '.join(pickled)}); only {WEIGHTS} is ever loaded")
        staging = Path(self.cache_dir) / STAGING_DIR / uuid.uuid4().hex
        staging.mkdir(parents=True)
        try:
            for name in SERVED_FILES:
                if name in names:
                    fs.get_file(f"{remote}/{name}", str(staging / name))
            validate_adapter(staging, voice_id=voice_id, max_rank=self.max_rank, base_model=self.base_model)
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(staging, local)
            except OSError:
                if not (local / CONFIG).is_file():  # not a concurrent fetch of the same voice
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return local

    def voices(self) -> list[str]:
        """Base voices and every published voice id (hidden and invalid names skipped)."""
        found: list[str] = []
        root = Path(self.cache_dir) if self.remote else Path(self.root)
        if root.is_dir():
            for entry in sorted(root.iterdir()):
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                if (entry / CONFIG).is_file():
                    found.append(entry.name)
                    continue
                found.extend(f"{entry.name}/{sub.name}" for sub in sorted(entry.iterdir())
                             if not sub.name.startswith(".") and (sub / CONFIG).is_file())
        return [*self.base_voices, *(v for v in found if VOICE_ID.match(v))]


def _version(path: Path) -> tuple:
    """What makes two resolutions the same adapter: real path + weights/config identity."""
    try:
        weights, config = (path / WEIGHTS).stat(), (path / CONFIG).stat()
    except FileNotFoundError:
        return (str(path.resolve()),)
    return (str(path.resolve()), weights.st_ino, weights.st_mtime_ns, weights.st_size, config.st_mtime_ns)


Loader = Callable[["Voice"], Awaitable[None]]


class AdapterCache:
    """Which adapters sit in the engine's CPU cache: loads on first use, LRU like vLLM's.

    ``capacity`` is the engine's ``max_cpu_loras``. On a miss the adapter is loaded explicitly
    (``loader``, i.e. `SpeechEngine.load_adapter`), timed and counted; inserting past capacity
    counts an eviction (vLLM evicts its least recently used adapter at the same moment). vLLM also
    refreshes recency every engine step for the adapters in the running batch; the mirror refreshes
    on acquire and on release, so under heavy churn its order can differ from vLLM's and a count may
    be off by the difference. Correctness never depends on it: every request carries its adapter
    path and vLLM reloads whatever it has evicted.
    """

    def __init__(self, store: AdapterStore, loader: Loader | None, capacity: int,
                 metrics: WorkerMetrics | None = None) -> None:
        self.store = store
        self._loader = loader
        self.capacity = max(1, capacity)
        self._metrics = metrics
        self._resident: OrderedDict[int, str] = OrderedDict()  # lora id -> voice id, oldest first
        self._loading: dict[int, asyncio.Future] = {}
        self.loads = 0
        self.evictions = 0

    @property
    def resident(self) -> list[str]:
        return list(self._resident.values())

    async def acquire(self, voice_id: str) -> Voice:
        """Resolve and make sure the adapter is in the engine; errors are for this voice only."""
        try:
            voice = await asyncio.to_thread(self.store.resolve, voice_id) if self.store.remote else self.store.resolve(voice_id)
        except AdapterError:
            if self._metrics is not None:
                self._metrics.adapter_errors.inc()
            raise
        if voice.adapter_path is None:
            return voice
        while (pending := self._loading.get(voice.lora_id)) is not None:
            try:
                await asyncio.shield(pending)  # one load per voice; its error is every waiter's error
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this waiter was cancelled
        if voice.lora_id in self._resident:
            self._resident.move_to_end(voice.lora_id)
            return voice
        future = asyncio.get_running_loop().create_future()
        self._loading[voice.lora_id] = future
        try:
            await self._load(voice)
            future.set_result(None)
        except asyncio.CancelledError:
            future.cancel()  # waiters try again themselves
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._loading[voice.lora_id]
        return voice

    def release(self, voice: Voice) -> None:
        """The voice's request finished: it was in the engine's last batch, so it is most recent."""
        if voice.lora_id in self._resident:
            self._resident.move_to_end(voice.lora_id)

    async def prewarm(self, voice_ids: Iterable[str]) -> dict[str, str]:
        """Load voices ahead of traffic; returns ``{voice: "ready" | error message}``.

        Only the last ``capacity`` voices can stay resident; earlier ones are still validated (and
        copied to local disk for a remote store), so their first request skips that work.
        """
        report: dict[str, str] = {}
        for voice_id in voice_ids:
            try:
                await self.acquire(voice_id)
                report[voice_id] = "ready"
            except (AdapterError, UnknownVoice) as exc:
                report[voice_id] = exc.message
        return report

    async def _load(self, voice: Voice) -> None:
        started = time.perf_counter()
        if self._loader is not None:
            try:
                await self._loader(voice)
            except AdapterError:
                raise
            except Exception as exc:  # the engine refused it: still this voice's problem only
                if self._metrics is not None:
                    self._metrics.adapter_errors.inc()
                raise _fail(voice.name, f"the engine could not load the adapter ({exc})") from None
        seconds = time.perf_counter() - started
        self._resident[voice.lora_id] = voice.name
        self.loads += 1
        evicted = []
        while len(self._resident) > self.capacity:
            evicted.append(self._resident.popitem(last=False)[1])
        self.evictions += len(evicted)
        if self._metrics is not None:
            self._metrics.adapter_loads.inc()
            self._metrics.adapter_load_seconds.observe(seconds)
            self._metrics.adapter_evictions.inc(len(evicted))
        log.info("adapter for voice %s loaded in %.3f s (lora id %d)%s", voice.name, seconds, voice.lora_id,
                 f"; evicted {', '.join(evicted)}" if evicted else "",
                 extra={"voice": voice.name, "load_s": round(seconds, 4), "evicted": evicted})
