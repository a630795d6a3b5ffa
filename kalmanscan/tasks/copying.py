"""Selective copying (MAD, Poli et al. 2024): copy the non-blank tokens, in order, after a marker.

Token layout for ``vocab_size = V``: content tokens ``[0, V-2)``, blank ``V-2``, copy marker
``V-1``. A sequence of ``length = L`` holds ``num_tokens_to_copy = C`` random content tokens at
random (sorted, distinct) positions among blanks in its first ``L-C-1`` slots, then the marker,
then ``C`` blanks; the targets are the ``C`` tokens in order at those last ``C`` positions.
"""

from __future__ import annotations

import numpy as np

from kalmanscan.tasks._common import IGNORE, as_batch, check_int, rng_for


def selective_copy(
    n: int, length: int = 256, num_tokens_to_copy: int = 16, vocab_size: int = 16, *, seed: int = 0
):
    """``n`` selective-copy sequences (MAD defaults: length 256, 16 tokens, vocabulary 16).

    Returns a :class:`~kalmanscan.tasks.TaskBatch`: ``inputs, targets [n, length]``; only the
    last ``num_tokens_to_copy`` positions have targets.

    >>> b = selective_copy(2, length=12, num_tokens_to_copy=3, vocab_size=6, seed=0)
    >>> b.inputs.shape, int((b.targets != -100).sum())
    (torch.Size([2, 12]), 6)
    """
    n = check_int("n", n, 1)
    C = check_int("num_tokens_to_copy", num_tokens_to_copy, 1)
    V = check_int("vocab_size", vocab_size, 3)
    L = check_int("length", length, 1)
    if L < 2 * C + 1:
        raise ValueError(f"length: expected >= 2 * num_tokens_to_copy + 1 = {2 * C + 1}, got {L}")
    rng = rng_for(seed)
    blank, marker = V - 2, V - 1
    body = L - C - 1
    tokens = rng.integers(0, V - 2, size=(n, C))
    slots = np.sort(rng.random((n, body)).argsort(axis=1)[:, :C], axis=1)
    inputs = np.full((n, L), blank, np.int64)
    np.put_along_axis(inputs, slots, tokens, axis=1)
    inputs[:, body] = marker
    targets = np.full((n, L), IGNORE, np.int64)
    targets[:, body + 1 :] = tokens
    return as_batch(inputs, targets, V)
