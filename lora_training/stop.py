"""A stop request shared by a job's threads: cancel, or lease lost. Checked between steps."""

from __future__ import annotations

import threading

from lora_training.errors import TrainingError


class Stop:
    """Set once with the error the job should end with; `check()` raises it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._error: TrainingError | None = None
        self._lock = threading.Lock()

    def set(self, error: TrainingError) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
                self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._error is not None:
            raise self._error
