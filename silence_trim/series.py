"""A growing 1-D float array: appended to in pieces, read whole."""

from __future__ import annotations

import numpy as np


class Series:
    """Values appended chunk by chunk; `values` concatenates them once per change."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._whole = np.zeros(0)

    def extend(self, values: np.ndarray) -> None:
        if values.size:
            self._parts.append(values)

    @property
    def values(self) -> np.ndarray:
        if self._parts:
            self._whole = np.concatenate([self._whole, *self._parts])
            self._parts.clear()
        return self._whole

    def __len__(self) -> int:
        return self._whole.size + sum(p.size for p in self._parts)
