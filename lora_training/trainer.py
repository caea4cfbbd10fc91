"""LoRA training of a voice with peft and the transformers `Trainer`.

The adapter targets the attention and MLP projections (`gpu_worker.adapters.LORA_TARGET_MODULES`,
the set vLLM serves) with rsLoRA scaling; it is never merged and never has `modules_to_save`
(vLLM refuses both). bf16 on CUDA, fp32 on CPU; the seed fixes initialisation, data order and
the held-out split. Checkpoints (adapter, optimiser, scheduler, RNG state) are written every
`save_steps` under `<run>/checkpoints/`; a new call on the same run directory resumes from the
newest one. The finished adapter is written to `<run>/adapter/` (renamed into place) with a
`train-result.json`, so a job that crashes after training does not train again.

Progress: a console bar (tqdm: step, ETA, loss) and an `on_step(step, total, loss)` callback.

Needs transformers >= 5.0: `warmup_steps` below 1 is a ratio of the steps only from 5.0 (older
versions would warm up for 0.05 steps, i.e. not at all, and 5.2 removed `warmup_ratio`), and
`from_pretrained(dtype=...)` needs 4.56. Before a validation worker starts on the same GPU, the
model and Trainer are dropped and the CUDA cache emptied (`train_lora` holds nothing on return).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpu_worker.adapters import LORA_TARGET_MODULES
from gpu_worker.orpheus import PAD
from lora_training.dataset import IGNORE, Example
from lora_training.errors import ConfigError
from lora_training.settings import TrainParams
from lora_training.stop import Stop

OnStep = Callable[[int, int, float | None], None]
RESULT = "train-result.json"
MIN_TRANSFORMERS = "5.0"  # warmup_steps as a ratio (see the module docstring)


@dataclass(frozen=True)
class TrainResult:
    adapter_dir: str
    steps: int
    resumed_from_step: int
    final_train_loss: float | None
    final_eval_loss: float | None
    train_loss_mean: float | None
    train_s: float
    steps_per_s: float
    train_clips: int
    eval_clips: int

    def to_dict(self) -> dict:
        return asdict(self)


def collate(batch: Sequence[Example]) -> dict:
    """Right-pad a batch with PAD; labels IGNORE over prompts and padding."""
    import torch

    longest = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), longest), PAD, dtype=torch.long)  # [B, T]
    labels = torch.full((len(batch), longest), IGNORE, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(batch), longest), dtype=torch.long)  # [B, T]
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels())
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def checkpoint_step(checkpoint: str | Path | None) -> int:
    if checkpoint is None:
        return 0
    state = Path(checkpoint) / "trainer_state.json"
    try:
        return int(json.loads(state.read_text())["global_step"])
    except (OSError, KeyError, ValueError):
        return int(Path(checkpoint).name.rsplit("-", 1)[-1])


def _complete(checkpoint: Path) -> bool:
    """The Trainer writes trainer_state.json last: a checkpoint is whole once it parses."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def last_checkpoint(directory: Path) -> Path | None:
    """Newest complete checkpoint, or None."""
    if not directory.is_dir():
        return None
    return max((p for p in directory.glob("checkpoint-*") if _complete(p)), key=checkpoint_step, default=None)


def load_result(run_dir: Path) -> TrainResult | None:
    try:
        return TrainResult(**json.loads((run_dir / RESULT).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _callbacks(console: bool, on_step: OnStep | None, stop: Stop | None):
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        """Console bar with ETA and loss; reports each step; stops at a step boundary on request."""

        def __init__(self) -> None:
            self.bar = None
            self.loss: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="training", unit="step",
                            disable=not console, dynamic_ncols=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])
                if self.bar is not None:
                    self.bar.set_postfix(loss=f"{self.loss:.3f}")

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)
            if on_step is not None:
                on_step(state.global_step, state.max_steps, self.loss)
            if stop is not None and stop.requested:
                control.should_training_stop = True
                control.should_save = False

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()

    return [Progress()]


def train_lora(
    base_model: str,
    train: Sequence[Example],
    evaluation: Sequence[Example],
    params: TrainParams,
    run_dir: Path,
    *,
    device: str,
    on_step: OnStep | None = None,
    stop: Stop | None = None,
    console: bool = True,
) -> TrainResult:
    """Train (or resume, or return the finished result of) a LoRA in `run_dir`."""
    finished = load_result(run_dir)
    if finished is not None and (Path(finished.adapter_dir) / "adapter_model.safetensors").is_file():
        return finished
    if not train:
        raise ConfigError("no training clips")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PrinterCallback, Trainer, set_seed

    cuda = device == "cuda"
    checkpoints = run_dir / "checkpoints"
    args = training_arguments(params, checkpoints, cuda=cuda)
    set_seed(params.seed)
    model = trainer = None
    try:
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.bfloat16 if cuda else torch.float32)
        model.config.use_cache = False
        lora = LoraConfig(r=params.rank, lora_alpha=params.alpha, use_rslora=params.rslora, lora_dropout=params.dropout,
                          target_modules=list(LORA_TARGET_MODULES), bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
        if params.gradient_checkpointing:
            model.enable_input_require_grads()
        trainer = Trainer(model=model, args=args, train_dataset=list(train), eval_dataset=list(evaluation) or None,
                          data_collator=collate, callbacks=_callbacks(console, on_step, stop))
        trainer.remove_callback(PrinterCallback)
        resume = last_checkpoint(checkpoints)
        started = time.perf_counter()
        output = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        train_s = time.perf_counter() - started
        if stop is not None:
            stop.check()
        eval_loss = float(trainer.evaluate()["eval_loss"]) if evaluation else None
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        adapter_dir = run_dir / "adapter"
        _save_adapter(model, base_model, adapter_dir)
    finally:
        del model, trainer
        release_memory(cuda)
    resumed_from = checkpoint_step(resume)
    result = TrainResult(
        adapter_dir=str(adapter_dir),
        steps=int(output.global_step),
        resumed_from_step=resumed_from,
        final_train_loss=float(losses[-1]) if losses else None,
        final_eval_loss=eval_loss,
        train_loss_mean=float(output.training_loss) if output.training_loss is not None else None,
        train_s=round(train_s, 3),
        steps_per_s=round((output.global_step - resumed_from) / train_s, 4) if train_s > 0 else 0.0,
        train_clips=len(train),
        eval_clips=len(evaluation),
    )
    tmp = run_dir / f".{RESULT}.{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(result.to_dict(), indent=1))
    os.replace(tmp, run_dir / RESULT)
    return result


def training_arguments(params: TrainParams, checkpoints: Path, *, cuda: bool):
    """The Trainer's arguments for a job (transformers >= MIN_TRANSFORMERS, else ConfigError)."""
    import transformers
    from packaging.version import Version
    from transformers import TrainingArguments

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise ConfigError(f"transformers {transformers.__version__} is too old for training: "
                          f"install transformers>={MIN_TRANSFORMERS} (warm-up would silently be ~0 steps)")
    return TrainingArguments(
        output_dir=str(checkpoints),
        num_train_epochs=params.epochs,
        max_steps=params.max_steps,
        per_device_train_batch_size=params.batch_size,
        per_device_eval_batch_size=params.batch_size,
        gradient_accumulation_steps=params.grad_accum,
        learning_rate=params.learning_rate,
        lr_scheduler_type=params.lr_scheduler,
        warmup_steps=params.warmup_ratio,  # < 1: a ratio of the total optimizer steps (transformers >= 5)
        weight_decay=params.weight_decay,
        logging_steps=params.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=params.save_steps,
        save_total_limit=params.keep_checkpoints,
        eval_strategy="no",
        seed=params.seed,
        data_seed=params.seed,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=params.gradient_checkpointing,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_pin_memory=cuda,
    )


def release_memory(cuda: bool) -> None:
    """Collect the dropped model's reference cycles and hand cached CUDA blocks back to the driver."""
    gc.collect()
    if cuda:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _save_adapter(model, base_model: str, adapter_dir: Path) -> None:
    """safetensors + adapter_config.json, pointing at the base model, renamed into place."""
    tmp = adapter_dir.with_name(f".{adapter_dir.name}.{uuid.uuid4().hex[:8]}")
    model.save_pretrained(str(tmp), safe_serialization=True)
    config_path = tmp / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base_model
    if config.get("modules_to_save"):  # peft never adds them for this config; refuse rather than publish one
        raise ConfigError(f"trained adapter has modules_to_save {config['modules_to_save']}: not servable")
    config_path.write_text(json.dumps(config, indent=2))
    (tmp / "README.md").unlink(missing_ok=True)
    if adapter_dir.exists():
        shutil.rmtree(adapter_dir)
    os.rename(tmp, adapter_dir)
