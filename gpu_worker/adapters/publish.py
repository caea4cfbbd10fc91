"""Making a voice visible only when complete: copy into a hidden staging directory on the same
filesystem, fsync, then one ``rename(2)`` (or one atomic exchange for a replacement)."""

from __future__ import annotations

import ctypes
import os
import shutil
import uuid
from pathlib import Path

from gpu_worker.adapters.layout import SERVED_FILES, STAGING_DIR
from gpu_worker.adapters.validation import AdapterInfo, validate_adapter
from hashring.records import shown_voice_id, valid_voice_id

__all__ = ["fsync_path", "publish_adapter", "swap_in"]


def publish_adapter(src_dir: Path, store_root: Path, voice_id: str, *, max_rank: int = 64,
                    base_model: str | None = None, replace: bool = False) -> AdapterInfo:
    """Validate ``src_dir`` and make it voice ``voice_id`` in a local store, atomically.

    The served files are copied into ``<store>/.staging/<random>/`` (same filesystem), fsynced,
    then renamed to ``<store>/<voice id>`` in one step: a worker sees the whole adapter or nothing.
    An existing voice is left alone (FileExistsError) unless ``replace``; a replacement is swapped
    in with one ``renameat2(RENAME_EXCHANGE)`` where the kernel has it, else two renames.
    """
    if not valid_voice_id(voice_id):
        raise ValueError(f"voice id {shown_voice_id(voice_id)} is invalid (letters, digits, '._-', optional 'tenant/')")
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
                fsync_path(staging / name)
        fsync_path(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            swap_in(staging, target)
        else:
            os.rename(staging, target)
        fsync_path(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return validate_adapter(target, voice_id=voice_id, max_rank=max_rank, base_model=base_model)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_in(new: Path, target: Path) -> None:
    """Exchange directories ``new`` and ``target``: afterwards ``new`` holds the old version, for the
    caller to remove."""
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
