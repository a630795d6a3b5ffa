"""Seeded synthetic sequence tasks for probing what a sequence mixer can express.

Every generator returns a :class:`TaskBatch` of integer ``inputs [N, L]`` and ``targets [N, L]``
(``torch.int64``, CPU). ``targets[n, t]`` is the token the model must emit after reading
``inputs[n, :t+1]``, or :data:`IGNORE` (-100, the default ``ignore_index`` of
``torch.nn.functional.cross_entropy``) where nothing is asked. The same arguments and ``seed``
give the same tensors on every machine (numpy ``default_rng``).

- :func:`a5_word_problem`: running product of random elements of the alternating group A5
  (state tracking; every position is a target).
- :func:`mqar`: multi-query associative recall (key/value pairs, then queried keys).
- :func:`selective_copy`: MAD selective copying (tokens scattered among blanks, copy them in
  order after a copy marker).
- :func:`fuzzy_recall`: MAD fuzzy in-context recall (keys and values are 1..k-token motifs).

>>> from kalmanscan.tasks import a5_word_problem
>>> batch = a5_word_problem(4, 10, seed=0)
>>> tuple(batch.inputs.shape), batch.vocab_size
((4, 10), 60)

``make_task(name, n, seed=..., **params)`` dispatches by name (see :data:`TASKS`).
"""

from kalmanscan.tasks._common import IGNORE, TaskBatch
from kalmanscan.tasks.a5 import A5_ORDER, a5_elements, a5_table, a5_word_problem
from kalmanscan.tasks.copying import selective_copy
from kalmanscan.tasks.recall import fuzzy_recall, mqar

# name -> generator; each takes (n, ..., seed=...) and returns a TaskBatch.
TASKS = {
    "a5": a5_word_problem,
    "mqar": mqar,
    "selective_copy": selective_copy,
    "fuzzy_recall": fuzzy_recall,
}


def make_task(name: str, n: int, **params) -> TaskBatch:
    """``TASKS[name](n, **params)``; unknown names raise ValueError listing the known ones.

    >>> make_task("selective_copy", 2, length=40, num_tokens_to_copy=4, seed=1).inputs.shape
    torch.Size([2, 40])
    """
    if name not in TASKS:
        raise ValueError(f"name: expected one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name](n, **params)


__all__ = [
    "A5_ORDER",
    "IGNORE",
    "TASKS",
    "TaskBatch",
    "a5_elements",
    "a5_table",
    "a5_word_problem",
    "fuzzy_recall",
    "make_task",
    "mqar",
    "selective_copy",
]
