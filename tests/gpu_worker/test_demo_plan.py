"""`voicering demo --model REAL` runs on real weights only: the real codec, the model's own voices as
base voices and no stand-in adapter anywhere (the real weights cannot be loaded here; the plan the
worker is started with can be checked)."""

from __future__ import annotations

import json

from gpu_worker.demo import DemoWeights, plan_demo
from gpu_worker.settings import WorkerSettings


def test_real_weights_use_no_stand_in(tmp_path, monkeypatch):
    plan = plan_demo(DemoWeights("/models/orpheus-3b-0.1-ft"), tmp_path / "cache", tmp_path / "scratch")
    args = dict(zip(plan.worker_args[::2], plan.worker_args[1::2], strict=True))
    assert args["--model"] == "/models/orpheus-3b-0.1-ft" and args["--codec"] == "hubertsiuzdak/snac_24khz"
    assert not (tmp_path / "cache").exists()  # no stand-in was built
    assert list((tmp_path / "scratch" / "empty-voice-store").iterdir()) == []
    assert plan.voices == ["tara", "leo"] and not plan.stand_in
    monkeypatch.setenv("VOICERING_WORKER_BASE_VOICES", plan.worker_env["VOICERING_WORKER_BASE_VOICES"])
    assert WorkerSettings(model="m").base_voices == ("tara", "leo")  # the worker reads them as base voices


def test_real_weights_with_a_store_speak_its_cloned_voices_too(tmp_path):
    store = tmp_path / "store"
    (store / "mine").mkdir(parents=True)
    (store / "mine" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    plan = plan_demo(DemoWeights("m", voices_dir=store, base_voices=("zoe",)), tmp_path / "c", tmp_path / "s")
    assert plan.voices == ["zoe", "mine"]
    assert plan.worker_args[plan.worker_args.index("--voices-dir") + 1] == str(store)


def test_stand_ins_by_default(tmp_path):
    plan = plan_demo(None, tmp_path / "cache", tmp_path / "scratch")
    assert plan.stand_in and plan.voices == ["leo", "tara"]
    assert str(tmp_path / "cache") in plan.worker_args[plan.worker_args.index("--model") + 1]
