"""OUModel's outputs are scale-free (issue 22, "outliers and scale"): the filter, smoother,
forecasts, bands, log-likelihood and Datasets of data ``s * z`` under the model with means times
``s`` and variances times ``s**2`` are the scale-1 outputs rescaled (the log-likelihood minus
``log s`` per contributing observation), for ``s`` from 1e-150 to 1e150, on real records (Nile;
statsmodels' CO2, sunspots, El Nino) and simulated OU series. Before the model worked in units of
a power of two, data at 1e-100 and below came back as zeros.

The model runs the filter on ``z / c`` with ``c`` a power of two, so the only difference between
scales is the rounding of ``s * z`` (and of ``s**2`` times the parameters), carried through the
smoother: ``RTOL`` (measured at most 6.2e-14 over every record, scale and output here, 3.8e-14 on
the log-likelihood). A fit at scale ``s`` is a second Newton run on a problem that differs by that
rounding: ``FIT_RTOL`` (measured at most 8.2e-11), its standard errors ``SE_RTOL`` (1.5e-7; a
finite-difference Hessian). ``python tests/test_real_data_scale_outputs.py`` prints the measured
agreement per scale.
"""

from __future__ import annotations

import functools
import math
import re
import warnings

import numpy as np
import pytest

from kalmanscan.testing import rel_error
from kalmanscan.timeseries import OUModel, fit_ou, load_nile

RTOL = 1e-12
FIT_RTOL = 1e-9
SE_RTOL = 1e-6
SCALES = [1e-150, 1e-120, 1e-100, 1e-50, 1e-13, 1e13, 1e50, 1e100, 1e120, 1e150]
# fit_ou takes data whose scale (about 100 for Nile) is within 1e-150 .. 1e150
FIT_SCALES = [1e-140, 1e-100, 1e-13, 1e13, 1e100, 1e140]
POWER = {"theta": 0, "sigma2": 2, "mu": 1, "obs_var": 2, "prior_mean": 1, "prior_var": 2}
LL = {"theta": 0.0, "mu": 0.0}


def _sid(s):
    return f"s{s:.0e}".replace("+", "")


def _simulated():
    t = np.cumsum(np.random.default_rng(11).exponential(1.0, 400))
    m = OUModel(theta=0.3, sigma2=0.8, mu=2.0, obs_var=0.4)
    _, z = m.simulate(t, seed=12)
    z[np.random.default_rng(13).random(z.shape) < 0.1] = np.nan
    return z, t, None, m.params()


@functools.cache
def records():
    """``name -> (z, times, fix, params at scale 1)``; params are the scale-1 fit's, except that a
    variance on its bound (1e-15 of the data's scale squared) is set to 1e-4 of the data's
    variance: 1e-15 times s**2 = 1e-300 would be subnormal, outside the range the claim is for."""
    sm = pytest.importorskip("statsmodels.api")
    years, flow = load_nile()
    co2 = sm.datasets.co2.load_pandas().data["co2"].to_numpy()  # weekly, 59 gaps
    sun = sm.datasets.sunspots.load_pandas().data
    eln = sm.datasets.elnino.load_pandas().data.iloc[:, 1:].to_numpy().ravel()  # monthly
    raw = {
        "nile-local-level": (flow, years, LL),
        "nile-ou": (flow, years, None),
        "co2": (co2, None, None),
        "sunspots": (sun["SUNACTIVITY"].to_numpy(), sun["YEAR"].to_numpy(), None),
        "elnino": (eln, None, None),
    }
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (z, t, fix) in raw.items():
            p = dict(fit_ou(z, t, fix=fix, stderr=False).params)
            for k in ("sigma2", "obs_var"):
                p[k] = max(p[k], 1e-4 * float(np.nanvar(z)))
            out[name] = (z, t, fix, p)
    out["simulated-ou"] = _simulated()
    return out


NAMES = ["nile-local-level", "nile-ou", "co2", "sunspots", "elnino", "simulated-ou"]


def _scaled(params: dict, s: float) -> dict:
    return {k: v * s ** POWER[k] for k, v in params.items()}


def _close(got, want, what, tol=RTOL):
    """Elementwise relative error (:func:`kalmanscan.testing.rel_error`) at most ``tol``; for a
    fit (``tol > RTOL``) relative to the largest entry, since an estimate's error reaches a band
    end near 0 (mean - q sd) undivided by the cancellation."""
    err = rel_error(got, want)
    g, w = np.asarray(got, float), np.asarray(want, float)
    fin = np.isfinite(w)
    if tol > RTOL and np.isfinite(err) and fin.any():
        err = float(np.max(np.abs(g[fin] - w[fin])) / max(np.max(np.abs(w[fin])), 1e-300))
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def _n_contributing(z, params):
    """Observations whose density enters the log-likelihood: all but a diffuse first one."""
    n = int(np.sum(~np.isnan(z)))
    diffuse = params["theta"] == 0 and params.get("prior_var") is None
    return n - int(diffuse)


def _close_loglik(got, want, n, s, tol=RTOL):
    shifted = np.asarray(got) + n * math.log(s)
    err = np.max(np.abs(shifted - want) / np.maximum(np.abs(want), 1.0))
    assert err <= tol, f"loglik: {got} + {n} log {s:g} = {shifted}, want {want} (rel {err:.3g})"


def _models(name, s, **extra):
    z, t, _, p = records()[name]
    p = {**p, **extra}
    return z, t, p, OUModel(**p), OUModel(**_scaled(p, s))


@pytest.mark.parametrize("s", SCALES, ids=_sid)
@pytest.mark.parametrize("name", NAMES)
def test_filter_outputs_are_the_rescaled_ones(name, s):
    z, t, p, m1, ms = _models(name, s)
    f1, fs = m1.filter(z, t), ms.filter(z * s, t)
    for k, power in (
        ("mean", 1), ("var", 2), ("precision", -2), ("info", -1),
        ("pred_mean", 1), ("pred_var", 2), ("pred_precision", -2),
    ):  # fmt: skip
        _close(getattr(fs, k) / s**power, getattr(f1, k), k)
    _close(fs.final.lam * s * s, f1.final.lam, "final.lam")
    _close(fs.final.eta * s, f1.final.eta, "final.eta")
    _close_loglik(fs.loglik, f1.loglik, _n_contributing(z, p), s)
    _close_loglik(ms.loglik(z * s, t), m1.loglik(z, t), _n_contributing(z, p), s)


@pytest.mark.parametrize("s", SCALES, ids=_sid)
@pytest.mark.parametrize("name", NAMES)
def test_smoothed_level_is_the_rescaled_one(name, s):
    z, t, p, m1, ms = _models(name, s)
    r1, rs = m1.smooth(z, t), ms.smooth(z * s, t)
    _close(rs.mean / s, r1.mean, "smoothed mean")
    _close(rs.var / s**2, r1.var, "smoothed var")
    _close(rs.filtered.mean / s, r1.filtered.mean, "filtered mean")
    _close_loglik(rs.filtered.loglik, r1.filtered.loglik, _n_contributing(z, p), s)
    assert np.all(rs.var > 0) and np.all(np.abs(rs.mean) > 0)  # the old defect: zeros


@pytest.mark.parametrize("s", SCALES, ids=_sid)
@pytest.mark.parametrize("name", NAMES)
def test_forecasts_and_bands_are_the_rescaled_ones(name, s):
    z, t, p, m1, ms = _models(name, s)
    for kw in (dict(steps=12), dict(at=[(t[-1] if t is not None else len(z) - 1) + 0.5])):
        c1, cs = m1.forecast(z, t, coverage=0.9, **kw), ms.forecast(z * s, t, coverage=0.9, **kw)
        np.testing.assert_array_equal(cs.times, c1.times)
        for k, power in (("mean", 1), ("var", 2), ("predictive_var", 2), ("lower", 1),
                         ("upper", 1)):  # fmt: skip
            _close(getattr(cs, k) / s**power, getattr(c1, k), f"forecast {k} {kw}")


@pytest.mark.parametrize("s", [1e-150, 1e-13, 1e150], ids=_sid)
def test_a_given_prior_is_rescaled_too(s):
    z, t, p, m1, ms = _models("simulated-ou", s, prior_mean=1.5, prior_var=0.25)
    f1, fs = m1.filter(z, t), ms.filter(z * s, t)
    _close(fs.mean / s, f1.mean, "mean")
    _close(fs.var / s**2, f1.var, "var")
    _close_loglik(fs.loglik, f1.loglik, _n_contributing(z, p), s)
    # a diffuse prior given explicitly: the first observation contributes nothing
    z, t, p, m1, ms = _models("nile-local-level", s, prior_mean=0.0, prior_var=math.inf)
    _close_loglik(ms.loglik(z * s, t), m1.loglik(z, t), int(np.sum(~np.isnan(z))) - 1, s)


@pytest.mark.parametrize("s", [1e-150, 1e-100, 1e100, 1e150], ids=_sid)
def test_series_of_very_different_scales_in_one_call(s):
    """Each series gets its own unit: a batch holding 1, s and 1/s gives each one's own answer."""
    z, t, _, p = records()["simulated-ou"]
    f = np.array([1.0, s, 1.0 / s])
    batch = OUModel(**{k: v * f ** POWER[k] for k, v in p.items()})
    sm = batch.smooth(z[:, None] * f, t)
    one = OUModel(**p).smooth(z, t)
    for j in range(3):
        _close(sm.mean[:, j] / f[j], one.mean, f"series {j} smoothed mean")
        _close(sm.var[:, j] / f[j] ** 2, one.var, f"series {j} smoothed var")
    fc = batch.forecast(z[:, None] * f, t, steps=3)
    fc1 = OUModel(**p).forecast(z, t, steps=3)
    for j in range(3):
        _close(fc.upper[:, j] / f[j], fc1.upper, f"series {j} forecast upper")


@pytest.mark.parametrize("s", [1e-150, 1.0, 1e150], ids=_sid)
def test_tensor_parameters_take_the_same_path(s):
    """Parameters given as tensors (a differentiable model) are scaled as tensors."""
    torch = pytest.importorskip("torch")
    z, t, p, m1, _ = _models("simulated-ou", s)
    two = np.column_stack([z, z[::-1]])  # two series: the unit is an array over them
    pt = {
        k: torch.full((2,), v, dtype=torch.float64) for k, v in _scaled(p, s).items() if k != "mu"
    }
    res = OUModel(**pt).filter(two * s, t)  # mu left at its default 0.0, a number
    ref = OUModel(**{**p, "mu": 0.0}).filter(two, t)
    assert isinstance(res.mean, torch.Tensor)
    _close(res.mean.numpy() / s, ref.mean, "mean")
    _close(res.var.numpy() / s**2, ref.var, "var")
    _close_loglik(res.loglik.numpy(), ref.loglik, _n_contributing(z, p), s)


VARIABLE_POWER = {
    "observed": 1, "mean": 1, "variance": 2, "precision": -2, "lower": 1, "upper": 1,
    "pred_mean": 1, "pred_variance": 2, "smoothed_mean": 1, "smoothed_variance": 2,
    "smoothed_lower": 1, "smoothed_upper": 1, "forecast_mean": 1, "forecast_variance": 2,
    "forecast_predictive_variance": 2, "forecast_lower": 1, "forecast_upper": 1,
    "theta": 0, "sigma2": 2, "mu": 1, "obs_var": 2,
    "theta_se": 0, "sigma2_se": 2, "mu_se": 1, "obs_var_se": 2, "converged": 0,
}  # fmt: skip


def _close_dataset(ds_s, ds_1, s, n, tol=RTOL):
    assert set(ds_s.data_vars) == set(ds_1.data_vars)
    for k in ds_1.data_vars:
        if k == "loglik":
            _close_loglik(ds_s[k].values, ds_1[k].values, n, s, tol)
            continue
        assert k in VARIABLE_POWER, f"{k}: a new Dataset variable; say how it scales"
        _close(ds_s[k].values / s ** VARIABLE_POWER[k], ds_1[k].values, k, tol)


@pytest.mark.parametrize("s", [1e-150, 1e-100, 1e-13, 1e100, 1e150], ids=_sid)
@pytest.mark.parametrize("name", ["nile-local-level", "co2", "simulated-ou"])
def test_model_dataset_is_the_rescaled_one(name, s):
    pytest.importorskip("xarray")
    z, t, p, m1, ms = _models(name, s)
    ds1 = m1.to_dataset(z, t, forecast_steps=5)
    dss = ms.to_dataset(z * s, t, forecast_steps=5)
    _close_dataset(dss, ds1, s, _n_contributing(z, p))


@pytest.mark.parametrize("s", [1e-150, 1e150], ids=_sid)
def test_xarray_accessor_is_the_rescaled_one(s):
    xr = pytest.importorskip("xarray")
    import kalmanscan.xarray  # noqa: F401  (registers .kalman)

    z, t, p, _, _ = _models("nile-local-level", s)
    da = xr.DataArray(z, dims="time", coords={"time": t})
    ds1 = da.kalman.filter(**p, forecast_steps=3)
    dss = (da * s).kalman.filter(**_scaled(p, s), forecast_steps=3)
    _close_dataset(dss, ds1, s, _n_contributing(z, p))
    fc1 = da.kalman.forecast(**p, steps=3)
    fcs = (da * s).kalman.forecast(**_scaled(p, s), steps=3)
    _close(fcs["forecast_upper"].values / s, fc1["forecast_upper"].values, "forecast_upper")


# --- fitted models ------------------------------------------------------------------------------


@functools.cache
def _fit(name, s):
    z, t, fix, _ = records()[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_ou(z * s, t, fix=fix)


FIT_NAMES = ["nile-local-level", "nile-ou", "sunspots", "simulated-ou"]


@pytest.mark.parametrize("s", FIT_SCALES, ids=_sid)
@pytest.mark.parametrize("name", FIT_NAMES)
def test_fitted_model_is_a_user_built_model(name, s):
    """``fit.filter()/smooth()/forecast()`` are the user-built ``OUModel(**fit.params)``'s."""
    z, t, _, _ = records()[name]
    fit = _fit(name, s)
    user = OUModel(**fit.params)
    _close(fit.filter().mean, user.filter(z * s, t).mean, "filtered mean")
    _close(fit.filter().loglik, user.filter(z * s, t).loglik, "loglik")
    _close(fit.smooth().var, user.smooth(z * s, t).var, "smoothed var")
    _close(fit.forecast(5).upper, user.forecast(z * s, t, steps=5).upper, "forecast upper")
    assert abs(float(fit.loglik) - float(user.loglik(z * s, t))) <= 1e-9 * abs(fit.loglik)


@pytest.mark.parametrize("s", FIT_SCALES, ids=_sid)
@pytest.mark.parametrize("name", FIT_NAMES)
def test_fit_at_scale_is_the_rescaled_fit(name, s):
    z, _, _, _ = records()[name]
    ref, got = _fit(name, 1.0), _fit(name, s)
    assert bool(got.converged) and bool(ref.converged)
    for k, v in ref.params.items():
        if ref.at_boundary.get(k, False):
            assert got.at_boundary[k]
            continue
        _close(got.params[k] / s ** POWER[k], v, k, FIT_RTOL)
        if math.isfinite(ref.stderr[k]):
            _close(got.stderr[k] / s ** POWER[k], ref.stderr[k], f"{k} s.e.", SE_RTOL)
    _close(got.smooth().mean / s, ref.smooth().mean, "smoothed mean", FIT_RTOL)
    _close(got.smooth().var / s**2, ref.smooth().var, "smoothed var", FIT_RTOL)
    _close(got.forecast(5).lower / s, ref.forecast(5).lower, "forecast lower", FIT_RTOL)
    n = _n_contributing(z, ref.params)
    _close_loglik(got.loglik, ref.loglik, n, s, FIT_RTOL)


_NUM = re.compile(r"<?[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)")


def _row(summary: str):
    head = [ln for ln in summary.splitlines() if ln.strip().startswith("series")][0]
    row = summary.splitlines()[summary.splitlines().index(head) + 1].split()
    return head.split(), row


@pytest.mark.parametrize("s", FIT_SCALES, ids=_sid)
@pytest.mark.parametrize("name", FIT_NAMES)
def test_summary_at_scale_prints_the_rescaled_numbers(name, s):
    ref, got = _fit(name, 1.0), _fit(name, s)
    free = [p for p in ("theta", "sigma2", "mu", "obs_var") if p not in ref.fixed]
    _, r1 = _row(ref.summary())
    _, rs = _row(got.summary())
    assert len(rs) == len(r1) == 2 + 2 * len(free) + 1
    for j, p in enumerate(free):
        for cell1, cells, what in ((r1[1 + 2 * j], rs[1 + 2 * j], p),
                                   (r1[2 + 2 * j], rs[2 + 2 * j], f"{p} s.e.")):  # fmt: skip
            assert cells != "nan" or cell1 == "nan", (what, cells)
            if cell1 == "nan" or ref.at_boundary.get(p, False):
                continue
            a, b = float(cells.lstrip("<")) / s ** POWER[p], float(cell1.lstrip("<"))
            # printed to 4-6 significant digits: equal up to the last digit
            assert abs(a - b) <= 1e-3 * abs(b), (what, cells, cell1)


@pytest.mark.parametrize("s", [1e-140, 1e140], ids=_sid)
@pytest.mark.parametrize("name", ["nile-local-level", "sunspots"])
def test_fit_dataset_at_scale(name, s):
    """``fit.to_dataset()`` at scale s: the user-built model's Dataset to RTOL (plus the fit's
    records), and the scale-1 fit's rescaled to FIT_RTOL."""
    pytest.importorskip("xarray")
    z, t, _, _ = records()[name]
    ref, got = _fit(name, 1.0), _fit(name, s)
    dss, ds1 = got.to_dataset(forecast_steps=4), ref.to_dataset(forecast_steps=4)
    user = OUModel(**got.params).to_dataset(z * s, t, forecast_steps=4)
    for k in user.data_vars:
        _close(dss[k].values, user[k].values, k)
    boundary = [f"{p}{suffix}" for p, b in ref.at_boundary.items() if b for suffix in ("", "_se")]
    se = [k for k in ds1.data_vars if k.endswith("_se") and k not in boundary]
    keep = [k for k in ds1.data_vars if k not in boundary and k not in se]
    _close_dataset(dss[keep], ds1[keep], s, _n_contributing(z, ref.params), FIT_RTOL)
    for k in se:
        _close(dss[k].values / s ** VARIABLE_POWER[k], ds1[k].values, k, SE_RTOL)


def _measure():
    """Worst relative error per scale of the model outputs (filter, smoother, forecast, loglik)
    over every record, and of the fits' interior estimates: the figures quoted above."""
    warnings.simplefilter("ignore")
    print(f"{'scale':>8} {'outputs':>9} {'loglik':>9} {'fit est.':>9} {'fit s.e.':>9}")
    for s in sorted(set(SCALES) | set(FIT_SCALES)):
        out = ll = fe = fse = 0.0
        for name in NAMES if s in SCALES else []:
            z, t, p, m1, ms = _models(name, s)
            f1, fs = m1.smooth(z, t), ms.smooth(z * s, t)
            c1, cs = m1.forecast(z, t, steps=12), ms.forecast(z * s, t, steps=12)
            pairs = [(fs.mean / s, f1.mean), (fs.var / s**2, f1.var)]
            pairs += [
                (getattr(fs.filtered, k) / s**q, getattr(f1.filtered, k))
                for k, q in (("mean", 1), ("var", 2), ("pred_mean", 1), ("pred_var", 2))
            ]
            pairs += [
                (getattr(cs, k) / s**q, getattr(c1, k))
                for k, q in (
                    ("mean", 1),
                    ("var", 2),
                    ("predictive_var", 2),
                    ("lower", 1),
                    ("upper", 1),
                )
            ]
            out = max([out] + [rel_error(a, b) for a, b in pairs])
            n = _n_contributing(z, p)
            want = f1.filtered.loglik
            ll = max(ll, float(abs(fs.filtered.loglik + n * math.log(s) - want) / abs(want)))
        for name in FIT_NAMES if s in FIT_SCALES else []:
            ref, got = _fit(name, 1.0), _fit(name, s)
            for k, v in ref.params.items():
                if k in ref.fixed or ref.at_boundary.get(k, False):
                    continue
                fe = max(fe, abs(got.params[k] / s ** POWER[k] / v - 1))
                fse = max(fse, abs(got.stderr[k] / s ** POWER[k] / ref.stderr[k] - 1))
        cells = [f"{v:9.2e}" if v or s in SCALES else f"{'-':>9}" for v in (out, ll)]
        cells += [f"{v:9.2e}" if s in FIT_SCALES else f"{'-':>9}" for v in (fe, fse)]
        print(f"{s:8.0e} " + " ".join(cells))


if __name__ == "__main__":
    _measure()
