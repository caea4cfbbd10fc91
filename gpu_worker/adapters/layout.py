"""What an adapter directory and an adapter store look like on disk, and the modules a voice may adapt.

A voice's adapter is ``<store>/<voice id>/`` holding `CONFIG` and `WEIGHTS` (and optionally
`METADATA`). Names starting with '.' are never voice ids, so a store keeps its in-flight copies
under `STAGING_DIR`; lora_training stages adapters under validation under the `STAGING_TENANT`
tenant, which workers resolve but never list.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ALLOWED_TARGETS", "CONFIG", "LORA_TARGET_MODULES", "METADATA", "PICKLED_SUFFIXES", "SERVED_FILES",
           "STAGING_DIR", "STAGING_TENANT", "WEIGHTS"]

WEIGHTS: Final = "adapter_model.safetensors"
CONFIG: Final = "adapter_config.json"
METADATA: Final = "voicering.json"
SERVED_FILES: Final = (CONFIG, WEIGHTS, METADATA)  # all a worker ever copies or loads
PICKLED_SUFFIXES: Final = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
STAGING_DIR: Final = ".staging"  # inside a store or cache: same filesystem, never a valid voice id
STAGING_TENANT: Final = "voicering-staging"  # lora_training's adapters under validation

# The projections vLLM serves LoRA on for a Llama model: the trainer targets exactly these and the
# worker refuses anything else. The single definition; stand-ins and lora_training import it.
LORA_TARGET_MODULES: Final = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALLOWED_TARGETS: Final = frozenset(LORA_TARGET_MODULES)
