"""Property-based tests of the core filter and smoother on random models (hypothesis).

Each property is an identity that holds for every valid model, so hypothesis searches the model
space (lengths, lane counts, missing data, diffuse or proper priors, time-varying parameters,
extreme-but-valid magnitudes) for a counterexample:

- the parallel backend equals the sequential reference;
- the information form equals the covariance form (tests/helpers.covariance_filter);
- an observation of precision 0 (obs_var = inf) is no observation: the result equals the filter of
  the sequence with that step removed and its dynamics composed into the next step;
- splitting a sequence and continuing from ``final`` via ``init=`` equals one pass;
- permuting lanes permutes the results;
- variances are positive, never above the one-step prior's, and never above the prior's where no
  process noise is added and ``|decay| <= 1``.

Models are drawn as a few structural choices plus a seed for the numeric arrays, which keeps the
examples cheap and lets hypothesis shrink the structure. Settings stay small (``max_examples`` of
a few dozen, no deadline) so the file runs in well under a minute on two cores.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kalmanscan as ks
from kalmanscan.testing import assert_close, rel_error, tolerance
from tests.helpers import covariance_filter

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FIELDS = ("mean", "var", "precision", "info", "pred_mean", "pred_var")
DTYPES = [np.float64, np.float32]


@st.composite
def models(draw, max_T=160, max_N=4, allow_unit_decay=True):
    """A random valid model: dict with z, obs_var, decay, process_var, loading, offset, prior."""
    T = draw(st.sampled_from([1, 2, 3, 31, 32, 33, 63, 64, 65]) | st.integers(1, max_T))
    N = draw(st.integers(1, max_N))
    seed = draw(st.integers(0, 2**32 - 1))
    missing = draw(st.sampled_from([0.0, 0.3, 0.9]))
    time_varying = draw(st.booleans())
    diffuse = draw(st.booleans())
    # magnitudes spanning several decades, all within the documented valid domain
    obs_scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    proc_scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 1e2]))
    decay_kind = draw(
        st.sampled_from(
            ["stable", "unit", "mixed-sign", "forget"]
            if allow_unit_decay
            else ["stable", "mixed-sign", "forget"]
        )
    )
    rng = np.random.default_rng(seed)
    shape = (T, N) if time_varying else (1, N)
    if decay_kind == "stable":
        decay = rng.uniform(0.0, 0.99, shape)
    elif decay_kind == "unit":
        decay = np.ones(shape)
    elif decay_kind == "mixed-sign":
        decay = rng.uniform(-1.02, 1.02, shape)
    else:  # some steps forget the past completely
        decay = np.where(rng.random(shape) < 0.3, 0.0, rng.uniform(-0.9, 0.9, shape))
    if proc_scale == 0:
        # Without process noise a contracting state's precision grows like decay**(-2t); keep it
        # representable in float32 over max_T steps (test_extremes pins the overflow regime).
        decay = np.where(decay == 0, 0.0, np.sign(decay) * np.maximum(np.abs(decay), 0.8))
    process_var = proc_scale * rng.uniform(0.0, 1.0, shape)
    process_var = np.where(
        decay == 0, np.maximum(process_var, 0.1), process_var
    )  # a = p = 0 is rejected
    obs_var = obs_scale * rng.uniform(0.1, 10.0, shape)
    loading = rng.uniform(0.3, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    offset = rng.normal(size=shape)
    x = rng.normal(size=N) * 3
    z = np.empty((T, N))
    for t in range(T):
        i = t if time_varying else 0
        x = decay[i] * x + offset[i] + rng.normal(size=N) * np.sqrt(process_var[i])
        z[t] = loading[i] * x + rng.normal(size=N) * np.sqrt(obs_var[i])
    z[rng.random((T, N)) < missing] = np.nan
    prior = dict(
        prior_mean=rng.normal(size=N),
        prior_var=np.full(N, np.inf) if diffuse else rng.uniform(0.1, 5.0, N),
    )
    return dict(
        z=z,
        obs_var=obs_var,
        decay=decay,
        process_var=process_var,
        loading=loading,
        offset=offset,
        **prior,
    )


def _filter(m, dtype=np.float64, backend="auto", **over):
    kw = {k: np.asarray(v, dtype) for k, v in {**m, **over}.items()}
    return ks.filter(**kw, backend=backend)


def _params_full(m):
    T, N = m["z"].shape
    return {
        k: np.broadcast_to(m[k], (T, N)).copy()
        for k in ("obs_var", "decay", "process_var", "loading", "offset")
    }


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@SETTINGS
@given(m=models())
def test_parallel_equals_sequential(dtype, m):
    if dtype == np.float32:
        # float32 is checked on well-conditioned models (docs/reliability.md measures the rest)
        m["decay"] = np.clip(m["decay"], -0.98, 0.98)
        m["process_var"] = np.where(
            m["decay"] ** 2 < 1e-3, np.maximum(m["process_var"], 0.1), m["process_var"]
        )
    par = _filter(m, dtype, "torch")
    seq = _filter(m, dtype, "sequential")
    for f in FIELDS:
        a, b = getattr(par, f), getattr(seq, f)
        assert a.dtype == dtype
        assert_close(a, b, "parallel", np.dtype(dtype), what=f)
    assert_close(
        par.loglik,
        seq.loglik,
        "parallel",
        np.dtype(dtype),
        scale=max(1.0, float(np.abs(seq.loglik).max())),
        what="loglik",
    )


@SETTINGS
@given(m=models(max_T=120, max_N=3))
def test_information_form_equals_covariance_form(m):
    with np.errstate(
        invalid="ignore", divide="ignore"
    ):  # the reference's RTS divides inf/inf on diffuse steps
        ref = covariance_filter(**m)
    res = ks.filter(**m)
    sm = ks.smooth(**m)
    # Quantities of steps where the covariance form is finite (the exact-diffuse start leaves
    # pred_var inf until the first observation; the information form reports the same inf).
    for f, key in [("var", "var"), ("pred_var", "pred_var")]:
        assert_close(getattr(res, f), ref[key], "truth", "float64", what=f)
    for f, key, var in [("mean", "mean", "var"), ("pred_mean", "pred_mean", "pred_var")]:
        fin = np.isfinite(ref[var])
        assert np.isnan(getattr(res, f)[~fin]).all(), f"{f} must be NaN where nothing is known"
        assert_close(
            getattr(res, f)[fin],
            ref[key][fin],
            "truth",
            "float64",
            scale=max(1.0, float(np.abs(ref[key][fin]).max(initial=0))),
            what=f,
        )
    assert_close(
        res.loglik,
        ref["loglik"],
        "truth",
        "float64",
        scale=max(1.0, float(np.abs(ref["loglik"]).max())),
        what="loglik",
    )
    # The backward RTS recursion multiplies rounding errors by the gains J_t = a P_t / P^-_{t+1},
    # which exceed 1 when there is no process noise (J = 1/a): both forms then lose accuracy in
    # proportion to the largest product of gains, the condition number of the smoothing problem.
    fin = np.isfinite(ref["svar"])
    tol = rel_tol_smoother(m, ref)
    err_v = rel_error(sm.var[fin], ref["svar"][fin])
    err_m = rel_error(
        sm.mean[fin],
        ref["smean"][fin],
        scale=max(1.0, float(np.abs(ref["smean"][fin]).max(initial=0))),
    )
    assert err_v <= tol and err_m <= tol, (
        f"smoothed var/mean errors {err_v:.2e}/{err_m:.2e} exceed {tol:.2e}"
    )


def rel_tol_smoother(m, ref):
    T, N = m["z"].shape
    base = tolerance("truth", "float64")
    if T < 2:
        return base
    a = np.broadcast_to(m["decay"], (T, N))
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.abs(a[1:] * ref["var"][:-1] / ref["pred_var"][1:])
    gain = np.where(np.isfinite(gain), gain, 1.0)
    amp = np.cumprod(np.maximum(gain[::-1], 1.0), axis=0).max()  # worst product of gains >= 1
    return base * max(1.0, float(amp))


@SETTINGS
@given(m=models(max_T=80), data=st.data())
def test_precision_zero_observation_is_no_observation(m, data):
    """obs_var = inf at step t == the sequence without step t, its dynamics composed into t+1."""
    z = m["z"]
    T, N = z.shape
    if T < 2:
        return
    t = data.draw(st.integers(0, T - 2), label="step")
    full = _params_full(m)
    obs_inf = full["obs_var"].copy()
    obs_inf[t] = np.inf
    z_obs = np.where(np.isnan(z), 1.2345, z)  # a finite value at the blind step must not matter
    res = ks.filter(
        np.where(np.arange(T)[:, None] == t, z_obs, z),
        obs_inf,
        full["decay"],
        full["process_var"],
        loading=full["loading"],
        offset=full["offset"],
        prior_mean=m["prior_mean"],
        prior_var=m["prior_var"],
    )
    # Remove step t: x_{t+1} = a1 (a0 x + c0 + w0) + c1 + w1.
    a0, p0, c0 = full["decay"][t], full["process_var"][t], full["offset"][t]
    a1, p1, c1 = full["decay"][t + 1], full["process_var"][t + 1], full["offset"][t + 1]
    keep = np.arange(T) != t
    red = {k: v[keep].copy() for k, v in full.items()}
    red["decay"][t] = a1 * a0
    red["process_var"][t] = a1 * a1 * p0 + p1
    red["offset"][t] = a1 * c0 + c1
    if np.any((red["decay"][t] ** 2 == 0) & (red["process_var"][t] == 0)):
        return  # the composed step is deterministic: outside the API's domain
    ref = ks.filter(
        z[keep],
        red["obs_var"],
        red["decay"],
        red["process_var"],
        loading=red["loading"],
        offset=red["offset"],
        prior_mean=m["prior_mean"],
        prior_var=m["prior_var"],
    )
    for f in ("mean", "var", "precision", "info"):
        got = getattr(res, f)[keep]
        assert_close(
            got,
            getattr(ref, f),
            "truth",
            "float64",
            scale=max(
                1.0,
                float(
                    np.nanmax(
                        np.abs(np.where(np.isfinite(getattr(ref, f)), getattr(ref, f), 0)),
                        initial=0,
                    )
                ),
            ),
            what=f,
        )
    assert_close(
        res.loglik,
        ref.loglik,
        "truth",
        "float64",
        scale=max(1.0, float(np.abs(ref.loglik).max())),
        what="loglik",
    )
    # and the blind step itself is the prediction (to rounding: lam comes from the scan, lam_pred is
    # recomputed from lam_{t-1})
    assert_close(
        res.precision[t], res.pred_precision[t], "parallel", "float64", what="blind-step precision"
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@SETTINGS
@given(m=models(max_T=160, allow_unit_decay=False), data=st.data())
def test_split_and_continue_equals_one_pass(dtype, m, data):
    z = m["z"]
    T = z.shape[0]
    if T < 2:
        return
    k = data.draw(st.integers(1, T - 1), label="split")
    full = _params_full(m)
    one = _filter(m, dtype)
    head = {kk: v[:k] for kk, v in full.items()}
    tail = {kk: v[k:] for kk, v in full.items()}
    f1 = _filter(dict(z=z[:k], **head, prior_mean=m["prior_mean"], prior_var=m["prior_var"]), dtype)
    kw = {kk: v.astype(dtype) for kk, v in tail.items()}
    f2 = ks.filter(
        z[k:].astype(dtype),
        kw.pop("obs_var"),
        kw.pop("decay"),
        kw.pop("process_var"),
        init=f1.final,
        **kw,
    )
    for f in FIELDS:
        joined = np.concatenate([getattr(f1, f), getattr(f2, f)])
        assert_close(joined, getattr(one, f), "parallel", np.dtype(dtype), what=f)
    assert_close(
        f1.loglik + f2.loglik,
        one.loglik,
        "parallel",
        np.dtype(dtype),
        scale=max(1.0, float(np.abs(one.loglik).max())),
        what="loglik",
    )
    assert_close(f2.final.lam, one.final.lam, "parallel", np.dtype(dtype), what="final.lam")
    assert_close(
        f2.final.eta,
        one.final.eta,
        "parallel",
        np.dtype(dtype),
        scale=max(1.0, float(np.abs(one.final.eta).max())),
        what="final.eta",
    )


@SETTINGS
@given(m=models(max_T=100, max_N=6), data=st.data())
def test_permuting_lanes_permutes_results(m, data):
    N = m["z"].shape[1]
    perm = np.asarray(data.draw(st.permutations(range(N)), label="perm"))
    base = _filter(m)
    pm = {k: (np.asarray(v)[..., perm] if np.ndim(v) >= 1 else v) for k, v in m.items()}
    moved = _filter(pm)
    for f in FIELDS:
        assert_close(getattr(moved, f), getattr(base, f)[:, perm], "parallel", "float64", what=f)
    assert_close(
        moved.loglik,
        base.loglik[perm],
        "parallel",
        "float64",
        scale=max(1.0, float(np.abs(base.loglik).max())),
        what="loglik",
    )
    assert_close(moved.final.lam, base.final.lam[perm], "parallel", "float64", what="final.lam")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@SETTINGS
@given(m=models(max_T=160))
def test_variances_positive_and_bounded(dtype, m):
    res = _filter(m, dtype)
    var, pvar = res.var, res.pred_var
    assert not np.isnan(var).any() and not np.isnan(pvar).any()
    assert (var > 0).all() and (pvar > 0).all()
    # an observation never increases the variance (small dtype slack)
    slack = 1 + 50 * np.finfo(dtype).eps
    assert (var <= pvar * slack).all()
    sm = ks.smooth(
        *(np.asarray(m[k], dtype) for k in ("z", "obs_var", "decay", "process_var")),
        loading=np.asarray(m["loading"], dtype),
        offset=np.asarray(m["offset"], dtype),
        prior_mean=np.asarray(m["prior_mean"], dtype),
        prior_var=np.asarray(m["prior_var"], dtype),
    )
    assert not np.isnan(sm.var).any() and (sm.var > 0).all()
    assert (sm.var <= var * slack).all(), "smoothing never increases the variance"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@SETTINGS
@given(m=models(max_T=160), data=st.data())
def test_no_process_noise_never_exceeds_the_prior(dtype, m, data):
    """process_var = 0 and |decay| <= 1: every variance is at most the prior's (and shrinks)."""
    T, N = m["z"].shape
    shape = np.shape(m["decay"])
    # |decay| >= 0.8 keeps the growing precision representable in float32 (see models())
    level = data.draw(st.sampled_from([0.9, 0.999, 1.0, -1.0]), label="decay")
    vary = data.draw(st.booleans(), label="vary")
    m["decay"] = level * (
        np.random.default_rng(T).uniform(0.9, 1.0, shape) if vary else np.ones(shape)
    )
    m["process_var"] = np.zeros(shape)
    m["prior_var"] = np.random.default_rng(N).uniform(0.1, 5.0, N)
    res = _filter(m, dtype)
    slack = 1 + 50 * np.finfo(dtype).eps
    assert (res.var > 0).all() and (res.pred_var > 0).all()
    prior_var = np.asarray(m["prior_var"], dtype)
    assert (res.var <= prior_var * slack).all()
    assert (res.pred_var <= prior_var * slack).all()
    assert (res.var[1:] <= res.var[:-1] * slack).all(), (
        "without process noise the variance never grows"
    )
