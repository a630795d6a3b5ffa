"""Host reads per call of the ``sequential`` and ``torch`` backends on ordinary models.

A read of a tensor's value (``bool(t)``, ``int(t)``, ``t.item()``, ``nonzero``) is a
synchronization on a GPU and Python overhead on the CPU. The extreme-variance work (held
triples, steps.normalize; the update's scaled products, steps.observe) had added its tests as
reads: about four a step on ``sequential`` (405 a filter call at T = 100, 802 a smoother's) and
eight to ten a call on ``torch`` (17 a filter call, 27 a smoother's). The steps now run without
them and ask once per call (``sequential``), or the tests are read with the call's others
(``torch``).

Bounds: the reads a call took before that work (3d8d7d2: ``sequential`` 2, the API's own, its
prior and its flags; ``torch`` 9 a filter call, 14 to 17 a smoother's), ``sequential`` one
more (its per-call test, kalmanscan/core/sequential.py); and none that grows with T.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kalmanscan as ks

_READS = ("_local_scalar_dense", "nonzero", "equal")  # (bool, int, item: _local_scalar_dense)

BOUND = {
    "sequential": {"filter": 3, "smooth": 3, "loglik+grad": 3, "smooth+grad": 3},
    "torch": {"filter": 9, "smooth": 17, "loglik+grad": 9, "smooth+grad": 17},
}
KINDS = ("filter", "smooth", "loglik+grad", "smooth+grad")


class _Count(TorchDispatchMode):
    """Counts the operators that read a tensor's value on the host."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _READS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def _model(which, T, dtype):
    """``plain``: scalars but ``obs_var`` per lane, a diffuse prior (tools' count_reads
    model); ``arrays``: every input an array (per step, lane or both), a fifth of ``z``
    missing but the last step, process variances above 1 (the torch scan's lane unit), a proper
    prior."""
    rng = np.random.default_rng(3)
    N = 4
    z = rng.normal(size=(T, N)).cumsum(0)
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    if which == "plain":
        return t(z), dict(obs_var=t(np.full(N, 0.5)), decay=0.95, process_var=0.1)
    z[:-1][rng.random((T - 1, N)) < 0.2] = np.nan  # (the last step observed at every T)
    return t(z), dict(
        obs_var=t(np.exp(rng.normal(size=(T, N)))),
        decay=t(rng.uniform(0.5, 1.0, N)),
        process_var=t(np.exp(rng.normal(1.0, 1.0, (T, 1)))),
        loading=t(rng.uniform(0.5, 2.0, (1, N))),
        offset=t(rng.normal(size=N)),
        prior_mean=t(rng.normal(size=N)),
        prior_var=t(np.exp(rng.normal(size=N))),
    )


def _reads(backend, kind, which, T, dtype):
    """Host reads of one call (after one call to warm caches), gradients included."""
    z, kw = _model(which, T, dtype)

    def call():
        if kind == "filter":
            return ks.filter(z, backend=backend, **kw).mean
        if kind == "smooth":
            return ks.smooth(z, backend=backend, **kw).mean
        leaves = {k: torch.as_tensor(v, dtype=dtype).clone().requires_grad_(True)
                  for k, v in kw.items()}  # fmt: skip
        if kind == "loglik+grad":
            out = ks.loglik(z, backend=backend, **leaves).sum()
        else:
            out = ks.smooth(z, backend=backend, **leaves).mean.nansum()
        return torch.autograd.grad(out, list(leaves.values()))

    call()
    count = _Count()
    with count:
        got = call()
    assert got is not None
    return count.n


CASES = [(b, k, w, dt) for b in BOUND for k in KINDS
         for w, dt in (("plain", torch.float64), ("arrays", torch.float32))]  # fmt: skip


@pytest.mark.parametrize("backend, kind, which, dtype", CASES,
                         ids=[f"{b}-{k}-{w}-{str(dt)[6:]}" for b, k, w, dt in CASES])  # fmt: skip
def test_host_reads_per_call_are_few_and_do_not_grow_with_T(backend, kind, which, dtype):
    """At most the bound, and the same at T = 8 as at T = 40 (none a step)."""
    long = _reads(backend, kind, which, 40, dtype)
    short = _reads(backend, kind, which, 8, dtype)
    assert long <= BOUND[backend][kind], (backend, kind, which, long)
    assert long == short, (backend, kind, which, short, long)


def test_an_extreme_call_still_takes_the_tests():
    """The per-call test sends a call that holds a triple (a prior variance of 1e300 on data
    of 1e200) through the checked steps: the same log-likelihood gradient as the torch
    backend's, finite (NaN before the extreme-variance work), and more reads than the bound."""
    z = torch.tensor([1e200, 1.1e200, 0.9e200], dtype=torch.float64)
    grads, counts = [], []
    for backend in BOUND:
        R = torch.tensor(1e300, dtype=torch.float64, requires_grad=True)
        count = _Count()
        with count:
            ll = ks.loglik(z, R, 1.0, 0.0, prior_var=1e300, backend=backend)
            grads.append(torch.autograd.grad(ll, [R])[0])
        counts.append(count.n)
    assert all(torch.isfinite(g) for g in grads), grads
    assert float(grads[0]) == pytest.approx(float(grads[1]), rel=1e-12), grads
    assert counts[0] > BOUND["sequential"]["loglik+grad"], counts
