"""Seeded task generators: shapes, determinism, and targets checked against independent truths."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kalmanscan.tasks import (
    IGNORE,
    TASKS,
    a5_elements,
    a5_table,
    a5_word_problem,
    fuzzy_recall,
    make_task,
    mqar,
    selective_copy,
)

# name -> (kwargs at an awkward length, kwargs at a long length)
CASES = {
    "a5": ({"length": 1}, {"length": 1000}),
    "mqar": (
        {"length": 63, "num_kv_pairs": 5, "vocab_size": 64},
        {"length": 1000, "num_kv_pairs": 64},
    ),
    "selective_copy": (
        {"length": 63, "num_tokens_to_copy": 7},
        {"length": 1000, "num_tokens_to_copy": 16},
    ),
    "fuzzy_recall": ({"length": 63}, {"length": 1000}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("which", [0, 1], ids=["short", "long"])
def test_shapes_dtypes_and_determinism(name, which):
    kwargs = CASES[name][which]
    n = 5 if which == 0 else 3
    a = make_task(name, n, seed=7, **kwargs)
    b = make_task(name, n, seed=7, **kwargs)
    c = make_task(name, n, seed=8, **kwargs)
    L = kwargs["length"]
    assert a.inputs.shape == a.targets.shape == (n, L)
    assert a.inputs.dtype == a.targets.dtype == torch.int64
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    if L > 1:
        assert not torch.equal(a.inputs, c.inputs)
    assert int(a.inputs.min()) >= 0 and int(a.inputs.max()) < a.vocab_size
    asked = a.targets[a.targets != IGNORE]
    assert asked.numel() > 0
    assert int(asked.min()) >= 0 and int(asked.max()) < a.vocab_size


def test_registry_and_bad_names():
    assert set(TASKS) == {"a5", "mqar", "selective_copy", "fuzzy_recall"}
    with pytest.raises(ValueError, match="name: expected one of"):
        make_task("copy", 2, length=10)


def _compose(g, h):
    return tuple(g[h[x]] for x in range(5))


def test_a5_group_structure():
    elems = a5_elements()
    assert len(elems) == 60 == len(set(elems))
    assert elems[0] == (0, 1, 2, 3, 4)
    even = [
        p
        for p in itertools.permutations(range(5))
        if sum(p[i] > p[j] for i in range(5) for j in range(i + 1, 5)) % 2 == 0
    ]
    assert sorted(elems) == sorted(even)
    table = a5_table()
    for row in table:  # Latin square: the table of a group
        assert sorted(row) == list(range(60))
    for col in table.T:
        assert sorted(col) == list(range(60))
    assert not (table == table.T).all()  # non-abelian


def test_a5_targets_are_running_products():
    batch = a5_word_problem(16, 37, seed=3)
    elems = a5_elements()
    for row in range(16):
        acc = (0, 1, 2, 3, 4)
        for t in range(37):
            acc = _compose(acc, elems[int(batch.inputs[row, t])])
            assert elems[int(batch.targets[row, t])] == acc


def test_a5_inputs_cover_the_group():
    batch = a5_word_problem(200, 20, seed=0)
    assert set(batch.inputs.unique().tolist()) == set(range(60))


def test_mqar_targets_are_the_values_of_the_queried_keys():
    K, L, V = 8, 63, 64
    batch = mqar(20, length=L, num_kv_pairs=K, vocab_size=V, seed=11)
    for row in range(20):
        x, y = batch.inputs[row].tolist(), batch.targets[row].tolist()
        keys, values = x[0 : 2 * K : 2], x[1 : 2 * K : 2]
        assert len(set(keys)) == K and all(1 <= k < V // 2 for k in keys)
        assert all(V // 2 <= v < V for v in values)
        table = dict(zip(keys, values, strict=True))
        asked = [t for t in range(L) if y[t] != IGNORE]
        assert len(asked) == K and all(t >= 2 * K for t in asked)
        assert sorted(x[t] for t in asked) == sorted(keys)  # each key queried once
        for t in asked:
            assert y[t] == table[x[t]]
        assert all(x[t] == 0 for t in range(2 * K, L) if t not in asked)


def test_selective_copy_targets_are_the_tokens_in_order():
    L, C, V = 63, 7, 16
    batch = selective_copy(20, length=L, num_tokens_to_copy=C, vocab_size=V, seed=5)
    for row in range(20):
        x, y = batch.inputs[row].tolist(), batch.targets[row].tolist()
        body = x[: L - C - 1]
        content = [tok for tok in body if tok != V - 2]
        assert len(content) == C and all(tok < V - 2 for tok in content)
        assert x[L - C - 1] == V - 1 and x[L - C :] == [V - 2] * C
        assert y[L - C :] == content and all(t == IGNORE for t in y[: L - C])


def test_fuzzy_recall_targets_repeat_an_earlier_key_value_pair():
    V = 16
    batch = fuzzy_recall(30, length=128, vocab_size=V, seed=2)
    half = (V - 1) // 2
    for row in range(30):
        x, y = batch.inputs[row].tolist(), batch.targets[row].tolist()
        asked = [t for t in range(128) if y[t] != IGNORE]
        assert asked, "every sequence asks at least the final probe"
        assert asked[-1] == 127  # the probe's last value token is the very next token
        for t in asked:
            assert half <= y[t] < V - 1  # value tokens
            if t + 1 < 128:
                assert x[t + 1] == y[t]  # next-token convention
        # the final probe: the tokens before the last value run occurred earlier in the row
        # followed by the same value tokens (the planted copy)
        run_end = 127
        start = run_end
        while start - 1 >= 0 and y[start - 1] != IGNORE:
            start -= 1
        value = y[start : run_end + 1]
        key_end = start  # x[start] is the last key token
        key_start = key_end
        while key_start - 1 >= 0 and x[key_start - 1] < half:
            key_start -= 1
        key = x[key_start : key_end + 1]
        stream = x[:key_start]
        found = any(
            stream[i : i + len(key) + len(value)] == key + value
            for i in range(len(stream) - len(key) - len(value) + 1)
        )
        assert found, (row, key, value)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: a5_word_problem(0, 5), "n: expected an int >= 1"),
        (lambda: a5_word_problem(2, 0), "length: expected an int >= 1"),
        (lambda: a5_word_problem(2, 5, seed=-1), "seed: expected an int >= 0"),
        (lambda: a5_word_problem(2, 5.0), "length: expected an int"),
        (lambda: mqar(2, length=10, num_kv_pairs=4), "length: expected >= 3 \\* num_kv_pairs"),
        (lambda: mqar(2, length=100, num_kv_pairs=40, vocab_size=64), "num_kv_pairs: expected <="),
        (lambda: selective_copy(2, length=10, num_tokens_to_copy=5), "length: expected >= 2"),
        (lambda: selective_copy(2, vocab_size=2), "vocab_size: expected an int >= 3"),
        (lambda: fuzzy_recall(2, k_motif_size=9), "k_motif_size, v_motif_size"),
        (lambda: fuzzy_recall(2, length=8), "length: expected >= 2"),
    ],
    ids=[
        "a5-n0",
        "a5-L0",
        "a5-seed",
        "a5-float",
        "mqar-short",
        "mqar-keys",
        "copy-short",
        "copy-vocab",
        "fuzzy-motif",
        "fuzzy-short",
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a5_table_is_a_copy():
    t = a5_table()
    t[0, 0] = 59
    assert a5_table()[0, 0] == 0
    assert np.array_equal(a5_table()[0], np.arange(60))
