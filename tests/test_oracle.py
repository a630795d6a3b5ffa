"""The mpmath oracle (kalmanscan/validation/oracle.py) against closed forms, filterpy and KFAS's
fixtures.

The oracle is the truth of the regime battery, so it is checked here against everything that is
exact in its domain: closed forms (memoryless steps, a constant level under a diffuse prior),
filterpy on ordinary random lanes, itself at 25 more digits, and the R package KFAS's exact
diffuse results that statsmodels ships in its test suite (smoothed states and covariances,
log-likelihood through the convention offset of docs/validation.md).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

pytest.importorskip("mpmath")

from kalmanscan import validation  # noqa: E402
from kalmanscan.testing import assert_close, tolerance  # noqa: E402
from kalmanscan.validation import oracle  # noqa: E402
from kalmanscan.validation.models import random_batch  # noqa: E402
from kalmanscan.validation.truths import filterpy_truth  # noqa: E402

LOG2PI = math.log(2 * math.pi)


def test_memoryless_steps_closed_form():
    rng = np.random.default_rng(0)
    z = rng.standard_normal(7)
    p, r, c = 2.0, 0.5, 0.3
    o = oracle.scalar_oracle(z, r, 0.0, p, offset=c)
    tol = tolerance("identical", "float64")
    np.testing.assert_allclose(o.var, 1 / (1 / p + 1 / r), rtol=tol)
    np.testing.assert_allclose(o.mean, c + (z - c) * p / (p + r), rtol=tol)
    np.testing.assert_allclose(o.smooth_mean, o.mean, rtol=tol)
    ll = -0.5 * (LOG2PI + np.log(p + r) + (z - c) ** 2 / (p + r))
    assert_close(o.loglik, ll.sum(), "identical", "float64", what="loglik")


@pytest.mark.parametrize("T", [1, 2, 63, 1000])
def test_constant_level_diffuse_closed_form(T):
    rng = np.random.default_rng(T)
    r = 0.7
    z = 2.0 + math.sqrt(r) * rng.standard_normal(T)
    o = oracle.scalar_oracle(z, r, 1.0, 0.0)
    n = np.arange(1, T + 1)
    tol = tolerance("closed_form", "float64")
    np.testing.assert_allclose(o.var, r / n, rtol=tol)
    np.testing.assert_allclose(o.mean, np.cumsum(z) / n, rtol=tol)
    np.testing.assert_allclose(o.smooth_mean, np.full(T, z.mean()), rtol=tol)
    np.testing.assert_allclose(o.smooth_var, np.full(T, r / T), rtol=tol)
    prev = (np.cumsum(z) / n)[:-1]
    S = r / n[:-1] + r
    ll = -0.5 * (LOG2PI + np.log(S) + (z[1:] - prev) ** 2 / S)
    assert o.loglik == pytest.approx(ll.sum(), rel=tol, abs=tol)  # abs: T = 1 has no terms
    assert o.n_loglik_terms == T - 1


@pytest.mark.skipif(
    importlib.util.find_spec("filterpy") is None, reason="filterpy is not installed"
)
def test_agrees_with_filterpy_on_ordinary_lanes():
    batch = random_batch(0, 63, 5)
    tol = tolerance("rounding", "float64")
    for lane in batch.lanes():
        o = oracle.scalar_oracle(
            lane.z,
            lane.obs_var,
            lane.decay,
            lane.process_var,
            lane.loading,
            lane.offset,
            lane.prior_mean,
            lane.prior_var,
        )
        try:
            t = filterpy_truth(lane)
        except validation.NotApplicable:
            continue
        for ours, theirs, what in (
            (o.mean, t.mean, "mean"),
            (o.smooth_mean, t.smooth_mean, "smooth_mean"),
        ):
            fin = np.isfinite(theirs)
            np.testing.assert_array_equal(np.isfinite(ours), fin, err_msg=lane.name)
            scale = np.max(np.abs(theirs[fin])) if fin.any() else 1.0
            assert np.max(np.abs(ours[fin] - theirs[fin]), initial=0) <= tol * scale, what
        for ours, theirs in ((o.var, t.var), (o.smooth_var, t.smooth_var)):
            np.testing.assert_allclose(ours, theirs, rtol=tol, err_msg=lane.name)
        assert o.loglik == pytest.approx(t.loglik, rel=tol, abs=tol), lane.name


def test_digits_absorb_the_backward_amplification():
    """No process noise, decay 0.9577, 1000 steps: the RTS gains multiply to ~1e19. At 16
    digits (float64's) the RTS pass is off by 1e5 posterior sds, at 20 by ~1e-8; the oracle
    picks 40 + 19 digits, and 25 more change nothing at float64 resolution."""
    from kalmanscan.validation.regimes import mean_err_sd, scalar_regimes

    r = scalar_regimes()[0]
    args = (r.z, r.obs_var, r.decay, r.process_var, r.loading, r.offset, r.prior_mean, r.prior_var)
    o = oracle.scalar_oracle(*args, certify=True)
    assert 18 < o.log10_gain < 20 and o.dps >= 40 + o.log10_gain
    assert max(o.own_error.values()) <= tolerance("identical", "float64")
    lo = oracle.scalar_oracle(*args, dps=16)
    assert mean_err_sd(lo.smooth_mean, o.smooth_mean, o.smooth_var, floor=0.0) > 1.0
    # OU theta=0.5, sigma2=0 over 500 unit steps: the gains multiply to 1e108, the smoothed
    # variance ends below 1e-100 and stays positive; ~150 digits
    a = math.exp(-0.5)
    z = 1.0 + 0.7 * np.random.default_rng(1).standard_normal(500)
    o = oracle.scalar_oracle(z, 0.5, a, 0.0, offset=1 - a, prior_mean=1.0, prior_var=1.0)
    assert o.log10_gain > 100 and o.dps >= 40 + o.log10_gain
    assert np.all(o.smooth_var > 0) and o.smooth_var[-1] < 1e-100


# ------------------------------------------------------------------------------------------
# dense oracle against KFAS (fixtures shipped in statsmodels' test suite)


def _fixtures():
    from kalmanscan.validation.conventions import kfas_fixtures_dir

    return kfas_fixtures_dir()


def _kfas_models():
    from kalmanscan.validation.conventions import kfas_models

    return kfas_models()


@pytest.mark.parametrize("name", sorted(_kfas_models()) if _fixtures() else [])
def test_dense_oracle_matches_kfas(name):
    import pandas as pd

    m = _kfas_models()[name]
    df = pd.read_csv(_fixtures() / f"results_exact_initial_{name}_R.csv")
    T, n = m["z"].shape[0], m["F"].shape[0]
    o = oracle.dense_oracle(m["z"], m["F"], m["Q"], m["H"], m["R"])
    # KFAS's smoothed states at the diffuse steps of these two models are wrong (dfm: its
    # x[1, 0] differs from x[2, 1], which the model makes equal; restricted common level: 20.08,
    # above every observation; the analytic test below agrees with us); statsmodels' own tests
    # skip them too. Later steps are compared.
    s = {"dfm": 2, "common_level_restricted": 1}.get(name, 0)
    alphahat = df[[f"alphahat_{i + 1}" for i in range(n)]].to_numpy()[:T]
    tol = tolerance("truth", "float64")
    np.testing.assert_allclose(
        o.smooth_mean[s:], alphahat[s:], rtol=tol, atol=tol * np.abs(alphahat).max()
    )
    if f"V_{n * n}" in df:
        V = df[[f"V_{i + 1}" for i in range(n * n)]].to_numpy()[:T].reshape(T, n, n)
        np.testing.assert_allclose(
            o.smooth_cov[s:], np.swapaxes(V, 1, 2)[s:], rtol=tol, atol=tol * np.abs(V).max()
        )
    # the convention relation of docs/validation.md: kalmanscan - KFAS = 1/2 sum log pdet(Z Pinf Z')
    off = oracle.loglik_offset("kfas", m["F"], m["H"], np.isfinite(m["z"]))
    assert_close(o.loglik - off, float(df["llf"].iloc[0]), "rounding", "float64", what="llf")
    # and Durbin & Koopman's (statsmodels) adds 1/2 log 2 pi per diffuse observation element
    off_dk = oracle.loglik_offset("statsmodels", m["F"], m["H"], np.isfinite(m["z"]))
    assert_close(off_dk - off, 0.5 * LOG2PI * o.n_diffuse_obs, "closed_form", "float64")


def test_dense_oracle_common_level_restricted_analytic():
    """Koopman (1997, sec. 5.3), as statsmodels tests it: after the diffuse step the predicted
    level is phi (y11 + theta y21) with variance phi + sigma2_mu, phi = 1 / (1 + theta^2)."""
    m = _kfas_models()["common_level_restricted"]
    o = oracle.dense_oracle(m["z"], m["F"], m["Q"], m["H"], m["R"])
    th, (y11, y21) = 0.1111, m["z"][0]
    phi = 1 / (1 + th**2)
    assert_close(o.pred_mean[1, 0], phi * (y11 + th * y21), "closed_form", "float64")
    assert_close(o.pred_cov[1, 0, 0], phi + 3.2324, "closed_form", "float64")
    assert o.diffuse.tolist()[:2] == [False, False] and o.n_diffuse_obs == 1


def test_dense_oracle_loglik_equals_the_sequential_reference():
    """kalmanscan's dense sequential filter (its own derivation of the convention) agrees."""
    import kalmanscan.dense as kd

    m = _kfas_models()["var1_measurement_error"]
    o = oracle.dense_oracle(m["z"], m["F"], m["Q"], m["H"], m["R"])
    r = kd.filter(m["z"], m["F"], m["Q"], m["H"], m["R"], backend="sequential")
    assert_close(float(r.loglik), o.loglik, "rounding", "float64", what="loglik")
    np.testing.assert_allclose(
        np.asarray(r.mean)[1:], o.mean[1:], rtol=tolerance("rounding", "float64")
    )


def test_scalar_loglik_offset_statsmodels_nile():
    """Nile local level at the Durbin-Koopman variances: statsmodels' llf + offset = ours."""
    import kalmanscan as ks
    from kalmanscan.validation.nile import load_nile, statsmodels_local_level

    _, flow = load_nile()
    ref = statsmodels_local_level(flow, 15099.0, 1469.1)
    ours = float(ks.filter(flow, 15099.0, 1.0, 1469.1).loglik)
    off = oracle.scalar_loglik_offset("statsmodels", 1.0, 1.0, np.isfinite(flow))
    assert_close(ours, ref["llf"] + off, "rounding", "float64", what="loglik")
    assert_close(off, 0.5 * LOG2PI, "identical", "float64", what="offset")


def test_convention_offsets_on_real_series():
    """Nile, CO2, sunspots, El Nino (scalar models with loadings, decays, offsets and a leading
    gap): kalmanscan - statsmodels equals the formula of docs/validation.md. The mismatch is
    statsmodels' own rounding (its steady-state shortcut: 3.7e-10 on CO2, where kalmanscan is
    2e-15 from the oracle)."""
    from kalmanscan.validation.conventions import check_datasets

    rows = check_datasets(dense=False)
    assert len(rows) == 5
    for r in rows:
        assert r["rel_err"] <= tolerance("truth", "float64"), r["model"]
        assert_close(r["kalmanscan"], r["oracle"], "rounding", "float64", what=r["model"])


@pytest.mark.parametrize("backend", ["sequential", "torch", "native"])
def test_filter_loglik_convention_argument_matches_the_offsets(backend):
    """ks.filter's loglik_convention= shifts by exactly scalar_loglik_offset: lanes with a
    leading gap, decays away from 1, loadings other than 1, a forgetting step before the first
    observation (no shift) and a proper prior (no shift)."""
    import inspect

    import kalmanscan as ks
    from kalmanscan.core import native

    if "loglik_convention" not in inspect.signature(ks.filter).parameters:
        pytest.skip("ks.filter has no loglik_convention argument")
    if backend == "native" and not native.available():
        pytest.skip("native extension not built")
    rng = np.random.default_rng(5)
    T = 40
    z = rng.standard_normal((T, 4))
    z[:3, 0] = z[:7, 1] = np.nan
    decay = np.tile([0.8, -1.3, 0.95, 0.9], (T, 1))
    decay[2, 2] = 0.0  # lane 2 forgets at step 2, before its first observation (step 5)
    z[:5, 2] = np.nan
    loading = np.array([2.0, 0.5, 1.0, 3.0])
    prior_var = np.array([np.inf, np.inf, np.inf, 4.0])
    kw = dict(loading=loading, prior_var=prior_var, backend=backend)
    base = ks.filter(z, 0.3, decay, 0.2, **kw).loglik
    tol = tolerance("rounding", "float64")
    for conv in ("statsmodels", "kfas"):
        got = ks.filter(z, 0.3, decay, 0.2, loglik_convention=conv, **kw).loglik
        for n in range(4):
            off = oracle.scalar_loglik_offset(
                conv, decay[:, n], loading[n], np.isfinite(z[:, n]), np.isinf(prior_var[n])
            )
            assert base[n] - got[n] == pytest.approx(off, rel=tol, abs=tol), (conv, n)


@pytest.mark.parametrize(
    "n,d,T,tv,prior,miss,singular_q",
    [
        (2, 1, 15, False, "diffuse", 0.2, False),
        (3, 2, 12, True, "diffuse", 0.3, True),
        (3, 2, 12, False, "cov", 0.3, False),
    ],
    ids=["n2-d1-diffuse", "n3-d2-tv-diffuse-singQ", "n3-d2-cov"],
)
def test_dense_oracle_equals_the_dense_reference_on_random_models(n, d, T, tv, prior, miss,
                                                                   singular_q):
    """Random dense models (correlated R, whitened by the oracle; time-varying matrices;
    partly missing vectors; singular Q): the oracle and kalmanscan.dense's float64 sequential
    reference, two independent derivations, agree to ~1e-13."""
    import kalmanscan.dense as kd
    from kalmanscan.validation.dense_checks import random_model

    rng = np.random.default_rng([n, d, T])
    m = random_model(rng, n, d, T, tv=tv, prior=prior, missing=miss, singular_q=singular_q)
    kw = dict(offset=m["offset"], prior_mean=m["prior_mean"])
    if prior == "cov":
        pc = kw["prior_cov"] = m["prior_cov"]
    else:
        pc = np.diag(np.full(n, np.inf))
        kw["prior_precision"] = np.zeros((n, n))
    o = oracle.dense_oracle(m["z"], m["F"], m["Q"], m["H"], m["R"], offset=m["offset"],
                            prior_mean=m["prior_mean"], prior_cov=pc)
    r = kd.smooth(m["z"], m["F"], m["Q"], m["H"], m["R"], backend="sequential", **kw)
    proper = ~o.diffuse
    scale, tol = np.abs(o.smooth_mean).max(), tolerance("rounding", "float64")
    assert np.abs(np.asarray(r.filtered.mean)[proper] - o.mean[proper]).max() <= tol * scale
    assert np.abs(np.asarray(r.mean) - o.smooth_mean).max() <= tol * scale
    # the smoothed covariance recursion rounds more (measured 3.8e-13 relative on an entry near
    # zero): relative at the parallel bound, absolute at tol * scale
    np.testing.assert_allclose(
        np.asarray(r.cov),
        o.smooth_cov,
        rtol=tolerance("parallel", "float64"),
        atol=tol * scale,
    )
    assert_close(float(r.filtered.loglik), o.loglik, "rounding", "float64", what="loglik")


def test_dense_oracle_missing_value_in_the_first_season():
    """Local linear trend + seasonal(12) (13 states, diffuse) with z missing at step 10: that
    season's direction stays diffuse until step 22, while steps 13 ... 21 are ordinary. Their
    H P_inf H' is 0 in exact arithmetic and about 1e-(dps) after rounding; it was counted as a
    diffuse term of log 1e-(dps) (the oracle's log-likelihood -611 / -333 / -517 at 60 / 120 /
    200 digits against the filters' -53.9). Now the oracle equals every backend at every
    precision, and statsmodels' exact diffuse llf plus the convention offset equals it too."""
    import kalmanscan.dense as kd

    rng = np.random.default_rng(3)
    m = kd.add_components(
        kd.local_linear_trend(level_var=0.5, slope_var=0.05, obs_var=1.0),
        kd.seasonal_dummies(12, seasonal_var=0.1),
    )
    T = 30
    y = np.cumsum(rng.normal(size=T)) + 3.0 * np.sin(2 * np.pi * np.arange(T) / 12)
    y[10] = np.nan
    lls = [oracle.dense_oracle(y[:, None], m.F, m.Q, m.H, m.R, offset=m.offset, dps=dps).loglik
           for dps in (60, 120)]
    assert abs(lls[0] - lls[1]) <= tolerance("closed_form", "float64") * abs(lls[1])
    from kalmanscan.dense import native as dense_native

    for backend in ("sequential", "torch") + (("native",) if dense_native.available() else ()):
        got = float(kd.filter(y[:, None], **m._asdict(), backend=backend).loglik)
        assert abs(got - lls[1]) <= tolerance("oracle", "float64") * abs(lls[1]), backend
    sm = pytest.importorskip("statsmodels.tsa.statespace.structural")
    mod = sm.UnobservedComponents(y, "local linear trend", seasonal=12, use_exact_diffuse=True)
    mod.ssm.tolerance = 0
    llf = mod.filter([1.0, 0.5, 0.05, 0.1]).llf
    off = oracle.loglik_offset("statsmodels", m.F, m.H, ~np.isnan(y))
    assert abs(lls[1] - off - llf) <= tolerance("statsmodels", "float64") * abs(llf)


def test_dense_oracle_digits_near_noiseless_overdetermined_diffuse_step():
    """The dense oracle starts diffuse directions at kappa = 10^(dps/3) in its covariance
    filter: four entries at R = 1e-12 I on three diffuse states (random rows, seed 7) need
    more than 60 digits there. Measured: 60 digits 1.05 relative off in the filtered
    covariances (136 % on the diffuse step's entries) against 100; the default 120 agrees with
    160 to 1e-12 and better, which the battery now reports per dense row (oracle_own, the
    change at 40 more digits)."""
    from kalmanscan.validation.regimes import _mixing, _truth_moments, dense_errors

    z, F, Q, H, R, _ = _mixing(7, 3, 4, 1e-12, "diffuse", missing=0.0)
    e60 = dense_errors(_truth_moments(oracle.dense_oracle(z, F, Q, H, R, dps=60)),
                       oracle.dense_oracle(z, F, Q, H, R, dps=100))  # fmt: skip
    assert e60["filter_var"] > 0.1  # the failure this documents (a guard that it is real)
    d120 = oracle.dense_oracle(z, F, Q, H, R)
    e120 = dense_errors(_truth_moments(d120), oracle.dense_oracle(z, F, Q, H, R, dps=160))
    assert d120.dps == 120 and max(e120.values()) < 1e-12, e120
