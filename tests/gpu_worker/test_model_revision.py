"""The model revision (VOICERING_WORKER_MODEL_REVISION) reaches the engine's settings, blank means
the default branch, and the vLLM arguments it is passed as exist under those names."""

from __future__ import annotations

from gpu_worker.settings import WorkerSettings
from gpu_worker.worker import engine_settings


def test_the_revision_reaches_the_engine(monkeypatch):
    monkeypatch.setenv("VOICERING_WORKER_MODEL_REVISION", "0123abcd")
    assert engine_settings(WorkerSettings(model="org/weights")).revision == "0123abcd"
    monkeypatch.setenv("VOICERING_WORKER_MODEL_REVISION", "")  # the ConfigMap's unpinned default
    assert engine_settings(WorkerSettings(model="org/weights")).revision is None


def test_vllm_takes_the_revision_of_model_and_tokenizer():
    from vllm.engine.arg_utils import AsyncEngineArgs

    assert {"revision", "tokenizer_revision"} <= set(AsyncEngineArgs.__dataclass_fields__)
