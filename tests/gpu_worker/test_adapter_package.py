"""The adapters package: one module per idea, public names guarded, light to import, and the single
source of the LoRA target modules the trainer and the stand-ins use."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import gpu_worker.adapters as adapters

MODULES = ["layout", "validation", "store", "remote", "publish", "cache"]


@pytest.mark.parametrize("name", ["", *MODULES])
def test_all_names_exist(name):
    module = importlib.import_module(f"gpu_worker.adapters{'.' + name if name else ''}")
    assert module.__all__
    for public in module.__all__:
        assert hasattr(module, public), f"{module.__name__}.{public}"


def test_the_package_pulls_in_neither_torch_nor_vllm_nor_fsspec():
    code = ("import sys, gpu_worker.adapters\n"
            "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'fsspec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_lora_target_modules_have_one_source():
    from gpu_worker import stand_in
    from lora_training import trainer

    assert stand_in.LORA_TARGET_MODULES is adapters.LORA_TARGET_MODULES
    assert trainer.LORA_TARGET_MODULES is adapters.LORA_TARGET_MODULES
    assert adapters.ALLOWED_TARGETS == frozenset(adapters.LORA_TARGET_MODULES)


def test_training_stages_under_the_tenant_the_store_hides():
    from lora_training import publish

    assert publish.STAGING_TENANT == adapters.STAGING_TENANT
