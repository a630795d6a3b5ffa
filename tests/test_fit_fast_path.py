"""The fit's lean native call (:func:`fit._lean_loglik`, :func:`fit._lean_filter`) against the
usual path (:func:`kalmanscan.loglik` / :func:`kalmanscan.filter` through
:func:`fit._series_loglik`), bit for bit: on real records (statsmodels' Nile, CO2, macrodata,
sunspots), with NaN gaps, irregular times, batched and joint fits and fixed parameters; the
fallbacks where the usual path would differ; and whole fits with the lean call on and off. The
numpy twins of the robust screen's typical step (:mod:`kalmanscan.timeseries.robust`) against
its torch form."""

import math
import warnings

import numpy as np
import pytest
import torch

import kalmanscan.core.filter as filter_api
from kalmanscan.core import native, steps
from kalmanscan.timeseries import fit as F
from kalmanscan.timeseries import robust as R

pytestmark = pytest.mark.skipif(not native.available(), reason="needs the native extension")
sm = pytest.importorskip("statsmodels.api")

LL = {"theta": 0.0, "mu": 0.0}


def _bits(a):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def _same(a, b) -> bool:
    """Equal to the last bit (NaN payloads and the sign of zero included), shapes too."""
    return np.shape(a) == np.shape(b) and np.array_equal(_bits(a), _bits(b))


def _records():
    ds = sm.datasets
    nile = ds.nile.load_pandas().data["volume"].to_numpy(float)
    co2 = ds.co2.load_pandas().data["co2"].to_numpy(float)
    macro = ds.macrodata.load_pandas().data
    sun = ds.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(float)
    return {
        "nile": nile,
        "co2": co2[:700],  # (with its NaN gaps)
        "infl": macro["infl"].to_numpy(float),
        "unemp": macro["unemp"].to_numpy(float),
        "realgdp": np.log(macro["realgdp"].to_numpy(float)),
        "sunspots": sun,
    }


RECORDS = _records()
GAPPY = RECORDS["nile"].copy()
GAPPY[[0, 3, 10, 11, 12, 50, 99]] = np.nan


def _times(T, seed):
    """Irregular timestamps (steps 0.2 to 3; a repeated timestamp: a step of 0)."""
    t = np.cumsum(np.random.default_rng(seed).uniform(0.2, 3.0, T))
    t[5] = t[4]
    return t


def _batch():
    m = sm.datasets.macrodata.load_pandas().data
    z = m[["infl", "unemp", "tbilrate", "realint"]].to_numpy(float).copy()
    z[np.random.default_rng(0).random(z.shape) < 0.05] = np.nan
    return z


# (id, z [T, N], dt [T], fixed {name: [N]}, joint)
def _cases():
    out = []
    for name, z in [*RECORDS.items(), ("nile-gaps", GAPPY)]:
        T = z.size
        dt = np.r_[0.0, np.ones(T - 1)]
        out.append((f"{name}-LL", z[:, None], dt, {k: np.zeros(1) for k in LL}, False))
        out.append((f"{name}-OU", z[:, None], dt, {}, False))
    z = GAPPY[:, None]
    t = _times(100, 1)
    dt = np.diff(t, prepend=t[:1])
    out.append(("nile-gaps-irregular-OU", z, dt, {}, False))
    out.append(("nile-gaps-irregular-LL", z, dt, {k: np.zeros(1) for k in LL}, False))
    b = _batch()
    N = b.shape[1]
    db = np.r_[0.0, np.ones(b.shape[0] - 1)]
    out.append(("macro4-OU", b, db, {}, False))
    out.append(("macro4-fixed-obs_var", b, db, {"obs_var": np.full(N, 0.1)}, False))
    out.append(("macro4-fixed-theta-mixed", b, db, {"theta": np.array([0.0, 0.1, 0.0, 2.0])},
                False))  # fmt: skip
    out.append(("macro4-joint-OU", b, db, {}, True))
    out.append(("macro4-joint-LL", b, db, {k: np.zeros(N) for k in LL}, True))
    tb = _times(b.shape[0], 2)
    out.append(("macro4-irregular-OU", b, np.diff(tb, prepend=tb[:1]), {}, False))
    return out


CASES = _cases()


def _core(z, dt, fixed, joint, max_iter=1):
    """The fitting problem of ``z`` (``_Data``) and a point near its optimum (``u [G, k]``)."""
    free = [p for p in F.PARAMS if p not in fixed]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        core = F._fit_core(np.ascontiguousarray(z), dt, fixed, free, {}, joint, max_iter, 1e-9,
                           "auto", "cpu")  # fmt: skip
    assert core.data.lean
    return core


def _usual(data, U, idx):
    return F._series_loglik(data, F._params_of(data, U, idx), idx)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lean_loglik_is_the_usual_one_bit_for_bit(case):
    _, z, dt, fixed, joint = case
    core = _core(z, dt, fixed, joint, max_iter=3)
    data, u = core.data, core.opt.u
    rng = np.random.default_rng(len(case[0]))
    G, k = u.shape
    on = F._objective(data)
    off = F._objective(data._replace(lean=False))
    used = 0
    for scale in (1e-3, 0.3, 3.0, 30.0):
        for P in (1, 2 * k + 1, 17):
            U = u[None] + rng.normal(scale=scale, size=(P, G, k))
            idx = np.arange(G)
            if joint:
                series = np.arange(z.shape[1])
                Ub = np.broadcast_to(U[:, :1, :], (P, series.size, k))
                got, want = F._lean_loglik(data, Ub, series), _usual(data, Ub, series)
            else:
                got, want = F._lean_loglik(data, U, idx), _usual(data, U, idx)
            if got is not None:
                used += 1
                assert _same(got, want)
            assert _same(on(U, idx), off(U, idx))
            if not joint and G > 1:  # a subset of the groups, in another order
                sub = idx[::-2]
                assert _same(on(U[:, sub], sub), off(U[:, sub], sub))
    assert used >= 8  # the lean call served (the fallbacks are tested below)


@pytest.mark.parametrize("case", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_lean_filter_is_the_usual_one_bit_for_bit(case):
    _, z, dt, fixed, joint = case
    core = _core(z, dt, fixed, joint)
    data = core.data
    N = z.shape[1]
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = {p: np.exp(rng.normal(size=N) * 2) for p in ("theta", "sigma2", "obs_var")}
        x["mu"] = rng.normal(size=N)
        x.update(data.fixed)
        xs = {p: torch.as_tensor(v[None, :], dtype=torch.float64) for p, v in x.items()}
        want = F._series_loglik(data, xs, np.arange(N), outputs=True)
        got = F._lean_filter(data, x)
        assert got is not None
        for name, g, w in zip(want._fields, got, want, strict=True):
            parts = zip(g, w, strict=True) if name == "final" else [(g, w)]
            for a, b in parts:
                assert _same(a, b), name


def test_lane_arrays_and_prior_twins_are_torch_bit_for_bit():
    rng = np.random.default_rng(7)
    n = 4000
    # theta across the three regimes of ou_transition (x = 2 theta dt below 1e-4, to 1, above)
    theta = np.exp(rng.uniform(-30, 8, n))
    theta[::17] = 0.0
    sigma2 = np.exp(rng.uniform(-40, 40, n))
    mu = rng.normal(size=n) * 10.0 ** rng.integers(-5, 5, n)
    for dt in (np.array(1.0), rng.uniform(0, 3, (20, 1)), np.exp(rng.uniform(-12, 3, (20, 1)))):
        t = lambda a: torch.from_numpy(np.asarray(a))  # noqa: E731
        dtt = t(dt.reshape(-1)) if dt.ndim else t(dt)
        for zero in (False, True):
            want = F._lane_arrays(t(theta), t(sigma2), t(mu), dtt, zero)
            got = F._lane_arrays_np(theta, sigma2, mu, dt, zero)
            for g, w in zip(got, want, strict=True):
                if isinstance(w, float):
                    assert g == w
                else:
                    assert _same(g, w.reshape(np.shape(g)))
        pv = np.where(rng.random(n) < 0.3, np.inf, np.exp(rng.uniform(-30, 30, n)))
        pv[::11] = 0.0
        for g, w in zip(F._from_prior_np(mu, pv), steps.from_prior(t(mu), t(pv)), strict=True):
            assert _same(g, w)


@pytest.mark.parametrize("fn", [torch.exp, torch.expm1], ids=["exp", "expm1"])
def test_torch_transcendentals_do_not_depend_on_the_array(fn):
    """The twin's premise: torch's exp/expm1 of an element is the same in an array of any size
    or layout as alone (numpy's are not torch's in the last bit)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-60, 60, 3000) * 10.0 ** rng.integers(-8, 1, 3000)
    alone = np.array([fn(torch.tensor([v], dtype=torch.float64)).item() for v in x])
    assert _same(F._torch_fn(fn, x), alone)
    for n in (1, 3, 7, 8, 9, 21, 63):
        assert _same(F._torch_fn(fn, x[:n]), alone[:n])
        assert _same(F._torch_fn(fn, x[: 3 * n].reshape(3, n).T).T.ravel(), alone[: 3 * n])


def _tiny_decision(R_, p):
    """What ``kalmanscan.loglik``'s own test decides: lanes carried in other units or not."""
    T, N = p.shape if p.ndim == 2 else (3, p.size)
    z = torch.zeros(T, N, dtype=torch.float64)
    prep = filter_api._prepare(z, torch.from_numpy(R_), 1.0, torch.from_numpy(p), 1.0, 0.0, 0.0,
                               math.inf, None, 0, "native")  # fmt: skip
    ins = (prep.z, prep.obs_var, prep.decay, prep.process_var, prep.loading, prep.offset)
    return filter_api._tiny_lanes(prep, ins) is None


def test_tiny_lane_test_is_the_filters():
    rng = np.random.default_rng(3)
    below = filter_api._tiny_below(torch.float64)
    for trial in range(400):
        N = int(rng.integers(1, 6))
        # products of the variances around 2**below, and obs_var alone tiny
        lr = rng.uniform(below - 40, 40, N)
        lp = rng.uniform(below - 40, 40, N) if trial % 3 else below - lr + rng.normal(size=N)
        R_, p = np.exp2(lr), np.exp2(lp)
        if trial % 5 == 0:
            p = np.vstack([p, p * rng.uniform(0, 2, N), np.zeros(N)])  # [T, N], zeros
        if trial % 7 == 0:
            R_[0] = [np.nan, np.inf, 0.0, 1e-320][trial % 4]
        T = p.shape[0] if p.ndim == 2 else 3
        assert F._no_tiny_lanes(R_, p, T) == _tiny_decision(R_, p), (R_, p)


def _nile_data(fixed=None):
    z = RECORDS["nile"][:, None]
    fixed = {} if fixed is None else fixed
    return _core(z, np.r_[0.0, np.ones(99)], fixed, False).data


@pytest.mark.parametrize(
    "u,why",
    [
        ([0.0, -400.0, 0.0, -400.0], "tiny variances: lanes in other units"),
        ([0.0, 800.0, 0.0, 0.0], "process_var inf: flagged, the usual path raises"),
        ([0.0, np.nan, 0.0, 0.0], "NaN: flagged, the usual path raises"),
        ([0.0, 0.0, 1e300, 0.0], "overflow: flagged, the usual path raises"),
    ],
    ids=["tiny", "inf", "nan", "overflow"],
)
def test_falls_back_where_the_usual_path_differs(u, why):
    data = _nile_data()
    U = np.array(u)[None, None, :]
    idx = np.arange(1)
    assert F._lean_loglik(data, U, idx) is None, why
    fun = F._objective(data)
    try:
        want = _usual(data, U, idx)
    except (ValueError, OverflowError) as err:
        with pytest.raises(type(err), match=str(err)[:40].replace("(", r"\(")):
            fun(U, idx)
    else:
        assert _same(fun(U, idx), -(want.numpy() / data.n_obs[idx]))
    # the filter outputs fall back too
    x = F._params_of(data, U, idx)
    if why.startswith("tiny"):
        assert F._lean_filter(data, {p: v.numpy()[0] for p, v in x.items()}) is None


def test_lean_call_only_where_it_serves():
    zs = torch.zeros(5, 2, dtype=torch.float64)
    assert F._lean_available("auto", zs) and F._lean_available("native", zs)
    assert not F._lean_available("torch", zs)
    assert not F._lean_available("sequential", zs)
    assert not F._lean_available("auto", zs.float())
    assert not F._lean_available("no such backend", zs)


def test_without_the_extension_the_usual_path_fits(monkeypatch):
    z = RECORDS["nile"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = F.fit_ou(z, fix=LL, backend="torch")
        monkeypatch.setattr(native, "available", lambda: False)
        assert not F._lean_available("auto", torch.zeros(2, 1, dtype=torch.float64))
        got = F.fit_ou(z, fix=LL)  # "auto" takes torch: no lean call
    for p in ("sigma2", "obs_var"):
        assert got.params[p] == pytest.approx(want.params[p], rel=1e-6)


def _fit_fields(fit):
    out = {"loglik": fit.loglik, "n_iter": fit.n_iter, "converged": fit.converged}
    for p in F.PARAMS:
        out[f"est:{p}"] = fit.params[p]
        out[f"se:{p}"] = fit.stderr[p]
    out["notes"] = tuple(fit.notes)
    out["at_boundary"] = {p: np.asarray(v).tolist() for p, v in fit.at_boundary.items()}
    return out


def _fits(monkeypatch, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = F.fit_ou(*args, **kw)
        with monkeypatch.context() as m:
            m.setattr(F, "_lean_available", lambda backend, zs: False)
            off = F.fit_ou(*args, **kw)
    return on, off


FITS = [
    ("nile-LL", lambda: (RECORDS["nile"],), {"fix": LL}),
    ("nile-OU", lambda: (RECORDS["nile"],), {}),
    ("co2-LL", lambda: (RECORDS["co2"],), {"fix": LL}),
    ("infl-OU", lambda: (RECORDS["infl"],), {}),
    ("sunspots-OU", lambda: (RECORDS["sunspots"],), {}),
    ("realgdp-LL", lambda: (RECORDS["realgdp"],), {"fix": LL}),
    ("nile-gaps-irregular-OU", lambda: (GAPPY, _times(100, 1)), {}),
    ("macro4-OU", lambda: (_batch(),), {}),
    ("macro4-joint-LL", lambda: (_batch(),), {"fix": LL, "joint": True}),
    ("macro4-fixed-obs_var", lambda: (_batch(),), {"fix": {"obs_var": 0.1}}),
    ("nile-robust", lambda: (RECORDS["nile"],), {"robust": True}),
]


@pytest.mark.parametrize("name,args,kw", FITS, ids=[f[0] for f in FITS])
def test_fit_is_the_same_with_the_lean_call(monkeypatch, name, args, kw):
    on, off = _fits(monkeypatch, *args(), **kw)
    a, b = _fit_fields(on), _fit_fields(off)
    assert a.keys() == b.keys()
    for key in a:
        if key in ("notes", "at_boundary", "n_iter", "converged"):
            assert a[key] == b[key] if key != "converged" else np.array_equal(a[key], b[key])
        else:
            assert _same(a[key], b[key]), key


def _screen_inputs():
    rng = np.random.default_rng(3)
    for trial in range(400):
        T, M = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        kind = trial % 5
        if kind == 0:
            x = rng.normal(size=(T, M))
        elif kind == 1:  # rounded, resting on a level
            x = np.round(rng.normal(size=(T, M)) * 2) / 4 + 1000 * (rng.random() < 0.5)
        elif kind == 2:  # rare 0/1 events
            x = np.repeat(rng.integers(0, 3, size=(T, 1)).astype(float), M, 1)
        elif kind == 3:  # heavy tails across float64's range
            x = rng.standard_cauchy(size=(T, M)) * 10.0 ** rng.integers(-300, 300)
        else:  # a constant record with missing-value codes
            x = np.full((T, M), 4.0)
            x[rng.random((T, M)) < 0.2] = -9999.0
        x[rng.random((T, M)) < 0.2] = np.nan
        if trial % 10 == 0:
            x[rng.random((T, M)) < 0.1] = np.inf * rng.choice([-1, 1])
        yield x


def test_typical_step_numpy_twin_is_torch_bit_for_bit():
    for x in _screen_inputs():
        want = R._typical_step(torch.as_tensor(x)).numpy()
        assert _same(R._typical_step(x), want)
        one = R._typical_step(x[:, 0])  # (numpy in: the twin; a numpy scalar out)
        assert isinstance(one, np.float64) and _same(one, want[0])
        if x.shape[0] >= 2:
            X, n = R._observed_first(torch.as_tensor(x))
            Xn, nn = R._observed_first(x)
            assert _same(Xn, X) and np.array_equal(nn, n.numpy())
