"""The word problem of the alternating group A5 (even permutations of 5 points, 60 elements).

Token ``i`` is the permutation ``a5_elements()[i]`` (a tuple ``g`` with ``g[x]`` the image of
point ``x``), listed in lexicographic order, so token 0 is the identity. Products compose right to
left as functions: ``(g * h)[x] = g[h[x]]``. The target at position ``t`` is the running product
``g_0 * g_1 * ... * g_t`` of the inputs so far. A5 is the smallest non-solvable group, so this
task cannot be solved by a fixed-depth network of "solvable" layers (diagonal linear
recurrences, softmax attention) at every length (Merrill et al., "The illusion of state", 2024).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from kalmanscan.tasks._common import as_batch, check_int, rng_for

A5_ORDER = 60


def _parity(perm) -> int:
    inversions = sum(
        1 for i in range(len(perm)) for j in range(i + 1, len(perm)) if perm[i] > perm[j]
    )
    return inversions % 2


@functools.lru_cache(maxsize=1)
def a5_elements() -> tuple:
    """The 60 even permutations of ``(0, 1, 2, 3, 4)`` in lexicographic order (index 0: identity).

    >>> len(a5_elements()), a5_elements()[0]
    (60, (0, 1, 2, 3, 4))
    """
    return tuple(p for p in itertools.permutations(range(5)) if _parity(p) == 0)


@functools.lru_cache(maxsize=1)
def _table() -> np.ndarray:
    elems = a5_elements()
    index = {p: i for i, p in enumerate(elems)}
    table = np.empty((A5_ORDER, A5_ORDER), np.int64)
    for i, g in enumerate(elems):
        for j, h in enumerate(elems):
            table[i, j] = index[tuple(g[h[x]] for x in range(5))]
    return table


def a5_table() -> np.ndarray:
    """Multiplication table ``[60, 60]``: ``table[i, j]`` is the index of ``elems[i] * elems[j]``.

    >>> t = a5_table()
    >>> int(t[0, 7]), int(t[7, 0])
    (7, 7)
    """
    return _table().copy()


def a5_word_problem(n: int, length: int, *, seed: int = 0):
    """``n`` random words of ``length`` A5 elements and their running products.

    Returns a :class:`~kalmanscan.tasks.TaskBatch` with ``inputs, targets [n, length]`` in
    ``[0, 60)``; ``targets[:, t]`` is the product of ``inputs[:, :t+1]`` (every position counts).

    >>> b = a5_word_problem(3, 5, seed=0)
    >>> bool((b.targets[:, 0] == b.inputs[:, 0]).all())
    True
    """
    n = check_int("n", n, 1)
    length = check_int("length", length, 1)
    rng = rng_for(seed)
    table = _table()
    inputs = rng.integers(0, A5_ORDER, size=(n, length))
    targets = np.empty_like(inputs)
    acc = inputs[:, 0]
    targets[:, 0] = acc
    for t in range(1, length):
        acc = table[acc, inputs[:, t]]
        targets[:, t] = acc
    return as_batch(inputs, targets, A5_ORDER)
