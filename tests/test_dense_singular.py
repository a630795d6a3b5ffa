"""Dense outputs where the state covariance is singular: directions known exactly.

The rule (kalmanscan/dense/singular.py, docs/dense.md "Known directions"): covariances and means
exact, the covariance's row and column of a coordinate known exactly 0, and the precision the
entrywise limit of (P + eps I)^-1 -- +-inf where the projector on the known directions is nonzero,
the Moore-Penrose inverse's entry elsewhere (0 across a known coordinate's row and column); every
backend the same. Truth: the mpmath oracle (kalmanscan/validation/oracle.py, 120 digits) for the
means, covariances and log-likelihood, the known directions in closed form per model, and the
precision's finite entries from the oracle's covariance in mpmath.

Before: precision +-1e15..1e16 (rounding residues inverted), NaN or inf, differing by backend
(native NaN/inf/1e15, the scan 4.5e15 where the others gave NaN/inf, the reference -9e15 or inf);
the scan raised torch's LinAlgError for any singular prior covariance (a state known exactly);
native's smoothed covariance at a diffuse step left 7.8e-16 in a level known exactly (precision
1.3e15).
"""

from __future__ import annotations

import functools
import re
import zlib
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

needs_native = pytest.mark.skipif(not native.available(), reason="native extension not built")
BACKENDS = [pytest.param("native", marks=needs_native), "torch", "sequential"]
T = 14


def _e(n, *idx):
    """Projector on the coordinates idx of R^n."""
    P = np.zeros((n, n))
    for i in idx:
        P[i, i] = 1.0
    return P


def _v(*x):
    v = np.asarray(x, dtype=np.float64)
    return np.outer(v, v) / (v @ v)


def _steps(first, rest):
    """[T] list: ``first`` (a list of projectors for the first steps), then ``rest``."""
    return list(first) + [rest] * (T - len(first))


# Each case: model, prior, and per step the closed-form projectors on the known directions
# (filtered, smoothed) and on the diffuse ones (filtered), and what the scan / reference
# smoother refuse (an exact entry meeting no process noise: documented, docs/dense.md).


def _case(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if name == "llt-slope-known":  # statsmodels-like local linear trend, slope_var = 0
        m = kd.local_linear_trend(1.0, 0.0, 2.0)._asdict()
        z = (np.cumsum(rng.normal(size=T)) + 0.5 * np.arange(T))[:, None]
        pr = dict(prior_mean=[0.0, 0.5], prior_cov=np.diag([10.0, 0.0]))
        known = _steps([], _e(2, 1))
        return m, z, pr, known, known, _steps([], np.zeros((2, 2))), ()
    if name == "llt-seasonal4-known":  # zero slope and seasonal variances, both known
        m = kd.add_components(
            kd.local_linear_trend(1.0, 0.0, 2.0), kd.seasonal_dummies(4, 0.0)
        )._asdict()
        z = rng.normal(size=(T, 1)) * 2
        z[5] = np.nan
        pr = dict(prior_mean=[0.0, 0.3, 1.0, -1.0, 0.5], prior_cov=np.diag([10.0, 0, 0, 0, 0]))
        known = _steps([], _e(5, 1, 2, 3, 4))
        return m, z, pr, known, known, _steps([], np.zeros((5, 5))), ()
    if name == "llt-level-exact":  # obs_var = 0: the level is pinned, the slope is not
        m = kd.local_linear_trend(1.0, 0.0, 0.0)._asdict()
        z = np.cumsum(rng.normal(size=T))[:, None]
        known = _steps([], _e(2, 0))
        dif = _steps([_e(2, 1)], np.zeros((2, 2)))
        return m, z, {}, known, known, dif, ()
    if name == "llt-level-exact-from-t5":  # R = 0 from step 5 on only (the kernel's runtime gate)
        m = kd.local_linear_trend(1.0, 0.0, 2.0)._asdict()
        m["R"] = np.where(np.arange(T)[:, None, None] < 5, 2.0, 0.0)
        z = np.cumsum(rng.normal(size=T))[:, None]
        known = _steps([np.zeros((2, 2))] * 5, _e(2, 0))
        dif = _steps([_e(2, 1)], np.zeros((2, 2)))
        return m, z, {}, known, known, dif, ()
    if name == "llt-deterministic-exact":  # a deterministic trend, determined after 2 steps
        m = kd.local_linear_trend(0.0, 0.0, 0.0)._asdict()
        z = (1.0 + 0.5 * np.arange(T))[:, None]
        fk = _steps([_e(2, 0)], np.eye(2))
        dif = _steps([_e(2, 1)], np.zeros((2, 2)))
        return m, z, {}, fk, _steps([], np.eye(2)), dif, ("torch", "smooth-sequential")
    if name == "seasonal4-exact":  # a deterministic seasonal, determined after 3 steps
        m = kd.seasonal_dummies(4, 0.0, 0.0)._asdict()
        z = np.tile([1.0, -2.0, 0.5, 0.5], T)[:T, None]
        fk = _steps([_e(3, 0), _e(3, 0, 1)], np.eye(3))
        dif = _steps([_e(3, 1, 2), _e(3, 2)], np.zeros((3, 3)))
        return m, z, {}, fk, _steps([], np.eye(3)), dif, ("torch", "smooth-sequential")
    if name == "rank1-noise-sum-known":  # x1 + x2 known: rank-1 Q and prior orthogonal to it
        q = np.array([1.0, -1.0])
        m = dict(F=np.array([[0.9, 0.1], [0.1, 0.9]]), Q=0.5 * np.outer(q, q),
                 H=np.array([[1.0, 0.3]]), R=np.array([[1.0]]))  # fmt: skip
        z = rng.normal(size=(T, 1))
        pr = dict(prior_mean=[1.0, 2.0], prior_cov=2.0 * np.outer(q, q))
        known = _steps([], _v(1, 1))
        return m, z, pr, known, known, _steps([], np.zeros((2, 2))), ()
    if name == "exact-entry-pins-sum":  # an entry with R = 0 pins x1 + x2 of three states
        m = dict(F=np.eye(3), Q=0.1 * np.eye(3), H=np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]),
                 R=np.diag([0.0, 1.0]))  # fmt: skip
        z = rng.normal(size=(T, 2))
        pr = dict(prior_mean=np.zeros(3), prior_cov=np.eye(3))
        known = _steps([], _v(1, 1, 0))
        return m, z, pr, known, known, _steps([], np.zeros((3, 3))), ()
    if name == "ar1-padded-state":  # SARIMAX-style ARMA(1,1) form with theta = 0: x2 = 0
        m = dict(F=np.array([[0.7, 1.0], [0.0, 0.0]]), Q=np.diag([1.0, 0.0]),
                 H=np.array([[1.0, 0.0]]), R=np.array([[0.5]]))  # fmt: skip
        z = rng.normal(size=(T, 1))
        pr = dict(prior_mean=[0.0, 0.0], prior_cov=np.eye(2))
        known = _steps([], _e(2, 1))
        return m, z, pr, known, known, _steps([], np.zeros((2, 2))), ()
    raise KeyError(name)


CASES = [
    "llt-slope-known",
    "llt-seasonal4-known",
    "llt-level-exact",
    "llt-level-exact-from-t5",
    "llt-deterministic-exact",
    "seasonal4-exact",
    "rank1-noise-sum-known",
    "exact-entry-pins-sum",
    "ar1-padded-state",
]


def _oracle_prior(m, pr):
    n = np.asarray(m["F"]).shape[-1]
    if "prior_cov" not in pr:
        return dict(prior_mean=np.zeros(n), prior_cov=np.diag(np.full(n, np.inf)))
    return dict(prior_mean=np.asarray(pr["prior_mean"], float), prior_cov=pr["prior_cov"])


@functools.cache
def _truth(name):
    m, z, pr, fk, sk, dif, _ = _case(name)
    o = dense_oracle(z, m["F"], m["Q"], m["H"], m["R"], **_oracle_prior(m, pr))
    fprec = np.stack([_limit_precision(o.cov[t], fk[t], dif[t]) for t in range(T)])
    sprec = np.stack([_limit_precision(o.smooth_cov[t], sk[t], 0 * dif[t]) for t in range(T)])
    return o, fprec, sprec


def _limit_precision(P, PiN, PiD, dps=50):
    """lim (P + eps I)^-1 of the finite part outside the diffuse directions PiD: +-inf where the
    known projector PiN is nonzero, else entries of Pf (Pk P Pk)^+ Pf, Pf = I - PiN - PiD,
    in mpmath (the oracle's covariance projected exactly, so its rounding residue in the known
    directions does not enter)."""
    n = P.shape[0]
    with mpmath.workdps(dps):
        mp = lambda a: mpmath.matrix(np.asarray(a, dtype=np.float64).tolist())  # noqa: E731
        Pk = mpmath.eye(n) - mp(PiD)
        Pf = Pk - mp(PiN)
        Pm = mp(np.where(np.isfinite(P), P, 0.0))
        M = Pf * (Pk * Pm * Pk) * Pf + mp(PiN) + mp(PiD)
        fin = Pf * mpmath.inverse(M) * Pf
        out = np.array([[float(fin[i, j]) for j in range(n)] for i in range(n)])
    return np.where(PiN != 0, np.copysign(np.inf, PiN), out)


def _check_precision(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"{what}: inf pattern")
    inf = np.isinf(want)
    np.testing.assert_array_equal(np.sign(got[inf]), np.sign(want[inf]), err_msg=what)
    fin = ~inf
    scale = max(np.abs(want[fin]).max(initial=0.0), 1.0)
    err = np.abs(got[fin] - want[fin]).max(initial=0.0) / scale
    assert err < 1e-9, f"{what}: finite entries {err:.2e} relative off"
    return err


def _run(op, name, backend):
    m, z, pr, *_, refuse = _case(name)
    if backend in refuse or f"{op}-{backend}" in refuse:
        with pytest.raises(ValueError, match="native"):
            getattr(kd, op)(z, **m, **pr, backend=backend)
        pytest.skip(f"{backend} refuses this model ({op}), naming native (documented)")
    return getattr(kd, op)(z, **m, **pr, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_filter_known_directions_against_mpmath(name, backend):
    """Filtered mean, covariance (exact zeros across known coordinates), precision (the rule)
    and log-likelihood against the oracle, every step."""
    res = _run("filter", name, backend)
    o, fprec, _ = _truth(name)
    _, _, _, fk, _, dif, _ = _case(name)
    prop = ~o.diffuse
    np.testing.assert_array_equal(res.diffuse, o.diffuse)
    sd = np.sqrt(np.maximum(np.diagonal(o.cov[prop], axis1=-2, axis2=-1), 1.0))
    assert np.abs(res.mean[prop] - o.mean[prop]).max() / sd.max() < 1e-12
    scale = max(1.0, np.abs(o.cov[prop]).max())
    assert np.abs(res.cov[prop] - o.cov[prop]).max() / scale < 1e-13
    for t in range(T):
        coord = np.diag(fk[t]) == 1.0
        assert (res.cov[t][coord] == 0).all() and (res.cov[t][:, coord] == 0).all(), t
        _check_precision(res.precision[t], fprec[t], f"filtered precision t={t}")
    assert abs(float(res.loglik) - o.loglik) < 1e-12 * max(1.0, abs(o.loglik))
    # one-step predictions where they are proper (the oracle's diffuse ones carry kappa = 1e40)
    ok = np.abs(o.pred_cov).max((-1, -2)) < 1e10
    scale = max(1.0, np.abs(o.pred_cov[ok]).max())
    assert np.abs(res.pred_cov[ok] - o.pred_cov[ok]).max() / scale < 1e-13
    assert np.abs(res.pred_mean[ok] - o.pred_mean[ok]).max() / np.sqrt(scale) < 1e-12
    exact = (np.abs(o.pred_cov) < 1e-300) & ok[:, None, None]
    assert (res.pred_cov[exact] == 0).all()  # a known prediction is exactly 0 too


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_smoother_known_directions_against_mpmath(name, backend):
    """Smoothed mean, covariance and precision against the oracle, every step."""
    res = _run("smooth", name, backend)
    o, _, sprec = _truth(name)
    _, _, _, _, sk, _, _ = _case(name)
    sd = np.sqrt(np.maximum(np.diagonal(o.smooth_cov, axis1=-2, axis2=-1), 1.0))
    assert np.abs(res.mean - o.smooth_mean).max() / sd.max() < 1e-11
    scale = max(1.0, np.abs(o.smooth_cov).max())
    assert np.abs(res.cov - o.smooth_cov).max() / scale < 1e-12
    for t in range(T):
        coord = np.diag(sk[t]) == 1.0
        assert (res.cov[t][coord] == 0).all() and (res.cov[t][:, coord] == 0).all(), t
        _check_precision(res.precision[t], sprec[t], f"smoothed precision t={t}")


@pytest.mark.parametrize("name", CASES)
def test_backends_report_the_same_known_directions(name):
    """Every backend that serves the model gives the same inf pattern and exact zeros."""
    m, z, pr, *_, refuse = _case(name)
    outs = {}
    for b in ("native", "torch", "sequential"):
        if b == "native" and not native.available():
            continue
        if b in refuse or f"smooth-{b}" in refuse:
            continue
        r = kd.smooth(z, **m, **pr, backend=b)
        outs[b] = r
    if len(outs) < 2:
        pytest.skip(f"one backend serves this model here ({', '.join(outs)}): nothing to compare")
    ref = next(iter(outs.values()))
    for b, r in outs.items():
        for a, c in ((r.precision, ref.precision), (r.filtered.precision, ref.filtered.precision)):
            np.testing.assert_array_equal(np.isinf(a), np.isinf(c), err_msg=b)
            np.testing.assert_array_equal(a == 0, c == 0, err_msg=b)
        np.testing.assert_array_equal(r.cov == 0, ref.cov == 0, err_msg=b)


def test_native_smoother_diffuse_step_level_known_exactly():
    """Before: native's smoothed covariance at the diffuse step of a local linear trend with
    obs_var = 0 held 7.8e-16 in the level (known exactly: 0) and its precision 1.3e15."""
    if not native.available():
        pytest.skip("native extension not built")
    m, z, pr, *_ = _case("llt-level-exact")
    r = kd.smooth(z, **m, backend="native")
    assert (r.cov[:, 0, :] == 0).all() and (r.cov[:, :, 0] == 0).all()
    assert np.isinf(r.precision[:, 0, 0]).all() and (r.precision[:, 0, 1] == 0).all()


def test_scan_serves_a_singular_prior_covariance():
    """Before: backend='torch' raised torch's _LinAlgError ('input matrix is singular') for any
    prior covariance with a zero-variance direction: its large-prior check inverted P0."""
    m, z, pr, *_ = _case("llt-slope-known")
    a = kd.filter(z, **m, **pr, backend="torch")
    b = kd.filter(z, **m, **pr, backend="sequential")
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-12)
    m, z, pr, *_ = _case("rank1-noise-sum-known")
    a = kd.smooth(z, **m, **pr, backend="torch")
    b = kd.smooth(z, **m, **pr, backend="sequential")
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", [*BACKENDS, "diagonal"])
def test_diagonal_model_known_state_and_tiny_variance(backend):
    """A diagonal model: state 0 known exactly (prior variance 0, no process noise), state 1
    contracting without process noise (variance 0.25^t, down to 1e-34: a variance, not a known
    state: its own component), state 2 ordinary. Every backend, the diagonal one (the scalar
    core) included: precision inf / 0 for state 0, 1/var (finite, exact) for state 1."""
    n, Tn = 3, 56
    F, Q = np.diag([1.0, 0.5, 0.9]), np.diag([0.0, 0.0, 0.3])
    H, R = np.eye(n), np.diag([1.0, 1.0, 0.5])
    z = np.random.default_rng(3).normal(size=(Tn, n))
    z[:, 1] = np.nan  # state 1 never observed: its variance is 0.25^t exactly
    pr = dict(prior_mean=[1.0, 0.0, 0.0], prior_cov=np.diag([0.0, 1.0, 1.0]))
    r = kd.smooth(z, F, Q, H, R, **pr, backend=backend)
    for res in (r, r.filtered):
        assert (res.cov[:, 0, :] == 0).all() and (res.cov[:, :, 0] == 0).all()
        assert np.isinf(res.precision[:, 0, 0]).all() and (res.precision[:, 0, 1:] == 0).all()
        var1 = 0.25 ** np.arange(1, Tn + 1)
        np.testing.assert_allclose(res.cov[:, 1, 1], var1, rtol=1e-13)
        np.testing.assert_allclose(res.precision[:, 1, 1], 1 / var1, rtol=1e-13)
        assert np.isfinite(res.precision[:, 1:, 1:]).all()
    np.testing.assert_allclose(r.filtered.mean[:, 0], 1.0, rtol=0, atol=0)


def test_ill_conditioned_but_regular_covariance_keeps_its_inverse():
    """A covariance with eigenvalues 2 and 4e-14 (condition 5e13, coupled states): flagged by
    the screen (max diag P max diag P^-1 = 2.5e13 >= 1 / (64 eps n^2)) but above 64 eps of its
    largest eigenvalue, so not known; the precision is its inverse (mpmath, from the same
    float64 entries; 1e-2 is eps cond) and finite on every backend."""
    eps = 4e-14
    F, Q = np.eye(2), np.zeros((2, 2))
    P0 = np.array([[1.0, 1.0 - eps], [1.0 - eps, 1.0]])
    H, R = np.array([[1.0, 1.0]]), np.array([[1.0]])
    z = np.full((3, 1), np.nan)
    with mpmath.workdps(60):
        want = np.array(mpmath.inverse(mpmath.matrix(P0.tolist())).tolist(), dtype=float)
    for b in ("native", "torch", "sequential"):
        if b == "native" and not native.available():
            continue
        for r in (
            kd.filter(z, F, Q, H, R, prior_mean=[0.0, 0.0], prior_cov=P0, backend=b),
            kd.smooth(z, F, Q, H, R, prior_mean=[0.0, 0.0], prior_cov=P0, backend=b),
        ):
            assert np.isfinite(r.precision).all(), b
            assert np.abs(r.precision - want).max() / np.abs(want).max() < 1e-2, b


def test_no_direction_is_called_known_where_none_can_be():
    """The gate (kalmanscan/dense/singular.py): an unobserved explosive coupled pair with
    positive-definite Q has a covariance of condition 1e19 after 20 steps (a variance below 64 eps
    of its block), but no direction can be known exactly (Q positive definite, proper prior, no
    exact entry): no backend reports an infinite precision or zeroes a covariance row there."""
    F, Q = np.array([[3.0, 1.0], [0.0, 1.0]]), 0.01 * np.eye(2)
    H, R = np.array([[1.0, 0.0]]), np.array([[1.0]])
    z = np.full((24, 1), np.nan)
    z[0] = 0.3
    for b in ("native", "torch", "sequential"):
        if b == "native" and not native.available():
            continue
        r = kd.smooth(z, F, Q, H, R, prior_mean=[0.0, 0.0], prior_cov=np.eye(2), backend=b)
        for res in (r, r.filtered):
            assert not np.isinf(res.precision).any(), b
            assert (np.diagonal(res.cov, axis1=-2, axis2=-1) > 0).all(), b
        P = r.filtered.cov[-1]
        assert np.linalg.cond(P) > 1e15  # the regime the rule would have called known


def test_ordinary_models_do_not_reach_the_rule(monkeypatch):
    """Ordinary models (singular Q with an invertible F, positive-definite R, a diffuse or
    positive-definite prior) never run the rule: no step is flagged and the gate is off."""
    from kalmanscan.dense import singular

    calls = []
    monkeypatch.setattr(singular, "apply", lambda *a, **k: calls.append(1) or a[:2] + (None,))
    rng = np.random.default_rng(5)
    models = [
        kd.add_components(kd.local_linear_trend(1.0, 0.0, 2.0), kd.seasonal_dummies(12, 0.0)),
        kd.local_linear_trend(0.5, 0.01, 1.0),
        kd.constant_velocity(dt=0.5, accel_var=1.0, obs_var=0.3, ndim=2),
    ]
    for m in models:
        m = m._asdict()
        d = np.asarray(m["H"]).shape[0]
        z = np.cumsum(rng.normal(size=(300, d)), 0)
        z[rng.random(z.shape) < 0.1] = np.nan
        for b in ("native", "torch", "sequential"):
            if b == "native" and not native.available():
                continue
            kd.smooth(z, **m, backend=b)
    assert not calls


def test_gradients_stay_finite_with_a_known_state():
    """Differentiable path (torch): the log-likelihood's gradient and the finite precision
    entries' gradients are finite with a state known exactly."""
    m, z, pr, *_ = _case("llt-slope-known")
    Qt = torch.tensor(m["Q"], requires_grad=True)
    r = kd.filter(torch.tensor(z), torch.tensor(m["F"]), Qt, torch.tensor(m["H"]),
                  torch.tensor(m["R"]), prior_mean=torch.tensor(pr["prior_mean"]),
                  prior_cov=torch.tensor(pr["prior_cov"]), backend="torch")  # fmt: skip
    (g,) = torch.autograd.grad(r.loglik + r.precision[-1, 0, 0], Qt)
    assert torch.isfinite(g).all()


def test_float32_known_direction():
    """float32 on the scan: the same inf pattern and exact zeros as float64."""
    m, z, pr, *_ = _case("exact-entry-pins-sum")
    t32 = {k: torch.tensor(v, dtype=torch.float32) for k, v in m.items()}
    r = kd.filter(torch.tensor(z, dtype=torch.float32), **t32,
                  prior_mean=torch.zeros(3), prior_cov=torch.eye(3), backend="torch")  # fmt: skip
    _, fprec, _ = _truth("exact-entry-pins-sum")
    np.testing.assert_array_equal(torch.isinf(r.precision).numpy(), np.isinf(fprec))
    fin = ~np.isinf(fprec)
    assert np.abs(r.precision.numpy()[fin] - fprec[fin]).max() < 1e-3 * np.abs(fprec[fin]).max()


def test_docs_example_runs_as_printed():
    """The example of docs/dense.md, "Known directions", prints what the page shows."""
    text = Path(__file__).resolve().parents[1].joinpath("docs", "dense.md").read_text()
    sec = text[text.index("## Known directions") :]
    code = re.search(r"```python\n(.*?)```", sec, re.S).group(1)
    lines = [ln for ln in code.splitlines()]
    src = "\n".join(ln for ln in lines if not ln.startswith("# -> "))
    want = [ln[5:] for ln in lines if ln.startswith("# -> ")]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(src, "docs/dense.md", "exec"), {})
    assert buf.getvalue().splitlines() == want
