"""What a queued job's trainer configures and releases: the warm-up the scheduler really applies
(transformers >= 5 reads warmup_steps < 1 as a ratio; older versions are refused), the model
dropped before a validation worker starts, and the validation worker's GPU memory share reaching
the spawned worker process."""

import gc
import json
import weakref
from pathlib import Path

import pytest

from gpu_worker.orpheus import AUDIO_BASE, END_OF_AI, END_OF_SPEECH, START_OF_HUMAN
from lora_training.dataset import Example
from lora_training.errors import ConfigError
from lora_training.publish import WORKER_GPU_MEMORY_ENV, LocalWorker
from lora_training.settings import TrainParams
from lora_training.trainer import checkpoint_step, last_checkpoint, train_lora, training_arguments

OWN_WORKERS = 1  # a trainer's validation worker (tests/fixtures/fleet.py)

STEPS, WARMUP = 10, 0.3  # ceil(10 * 0.3) = 3 warm-up steps


def _examples(count: int) -> list[Example]:
    out = []
    for i in range(count):
        audio = [AUDIO_BASE + (i * 7 + j) % 4096 + 4096 * (j % 7) for j in range(21)]
        out.append(Example(f"c{i}", (START_OF_HUMAN, 40, 41, 42, *audio, END_OF_SPEECH, END_OF_AI), 4))
    return out


@pytest.fixture(scope="module")
def trained(stand_in, tmp_path_factory):
    """One real training run on the stand-in model; the base model watched through a weak reference."""
    from transformers import AutoModelForCausalLM

    params = TrainParams(rank=4, alpha=8, max_steps=STEPS, save_steps=STEPS, batch_size=1, grad_accum=1,
                         logging_steps=1, warmup_ratio=WARMUP, learning_rate=1e-3, lr_scheduler="linear")
    loaded: list[weakref.ref] = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def watched(cls, *args, **kwargs):
        model = real(cls, *args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    run_dir = tmp_path_factory.mktemp("trainer-run")
    mp = pytest.MonkeyPatch()
    mp.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(watched))
    gc.collect()
    gc.disable()  # only train_lora's own collection may free reference cycles
    try:
        result = train_lora(str(stand_in.model), _examples(6), [], params, run_dir, device="cpu", console=False)
        alive_after_return = [ref() is not None for ref in loaded]
    finally:
        gc.enable()
        mp.undo()
    return result, run_dir, alive_after_return, params


def test_warm_up_ramps_the_learning_rate_over_the_intended_steps(trained):
    result, run_dir, _, params = trained
    checkpoint = last_checkpoint(run_dir / "checkpoints")
    assert result.steps == STEPS and checkpoint_step(checkpoint) == STEPS
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    lr = {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}  # rate step N used
    peak = params.learning_rate
    assert [lr[1], lr[2], lr[3]] == pytest.approx([0.0, peak / 3, 2 * peak / 3])  # linear warm-up over 3 steps
    assert lr[4] == pytest.approx(peak) and max(lr.values()) == pytest.approx(peak)
    assert lr[STEPS] < lr[5] < peak  # then the linear decay


def test_training_arguments_warm_up_steps_and_old_transformers_is_refused(tmp_path, monkeypatch):
    import transformers

    args = training_arguments(TrainParams(max_steps=200), tmp_path, cuda=False)
    assert args.get_warmup_steps(200) == 10  # the default 5% of 200 optimizer steps
    assert training_arguments(TrainParams(warmup_ratio=0.0), tmp_path, cuda=False).get_warmup_steps(200) == 0
    with pytest.raises(ValueError):
        TrainParams(warmup_ratio=1.0)  # would mean one step, not "all of them"
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(ConfigError, match="transformers>=5.0"):
        training_arguments(TrainParams(), tmp_path, cuda=False)


def test_train_lora_holds_no_model_once_it_returns(trained):
    _, _, alive_after_return, _ = trained
    assert alive_after_return == [False]  # freed before any validation worker could start


def test_the_validation_worker_process_gets_the_gpu_memory_share(stand_in, adapter_store, tmp_path):
    worker = LocalWorker(str(stand_in.model), str(stand_in.codec), adapter_store, max_lora_rank=32,
                         log=tmp_path / "validation-worker.log", gpu_memory_utilization=0.42)
    with worker:
        environ = Path(f"/proc/{worker.process.proc.pid}/environ").read_bytes().split(b"\0")
        assert f"{WORKER_GPU_MEMORY_ENV}=0.42".encode() in environ
        assert worker.process.health()["status"] == "ok"
    assert worker.process.proc.poll() is not None
