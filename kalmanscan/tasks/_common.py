"""Shared pieces of the task generators: the result type and argument checks."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

IGNORE = -100  # target value meaning "no prediction asked here"


class TaskBatch(NamedTuple):
    """``inputs, targets [N, L]`` int64 (``targets == IGNORE`` where nothing is asked) and the
    number of distinct input/output token ids ``vocab_size``."""

    inputs: torch.Tensor
    targets: torch.Tensor
    vocab_size: int


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return int(value)


def rng_for(seed) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    return np.random.default_rng(int(seed))


def as_batch(inputs: np.ndarray, targets: np.ndarray, vocab_size: int) -> TaskBatch:
    return TaskBatch(
        torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(targets, dtype=np.int64)),
        int(vocab_size),
    )
