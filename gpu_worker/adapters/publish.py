"""Making a voice visible only when complete: copy into a hidden staging directory on the same
filesystem, fsync, then one ``rename(2)`` (or one atomic exchange for a replacement)."""

from __future__ import annotations

import ctypes
import os
import shutil
import uuid
from pathlib import Path

from gpu_worker.adapters.layout import (REPORT_AUDIO, REPORT_AUDIO_FILE, REPORT_AUDIO_MAX_FILES, SERVED_FILES,
                                        STAGING_DIR, report_audio_kept)
from gpu_worker.adapters.validation import AdapterInfo, validate_adapter
from hashring.records import shown_voice_id, valid_voice_id

__all__ = ["fsync_path", "publish_adapter", "report_audio", "swap_in"]


def publish_adapter(src_dir: Path, store_root: Path, voice_id: str, *, max_rank: int = 64,
                    base_model: str | None = None, replace: bool = False) -> AdapterInfo:
    """Validate ``src_dir`` and make it voice ``voice_id`` in a local store, atomically.

    The served files (and the clone report's samples, `report_audio`) are copied into
    ``<store>/.staging/<random>/`` (same filesystem), fsynced, then renamed to ``<store>/<voice id>``
    in one step: a worker sees the whole adapter or nothing.
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
        samples = report_audio(Path(src_dir))
        if samples:
            (staging / REPORT_AUDIO).mkdir()
            for sample in samples:
                shutil.copyfile(sample, staging / REPORT_AUDIO / sample.name)
                fsync_path(staging / REPORT_AUDIO / sample.name)
            fsync_path(staging / REPORT_AUDIO)
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


def report_audio(adapter_dir: Path) -> list[Path]:
    """The clone report's sample files in an adapter directory that a publish keeps: plain files
    named like REPORT_AUDIO_FILE, the first by name that `report_audio_kept` allows (anything else there is left behind)."""
    folder = adapter_dir / REPORT_AUDIO
    if not folder.is_dir() or folder.is_symlink():
        return []
    kept = []
    for entry in sorted(folder.iterdir()):
        if len(kept) == REPORT_AUDIO_MAX_FILES:
            break
        if (REPORT_AUDIO_FILE.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink()
                and report_audio_kept(len(kept), entry.stat().st_size)):
            kept.append(entry)
    return kept


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
