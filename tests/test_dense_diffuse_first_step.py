"""ARMA/ARIMA forms with R = 0 (statsmodels' SARIMAX matrices): a coordinate observed exactly at a
diffuse step, and a smoothed block whose every direction the filter knew, are all rounding once
their known (or diffuse) directions are projected out. The rule of kalmanscan/dense/singular.py
resolves them to the rounding of the covariance they were projected from (the smoother's rows to
that of the prediction), so no variance is negative and the precision is inf there. Before:
native's filtered variance -1.1e-13 at the first step of sunspots' AR(3) with every state
diffuse, -2.4e-32 on every backend at the last diffuse step of an ARIMA(3,1,0) of macrodata's
inflation, and 693 negative smoothed variances (down to -5.6e-35) on native for an ARIMA(3,1,1)
of its unemployment rate with a diffuse level."""

import functools

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.linalg import solve_discrete_lyapunov
from statsmodels.tsa.statespace.sarimax import SARIMAX

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

# native where its extension is built (a machine without a C compiler: the other two)
BACKENDS = ["native", "torch", "sequential"][0 if native.available() else 1 :]


def _sarimax(y, order, params):
    """SARIMAX's (F, Q, H) at ``params``: Q = selection state_cov selection'."""
    mod = SARIMAX(y, order=order)
    mod.update(np.asarray(params))
    s = mod.ssm
    sel = np.asarray(s["selection"])
    Q = sel @ np.asarray(s["state_cov"]) @ sel.T
    return np.asarray(s["transition"]), Q, np.asarray(s["design"])


def _ar3_sunspots():
    """SARIMAX(3,0,0) of sunspots at its estimates, every state diffuse (first 40 steps)."""
    y = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].values.astype(float)[:40]
    par = [1.5592850756922154, -0.7877454776577535, 0.13051883666809444, 349.7303613145758]
    F, Q, H = _sarimax(y, (3, 0, 0), par)
    return y[:, None], F, Q, H, np.diag(np.full(3, np.inf))


def _arima310_infl():
    """SARIMAX(3,1,0) of macrodata's inflation at its estimates, every state diffuse."""
    y = sm.datasets.macrodata.load_pandas().data["infl"].values.astype(float)
    par = [-0.5951982659074079, -0.36710833670370047, -0.028970859529946144, 5.329407033626125]
    F, Q, H = _sarimax(y, (3, 1, 0), par)
    return y[:, None], F, Q, H, np.diag(np.full(4, np.inf))


def _arima311_unemp():
    """SARIMAX(3,1,1) of the unemployment rate, diffuse level, stationary ARMA block."""
    y = sm.datasets.macrodata.load_pandas().data["unemp"].values.astype(float)
    par = [-0.08701178900672353, -0.08482460539518351, 0.17314357452478282,
           -0.07312155593633618, 0.2265969807288074]  # fmt: skip
    F, Q, H = _sarimax(y, (3, 1, 1), par)
    P0 = np.zeros_like(F)
    P0[1:, 1:] = solve_discrete_lyapunov(F[1:, 1:], Q[1:, 1:])
    P0 = (P0 + P0.T) / 2
    P0[0, 0] = np.inf
    return y[:, None], F, Q, H, P0


@functools.lru_cache
def _oracle_variances(case):
    """Filtered variances [6, n] of ``case()``'s first 6 steps from :func:`dense_oracle` (mpmath,
    120 digits; a state still diffuse has a variance of order kappa = 1e40)."""
    z, F, Q, H, P0 = case()
    r = dense_oracle(z[:6], F, Q, H, np.zeros((1, 1)), prior_cov=P0)
    return np.diagonal(r.cov, axis1=-2, axis2=-1)


def _no_negative_variance(res):
    for r in (res.filtered, res):
        dg = np.diagonal(r.cov, axis1=-2, axis2=-1)
        assert (dg >= 0).all(), f"{(dg < 0).sum()} negative variances, min {dg.min():.2e}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_entry_at_diffuse_first_step_is_known(backend):
    z, F, Q, H, P0 = _ar3_sunspots()
    res = kd.smooth(z, F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(3), prior_cov=P0,
                    backend=backend)  # fmt: skip
    _no_negative_variance(res)
    f = res.filtered
    # step 1 observes x[0] exactly; the two others stay diffuse
    assert f.cov[0, 0, 0] == 0.0 and np.isinf(f.cov[0, 1:, 1:].diagonal()).all()
    if backend == "native":  # (the other backends' screens leave it to the inverse: 2.9e31)
        assert f.precision[0, 0, 0] == np.inf
    # the variances that are finite against the mpmath oracle: every one is 0 (an AR(3)
    # observed without noise is known after 3 steps)
    v_mp = _oracle_variances(_ar3_sunspots)
    v = np.diagonal(f.cov[:6], axis1=-2, axis2=-1)
    fin = np.isfinite(v)
    assert fin.sum() == 3 * 6 - 3  # (steps 1 and 2 keep 2 and 1 diffuse states)
    assert (fin == (v_mp < 1e20)).all()  # inf exactly where the oracle is still diffuse
    assert np.abs(v[fin] - v_mp[fin]).max() <= 1e-12 * np.abs(Q).max()
    assert np.abs(v_mp[fin]).max() <= 1e-30


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_native_smoothed_variances_of_an_arima_are_never_negative():
    z, F, Q, H, P0 = _arima311_unemp()
    args = (z, F, Q, H, np.zeros((1, 1)))
    kw = dict(prior_mean=np.zeros(4), prior_cov=P0)
    res = kd.smooth(*args, **kw, backend="native")
    _no_negative_variance(res)
    ref = kd.smooth(*args, **kw, backend="sequential")
    scale = np.abs(Q).max()
    assert np.abs(res.cov - ref.cov).max() <= 1e-13 * scale
    assert np.abs(res.filtered.cov[1:] - ref.filtered.cov[1:]).max() <= 1e-13 * scale
    # a coordinate known exactly (inf on its diagonal, finite across its row): 0 across its
    # row of cov; every state is known at the end (invertible MA, R = 0)
    inf = np.isinf(res.precision)
    known = np.diagonal(inf, axis1=-2, axis2=-1) & (inf.sum(-1) == 1)
    assert known[-50:].all()
    assert (np.abs(res.cov).max(-1)[known] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_entries_over_a_diffuse_head_leave_no_negative_variance(backend):
    # before: step 3 (the last diffuse one) -2.4e-32 and -7.7e-35 on torch and sequential,
    # -7.7e-35 on native; every state is known from there on (an AR(3) of the differences)
    z, F, Q, H, P0 = _arima310_infl()
    res = kd.smooth(z, F, Q, H, np.zeros((1, 1)), prior_mean=np.zeros(4), prior_cov=P0,
                    backend=backend)  # fmt: skip
    _no_negative_variance(res)
    v_mp = _oracle_variances(_arima310_infl)
    v = np.diagonal(res.filtered.cov[:6], axis1=-2, axis2=-1)
    fin = np.isfinite(v)
    assert (fin == (v_mp < 1e20)).all()  # inf exactly where the oracle is still diffuse
    assert np.abs(v[fin] - v_mp[fin]).max() <= 1e-12 * np.abs(Q).max()
