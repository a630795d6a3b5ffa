"""Standard errors beside an estimate on its boundary (issue 22 item 8): where a variance sits at
its bound 0 (statsmodels' CO2, sunspots and El Nino records, ``obs_var``), that parameter has
none (its one-sided profile bound is ``OUFit.upper_bound``) and the other parameters have the
observed information's, with the boundary parameter held at 0 (they used to be NaN as well).

Three truths: statsmodels' local level with ``sigma2.irregular`` fixed at 0 (its own numerical
Hessian, ``cov_type="approx"``), evaluated at our estimate; the closed form of a random walk seen
without noise (``sigma2_hat sqrt(2 / m)`` over ``m`` increments); and, for the OU model, a
central-difference Hessian of ``OUModel.loglik`` in natural units with steps of 2% of each
standard error (independent of the fit's standardized stencil).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from kalmanscan.testing import tolerance
from kalmanscan.timeseries import OUModel, fit_ou

sm = pytest.importorskip("statsmodels.api")
SE_RTOL = tolerance("stderr", "float64")
LL = {"theta": 0.0, "mu": 0.0}


def _records():
    co2 = sm.datasets.co2.load_pandas().data["co2"].to_numpy()  # weekly, 59 gaps
    sun = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy()
    eln = sm.datasets.elnino.load_pandas().data.iloc[:, 1:].to_numpy().ravel()
    return {"co2": co2, "sunspots": sun, "elnino": eln}


RECORDS = _records()


def _fit(z, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_ou(z, **kw)


@pytest.mark.parametrize("name", list(RECORDS))
def test_local_level_sigma2_se_is_statsmodels_with_the_noise_held_at_0(name):
    z = RECORDS[name]
    fit = _fit(z, fix=LL)
    assert fit.at_boundary["obs_var"] and math.isnan(fit.stderr["obs_var"])
    mod = sm.tsa.UnobservedComponents(z, "llevel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mod.fix_params({"sigma2.irregular": 0.0}):
            res = mod.smooth([fit.params["sigma2"]], cov_type="approx")
    want = float(np.asarray(res.bse)[-1])
    assert abs(fit.stderr["sigma2"] / want - 1) <= SE_RTOL, (fit.stderr["sigma2"], want)


@pytest.mark.parametrize("name", list(RECORDS))
def test_local_level_sigma2_se_is_the_noise_free_closed_form(name):
    z = RECORDS[name]
    fit = _fit(z, fix=LL)
    obs = np.flatnonzero(~np.isnan(z))
    d, dt = np.diff(z[obs]), np.diff(obs).astype(float)
    s2 = np.mean(d * d / dt)  # the random walk's MLE from its increments (gaps span dt steps)
    assert abs(fit.params["sigma2"] / s2 - 1) <= tolerance("fit", "float64")
    assert abs(fit.stderr["sigma2"] / (s2 * math.sqrt(2 / d.size)) - 1) <= SE_RTOL


def _independent_se(z, params, names, frac=0.02):
    """Standard errors of ``names`` from a central-difference Hessian of ``OUModel.loglik``
    (natural units; logs for the positive parameters) with the other parameters held."""
    fit_se = np.array([params["_se"][k] / (params[k] if k != "mu" else 1.0) for k in names])
    h = frac * fit_se
    x0 = np.array([math.log(params[k]) if k != "mu" else params[k] for k in names])
    base = {k: v for k, v in params.items() if k != "_se"}

    def ll(x):
        q = dict(base)
        for k, v in zip(names, x, strict=True):
            q[k] = math.exp(v) if k != "mu" else v
        return float(OUModel(**q).loglik(z))

    k = len(names)
    H = np.empty((k, k))
    for i in range(k):
        for j in range(k):
            ei, ej = np.eye(k)[i] * h[i], np.eye(k)[j] * h[j]
            H[i, j] = (
                ll(x0 + ei + ej) - ll(x0 + ei - ej) - ll(x0 - ei + ej) + ll(x0 - ei - ej)
            ) / (4 * h[i] * h[j])
    jac = np.array([params[k] if k != "mu" else 1.0 for k in names])
    return np.sqrt(np.diag(np.linalg.inv(-H))) * jac


OU_CASES = [
    ("sunspots", "theta", SE_RTOL), ("sunspots", "sigma2", SE_RTOL), ("sunspots", "mu", SE_RTOL),
    ("elnino", "theta", SE_RTOL), ("elnino", "sigma2", SE_RTOL), ("elnino", "mu", SE_RTOL),
    ("co2", "theta", 1e-3), ("co2", "sigma2", SE_RTOL),
    # (the fit's Hessian from exact gradients at steps scaled to each parameter; the earlier
    # stencil, step 1e-3 in standardized units, rounded the curvature in mu of this near random
    # walk, theta = 2e-4 per week over 2,284 weeks, to 4.6% off)
    ("co2", "mu", 1e-2),
]  # fmt: skip


@pytest.mark.parametrize("name, p, rtol", OU_CASES)
def test_ou_standard_errors_with_obs_var_held_at_0(name, p, rtol):
    z = RECORDS[name]
    fit = _fit(z)
    assert fit.at_boundary["obs_var"] and not any(
        v for k, v in fit.at_boundary.items() if k != "obs_var"
    )
    assert math.isnan(fit.stderr["obs_var"])
    names = ["theta", "sigma2", "mu"]
    assert all(math.isfinite(fit.stderr[k]) for k in names)
    se = _independent_se(z, {**fit.params, "_se": fit.stderr}, names)
    want = dict(zip(names, se, strict=True))
    assert abs(fit.stderr[p] / want[p] - 1) <= rtol, (fit.stderr[p], want[p])
    # the same as a fit with obs_var fixed at the boundary estimate
    held = _fit(z, fix={"obs_var": fit.params["obs_var"]})
    assert abs(held.stderr[p] / fit.stderr[p] - 1) <= 10 * rtol


def test_summary_and_dataset_show_the_other_standard_errors():
    z = RECORDS["sunspots"]
    fit = _fit(z)
    text = fit.summary()
    row = text.splitlines()[3].split()  # series, then (estimate, s.e.) per parameter
    for j, p in enumerate(["theta", "sigma2", "mu"]):
        assert float(row[2 + 2 * j]) == pytest.approx(fit.stderr[p], rel=1e-3), p
    assert row[8] == "<" + format(fit.upper_bound["obs_var"], ".4g")
    assert "standard errors are those with obs_var held at 0" in text
    xr = pytest.importorskip("xarray")
    ds = fit.to_dataset()
    assert isinstance(ds, xr.Dataset)
    assert np.isfinite(float(ds["sigma2_se"])) and np.isnan(float(ds["obs_var_se"]))


def test_several_series_get_their_own_pattern():
    """A batch with one series on the boundary and one interior: each its own standard errors."""
    walk = np.random.default_rng(5).normal(size=200).cumsum()  # no noise: obs_var on its bound
    rng = np.random.default_rng(3)
    noisy = rng.normal(size=200).cumsum() + rng.normal(size=200) * 2.0
    fit = _fit(np.column_stack([walk, noisy]), fix=LL)
    assert fit.at_boundary["obs_var"].tolist() == [True, False]
    se = fit.stderr
    assert np.isnan(se["obs_var"][0]) and np.isfinite(se["obs_var"][1])
    alone = [_fit(walk, fix=LL), _fit(noisy, fix=LL)]
    for i, one in enumerate(alone):
        assert abs(se["sigma2"][i] / one.stderr["sigma2"] - 1) <= SE_RTOL


def test_theta_on_its_bound_holds_mu_too():
    """theta at 0: the random walk does not depend on mu, so mu has no standard error either and
    the others come from the (sigma2, obs_var) block. A real fit rarely puts theta there (the
    stationary prior keeps it off), so the Newton result is built by hand: the information of
    theta and mu vanishes, as at theta = 0."""
    from types import SimpleNamespace

    from kalmanscan.timeseries import optim
    from kalmanscan.timeseries.uncertainty import _standard_errors

    free = ("theta", "sigma2", "mu", "obs_var")
    block = np.array([[2.0, 0.5], [0.5, 1.0]])  # (sigma2, obs_var), per observation, in u
    H = np.zeros((1, 4, 4))
    H[0, 1, 1], H[0, 1, 3], H[0, 3, 1], H[0, 3, 3] = block.ravel()
    H[0, 0, 0] = 1e-14  # theta held at exp(-32): no curvature left
    opt = optim.NewtonResult(
        u=np.zeros((1, 4)), f=np.zeros(1), g=np.zeros((1, 4)), H=H,
        at_boundary=np.array([[True, False, False, False]]),
        status=np.array([optim.CONVERGED]), n_iter=np.ones(1, int),
    )  # fmt: skip
    est = {"theta": np.array([1e-14]), "sigma2": np.array([3.0]), "mu": np.array([0.0]),
           "obs_var": np.array([5.0])}  # fmt: skip
    data = SimpleNamespace(n_obs=np.array([100]), free=free, fixed={}, joint=False)
    core = SimpleNamespace(opt=opt, data=data, s=np.ones(1), est=est)
    se, ok, why = _standard_errors(core, free, joint=False)
    assert ok.tolist() == [True] and why.tolist() == [""]
    assert np.isnan(se["theta"][0]) and np.isnan(se["mu"][0])
    cov = np.linalg.inv(100 * block)
    assert se["sigma2"][0] == pytest.approx(3.0 * math.sqrt(cov[0, 0]), rel=1e-12)
    assert se["obs_var"][0] == pytest.approx(5.0 * math.sqrt(cov[1, 1]), rel=1e-12)
    # every free estimate on its bound: nothing to report, and the reason says so
    opt2 = opt._replace(at_boundary=np.array([[True, True, False, True]]))
    se, ok, why = _standard_errors(SimpleNamespace(**{**vars(core), "opt": opt2}), free, False)
    assert not ok[0] and why[0] == "every free estimate is on its boundary"
    assert all(np.isnan(v[0]) for v in se.values())
