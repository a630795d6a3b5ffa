"""Associative-recall tasks: multi-query associative recall (MQAR, Zoology) and MAD's fuzzy
in-context recall.

MQAR (``vocab_size = V``, ``num_kv_pairs = K``): token 0 is filler, keys come from
``[1, V//2)`` (distinct within a sequence), values from ``[V//2, V)``. The first ``2K`` tokens
are the pairs ``k_1 v_1 ... k_K v_K``; every key is then queried once, at distinct random
positions of the remaining ``L - 2K`` filler slots, and the target at a query is its value.

Fuzzy recall (``vocab_size = V``): keys are motifs of 1..``k_motif_size`` distinct tokens from
``[0, (V-1)//2)``, values motifs of 1..``v_motif_size`` distinct tokens from
``[(V-1)//2, V-1)``, and ``V-1`` is the left padding. The sequence is a stream of key/value
motif pairs; a key that reappears keeps its value, and each token of a value whose key was seen
before is a target (asked one position early, as next-token prediction). One probe pair is
planted inside the stream and repeated at the very end, so every sequence asks something.
"""

from __future__ import annotations

import numpy as np

from kalmanscan.tasks._common import IGNORE, as_batch, check_int, rng_for


def mqar(
    n: int, length: int = 256, num_kv_pairs: int = 16, vocab_size: int = 256, *, seed: int = 0
):
    """``n`` multi-query associative-recall sequences.

    Returns a :class:`~kalmanscan.tasks.TaskBatch`: ``inputs, targets [n, length]`` with exactly
    ``num_kv_pairs`` targets per row (the queried values).

    >>> b = mqar(2, length=16, num_kv_pairs=4, vocab_size=32, seed=0)
    >>> int((b.targets != -100).sum(dim=1)[0])
    4
    """
    n = check_int("n", n, 1)
    K = check_int("num_kv_pairs", num_kv_pairs, 1)
    V = check_int("vocab_size", vocab_size, 4)
    L = check_int("length", length, 1)
    if V // 2 - 1 < K:
        raise ValueError(
            f"num_kv_pairs: expected <= vocab_size // 2 - 1 = {V // 2 - 1} distinct keys, got {K}"
        )
    if L < 3 * K:
        raise ValueError(f"length: expected >= 3 * num_kv_pairs = {3 * K}, got {L}")
    rng = rng_for(seed)
    keys = 1 + rng.random((n, V // 2 - 1)).argsort(axis=1)[:, :K]
    values = rng.integers(V // 2, V, size=(n, K))
    inputs = np.zeros((n, L), np.int64)
    inputs[:, 0 : 2 * K : 2] = keys
    inputs[:, 1 : 2 * K : 2] = values
    slots = 2 * K + rng.random((n, L - 2 * K)).argsort(axis=1)[:, :K]
    order = rng.random((n, K)).argsort(axis=1)  # which pair each query slot asks for
    np.put_along_axis(inputs, slots, np.take_along_axis(keys, order, axis=1), axis=1)
    targets = np.full((n, L), IGNORE, np.int64)
    np.put_along_axis(targets, slots, np.take_along_axis(values, order, axis=1), axis=1)
    return as_batch(inputs, targets, V)


def _motifs(vocab, max_size):
    """All motifs (ordered tuples of distinct tokens) of each size 1..max_size."""
    import itertools

    tokens = [int(x) for x in vocab]
    return [None] + [list(itertools.permutations(tokens, size)) for size in range(1, max_size + 1)]


def fuzzy_recall(
    n: int,
    length: int = 128,
    vocab_size: int = 16,
    k_motif_size: int = 3,
    v_motif_size: int = 3,
    *,
    seed: int = 0,
):
    """``n`` fuzzy in-context-recall sequences (MAD defaults: length 128, vocabulary 16, motifs 3).

    Returns a :class:`~kalmanscan.tasks.TaskBatch`: ``inputs, targets [n, length]``; targets are
    value tokens of keys already seen, at the position just before each such token.

    >>> b = fuzzy_recall(2, length=32, seed=0)
    >>> bool(((b.targets == -100) | (b.targets >= 7)).all())
    True
    """
    n = check_int("n", n, 1)
    V = check_int("vocab_size", vocab_size, 5)
    km = check_int("k_motif_size", k_motif_size, 1)
    vm = check_int("v_motif_size", v_motif_size, 1)
    L = check_int("length", length, 1)
    half = (V - 1) // 2
    key_vocab, value_vocab = np.arange(half), np.arange(half, V - 1)
    if km > len(key_vocab) or vm > len(value_vocab):
        raise ValueError(
            f"k_motif_size, v_motif_size: expected <= {len(key_vocab)} and <= {len(value_vocab)} "
            f"(distinct tokens per motif from a vocabulary of {V}), got {km} and {vm}"
        )
    if L < 2 * (km + vm):
        raise ValueError(
            f"length: expected >= 2 * (k_motif_size + v_motif_size) = {2 * (km + vm)}, got {L}"
        )
    rng = rng_for(seed)
    pad = V - 1
    keys, values = _motifs(key_vocab, km), _motifs(value_vocab, vm)
    inputs = np.full((n, L + 1), pad, np.int64)
    marks = np.zeros((n, L + 1), bool)  # token is a value token of a key seen before
    P = L // 2 + 2  # more pairs than fit in a row
    k_size = rng.integers(1, km + 1, size=(n, P + 1)).tolist()
    v_size = rng.integers(1, vm + 1, size=(n, P + 1)).tolist()
    k_pick = rng.random((n, P + 1)).tolist()
    v_pick = rng.random((n, P + 1)).tolist()
    probe_pick = rng.random(n).tolist()
    for row in range(n):
        ks, vs, kp, vp = k_size[row], v_size[row], k_pick[row], v_pick[row]
        probe_k = keys[ks[P]][int(kp[P] * len(keys[ks[P]]))]
        probe_v = values[vs[P]][int(vp[P] * len(values[vs[P]]))]
        budget = L + 1 - len(probe_k) - len(probe_v)
        probe_at = int(probe_pick[row] * max(1, budget - 2 * (km + vm)))
        kv, toks, mk = {probe_k: probe_v}, [], []
        seen, planted, i = set(), False, 0
        while len(toks) < budget - (km + vm):
            if not planted and len(toks) >= probe_at:
                k, planted = probe_k, True
            else:
                k = keys[ks[i]][int(kp[i] * len(keys[ks[i]]))]
            if k not in kv:
                kv[k] = values[vs[i]][int(vp[i] * len(values[vs[i]]))]
            v = kv[k]
            toks += list(k) + list(v)
            mk += [False] * len(k) + [k in seen] * len(v)
            seen.add(k)
            planted = planted or k == probe_k
            i += 1
        toks += list(probe_k) + list(probe_v)
        mk += [False] * len(probe_k) + [True] * len(probe_v)
        inputs[row, L + 1 - len(toks) :] = toks
        marks[row, L + 1 - len(toks) :] = mk
    targets = np.where(marks[:, 1:], inputs[:, 1:], IGNORE)
    return as_batch(inputs[:, :-1], targets, V)
