"""Voices -> LoRA adapters: where they live, whether they are safe to load, and which are resident.

A voice id is ``name`` or ``tenant/name`` (`hashring.records.VOICE_ID`); its adapter is the
directory ``<store>/<voice id>/`` (`layout`). Tiers::

    engine slots (max_loras)  <-  engine CPU cache (max_cpu_loras, LRU)  <-  local disk  <-  store
    vLLM's own LRU              `AdapterCache` mirrors it, loads on miss    `AdapterStore`

One module per idea: `layout` (file names, target modules), `validation` (safetensors header,
LoRA config, base model), `store` (`AdapterStore`: local directory), `remote` (fsspec store with a
revalidated, private, size-capped local cache), `publish` (atomic publish), `cache`
(`AdapterCache`). No torch or vLLM here (the engine's loader and listing are passed in), so
lora_training and the gateway may import it cheaply.
"""

from gpu_worker.adapters.cache import AdapterCache, Listing, Loader
from gpu_worker.adapters.layout import (
    ALLOWED_TARGETS,
    CONFIG,
    LORA_TARGET_MODULES,
    METADATA,
    PICKLED_SUFFIXES,
    SERVED_FILES,
    STAGING_DIR,
    STAGING_TENANT,
    WEIGHTS,
)
from gpu_worker.adapters.publish import publish_adapter
from gpu_worker.adapters.remote import default_cache_dir
from gpu_worker.adapters.store import AdapterStore
from gpu_worker.adapters.validation import (
    AdapterInfo,
    base_model_key,
    read_safetensors_header,
    same_base_model,
    validate_adapter,
)
from hashring.records import VOICE_ID, valid_voice_id

__all__ = [
    "ALLOWED_TARGETS",
    "CONFIG",
    "LORA_TARGET_MODULES",
    "METADATA",
    "PICKLED_SUFFIXES",
    "SERVED_FILES",
    "STAGING_DIR",
    "STAGING_TENANT",
    "VOICE_ID",
    "WEIGHTS",
    "AdapterCache",
    "AdapterInfo",
    "AdapterStore",
    "Listing",
    "Loader",
    "base_model_key",
    "default_cache_dir",
    "publish_adapter",
    "read_safetensors_header",
    "same_base_model",
    "valid_voice_id",
    "validate_adapter",
]
