"""Model generators and an independent covariance-form filter/smoother used by the core tests."""

from __future__ import annotations

import math

import numpy as np


def read_only(*values) -> tuple:
    """``values``, every numpy array among them made read only: a reference cached for several
    test cases cannot then be changed by one of them."""
    for v in values:
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return values


_CACHES: dict[str, dict] = {}


def process_cache(name: str) -> dict:
    """A dict for the references named ``name``, one a process: pytest imports a test file as
    a top-level module, and a second file's ``from tests.test_x import ...`` imports it again
    under that name, so a cache kept in the test file itself is two caches; this module is
    imported once (``tests.helpers``)."""
    return _CACHES.setdefault(name, {})


def random_model(rng, T, N, *, missing=0.2, time_varying=True, diffuse=True, offset=True):
    shape = (T, N) if time_varying else (1, N)
    model = dict(
        decay=rng.uniform(-1.05, 1.05, shape),
        process_var=rng.uniform(0.0, 0.5, shape),
        obs_var=rng.uniform(0.05, 2.0, shape),
        loading=rng.uniform(0.3, 1.5, shape) * rng.choice([-1, 1], shape),
        offset=rng.normal(size=shape) if offset else np.zeros(shape),
    )
    model["process_var"][model["decay"] ** 2 < 1e-3] += 0.1
    x = rng.normal(size=N) * 3
    z = np.empty((T, N))
    for t in range(T):
        i = min(t, shape[0] - 1)
        x = (
            model["decay"][i] * x
            + model["offset"][i]
            + rng.normal(size=N) * np.sqrt(model["process_var"][i])
        )
        z[t] = model["loading"][i] * x + rng.normal(size=N) * np.sqrt(model["obs_var"][i])
    z[rng.random((T, N)) < missing] = np.nan
    prior = dict(
        prior_mean=rng.normal(size=N),
        prior_var=np.full(N, np.inf) if diffuse else rng.uniform(0.1, 5, N),
    )
    return z, model, prior


def covariance_filter(
    z,
    obs_var,
    decay,
    process_var,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=math.inf,
):
    """Covariance-form Kalman filter + RTS smoother, one lane at a time, exact diffuse start.

    Returns dict of [T, N] arrays: mean, var, pred_mean, pred_var, smean, svar, and loglik [N].
    """
    z = np.atleast_2d(np.asarray(z, float).T).T
    T, N = z.shape
    b = lambda x: np.broadcast_to(np.asarray(x, float), (T, N))  # noqa: E731
    R, A, Q, H, C = b(obs_var), b(decay), b(process_var), b(loading), b(offset)
    m0 = np.broadcast_to(np.asarray(prior_mean, float), (N,))
    P0 = np.broadcast_to(np.asarray(prior_var, float), (N,))
    out = {k: np.empty((T, N)) for k in ("mean", "var", "pred_mean", "pred_var", "smean", "svar")}
    ll = np.zeros(N)
    for n in range(N):
        m, P = m0[n], P0[n]
        for t in range(T):
            a, q, h, r, c = A[t, n], Q[t, n], H[t, n], R[t, n], C[t, n]
            if a == 0:
                mp, Pp = c, q
            elif math.isinf(P):
                mp, Pp = math.nan, math.inf
            else:
                mp, Pp = a * m + c, a * a * P + q
            out["pred_mean"][t, n], out["pred_var"][t, n] = mp, Pp
            y = z[t, n]
            if math.isnan(y) or math.isinf(r):
                m, P = mp, Pp
            elif math.isinf(Pp):
                m, P = y / h, r / (h * h)
            else:
                S = h * h * Pp + r
                K = Pp * h / S
                ll[n] += -0.5 * (math.log(2 * math.pi * S) + (y - h * mp) ** 2 / S)
                m, P = mp + K * (y - h * mp), (1 - K * h) * Pp
            out["mean"][t, n], out["var"][t, n] = m, P
        ms, Ps = out["mean"][T - 1, n], out["var"][T - 1, n]
        out["smean"][T - 1, n], out["svar"][T - 1, n] = ms, Ps
        for t in range(T - 2, -1, -1):
            a, Pp1, mp1 = A[t + 1, n], out["pred_var"][t + 1, n], out["pred_mean"][t + 1, n]
            m, P = out["mean"][t, n], out["var"][t, n]
            J = a * P / Pp1
            ms = m + J * (ms - mp1)
            Ps = P + J * J * (Ps - Pp1)
            out["smean"][t, n], out["svar"][t, n] = ms, Ps
    out["loglik"] = ll
    return out


def triton_interpreted(kernel) -> bool:
    """True when ``kernel`` (a Triton JIT function) runs in Triton's CPU interpreter."""
    import triton.language.standard as std
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction) and isinstance(std.sum, InterpretedFunction)


def kla_inputs(B, L, M, S, seed=0, forget=False):
    """Seeded float64 inputs of the KLA op (CPU): ``v, Lv [B, L, M]``, ``k, q [B, L, S]``,
    ``decay, process_var [M, S]``, ``lam0, eta0 [B, M, S]``; ``forget`` sets lane (0, 0)'s decay
    to 0 (a lane that forgets everything each step)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def u(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)

    x = dict(
        v=torch.randn(B, L, M, generator=g, dtype=torch.float64),
        Lv=u(B, L, M, lo=0.2, hi=5.0),
        k=torch.randn(B, L, S, generator=g, dtype=torch.float64) / S**0.5,
        q=torch.randn(B, L, S, generator=g, dtype=torch.float64) / S**0.5,
        decay=u(M, S, lo=0.5, hi=1.0),
        process_var=u(M, S, lo=0.001, hi=0.3),
        lam0=u(B, M, S, lo=0.5, hi=2.0),
        eta0=torch.randn(B, M, S, generator=g, dtype=torch.float64),
    )
    if forget:
        x["decay"][0, 0] = 0.0
    return x


def count_dynamics(monkeypatch) -> list:
    """Patch ``KLALayer.dynamics`` to record each call (the calling layer's id) in the returned
    list: how often the layers' discretization is computed rather than reused."""
    from kalmanscan.kla.layer import KLALayer

    calls = []
    original = KLALayer.dynamics

    def counting(self, dtype=None):
        calls.append(id(self))
        return original(self, dtype) if dtype is not None else original(self)

    monkeypatch.setattr(KLALayer, "dynamics", counting)
    return calls


def fit_dask_recorded(da, fix, **options):
    """``da.kalman.fit_ou(fix=fix, **options)`` computed with dask's synchronous scheduler, and
    the texts of its warnings (every one recorded); asserts that the fit of dask data is lazy."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = da.kalman.fit_ou(fix=fix, **options)
        assert bool(ds.chunks) == (da.chunks is not None), "expected a lazy fit of dask data"
        ds = ds.compute(scheduler="synchronous")
    return ds, [str(w.message) for w in caught]


def _limit_precision(cov, big):
    """The dense oracle's filtered precision in the limit: the inverse of the finite block on the
    coordinates whose variance is below ``big`` (above it: kappa's part), 0 along the rest."""
    prec = np.zeros_like(cov)
    for t in range(cov.shape[0]):
        res = np.flatnonzero(np.abs(np.diagonal(cov[t])) < big)
        prec[t][np.ix_(res, res)] = np.linalg.inv(cov[t][np.ix_(res, res)])
    return prec


def check_faded_filter(f, o, tol, big=1e12):
    """A dense filter result ``f`` against the dense oracle's ``o`` (kappa 1e66: an entry above
    ``big`` is kappa's, +-inf in ``f``): the log-likelihood to 1e-10, the finite covariance,
    the mean and the limit precision to ``tol`` of their largest entries."""
    assert abs(float(f.loglik) - o.loglik) <= 1e-10 * abs(o.loglik)
    kappa = np.abs(o.cov) > big
    np.testing.assert_array_equal(np.isposinf(f.cov), kappa & (o.cov > 0))
    np.testing.assert_array_equal(np.isneginf(f.cov), kappa & (o.cov < 0))
    fin = np.where(kappa, 0.0, o.cov)
    assert np.abs(np.where(kappa, 0.0, f.cov) - fin).max() <= tol * np.abs(fin).max()
    assert np.abs(f.mean - o.mean).max() <= tol * max(np.abs(o.mean).max(), 1.0)
    want = _limit_precision(o.cov, big)
    assert np.abs(f.precision - want).max() <= tol * np.abs(want).max()
