"""OUModel's per-call shortcuts give the straightforward path's results bit for bit.

The shortcuts (``kalmanscan.timeseries.model_numerics``): the OU transition of host float64
inputs checked on the host and computed by ``ou_transition`` without ``discretize_ou``'s
conversions (``_discretize``), small ones remembered (``_discretize_small``); the unit's
parameters given as one number reduced without arrays (``_one_number``); one-number filter
arguments handed over as Python floats (``model._plain_floats``). Each case is run with them,
twice (the second call meets the remembered transition), and with all of them replaced by the
straightforward calls, and compared with ``np.array_equal`` (NaN in place, signs of zeros and
dtypes too).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import kalmanscan.core.filter as filter_api
from kalmanscan.core.discretize import discretize_ou
from kalmanscan.timeseries import model as model_mod
from kalmanscan.timeseries import model_numerics as mn
from kalmanscan.timeseries.model import OUModel


def _straightforward(monkeypatch):
    monkeypatch.setattr(mn, "_discretize", discretize_ou)
    monkeypatch.setattr(mn, "_discretize_small", discretize_ou)
    monkeypatch.setattr(mn, "_one_number", lambda v: None)
    monkeypatch.setattr(model_mod, "_one_number", lambda v: None)
    monkeypatch.setattr(model_mod, "_plain_floats", lambda args: args)


def _flat(x, prefix="") -> dict:
    """A result (number, array, tensor or NamedTuple of them) as ``{path: numpy array}``."""
    if hasattr(x, "_fields"):
        out = {}
        for f in x._fields:
            out.update(_flat(getattr(x, f), f"{prefix}.{f}"))
        return out
    if isinstance(x, torch.Tensor):
        return {prefix: (x.detach().numpy(), "tensor", x.dtype)}
    return {prefix: (np.asarray(x), type(x).__name__, np.asarray(x).dtype)}


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        (x, tx, dx), (y, ty, dy) = a[k], b[k]
        if (tx, dx, x.shape) != (ty, dy, y.shape):
            return False
        if not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            return False
        if x.dtype.kind == "f" and not (np.signbit(x) == np.signbit(y)).all():
            return False
    return True


_RNG = np.random.default_rng(7)
_Z = np.cumsum(_RNG.normal(size=100))
_ZMISS = _Z.copy()
_ZMISS[[0, 5, 6, 50, 99]] = np.nan
_Z2 = np.cumsum(_RNG.normal(size=(100, 3)), 0)
_Z2[3, 1] = np.nan
_IRR = np.concatenate([[0.0], np.cumsum(_RNG.exponential(size=99))])
_FEW = np.concatenate([[0.0], np.cumsum(_RNG.choice([1.0, 2.0, 7.0], size=99))])
_DAYS = np.datetime64("2020-01-01") + np.arange(100).astype("timedelta64[D]")

MODELS = {
    "ou": dict(theta=0.1, sigma2=1.0, obs_var=0.5),
    "ou-mu": dict(theta=0.3, sigma2=2.0, mu=1.5, obs_var=0.2),
    "theta0-diffuse": dict(theta=0.0, sigma2=1.0, obs_var=0.5),
    "theta0-proper": dict(theta=0.0, sigma2=1.0, obs_var=0.5, prior_mean=0.2, prior_var=3.0),
    "prior-mean-only": dict(theta=0.2, sigma2=1.0, obs_var=0.5, prior_mean=1.0),
    "large": dict(theta=0.1, sigma2=1e6, mu=1e3, obs_var=1e4),
    "per-step-obs-var": dict(theta=0.1, sigma2=1.0, obs_var=np.linspace(0.1, 1.0, 100)[:, None]),
    "per-series": dict(
        theta=np.array([0.0, 0.1, 1.0]), sigma2=np.array([1.0, 2.0, 0.5]), obs_var=0.5
    ),
    "tensor-params": dict(
        theta=torch.tensor(0.1, dtype=torch.float64),
        sigma2=torch.tensor(1.0, dtype=torch.float64),
        obs_var=0.5,
    ),
}
DATA = {
    "f64": _Z,
    "missing-f64": _ZMISS,
    "f32": _ZMISS.astype(np.float32),
    "2d-f64": _Z2,
    "2d-f32": _Z2.astype(np.float32),
    "tiny-scale": _Z * 1e-150,
    "short": _Z[:3],
    "torch": torch.tensor(_ZMISS),
}
TIMES = {"none": None, "float-regular": np.arange(100.0), "irregular": _IRR, "few-steps": _FEW,
         "datetime64": _DAYS}  # fmt: skip

CASES = [
    pytest.param(m, d, t, id=f"{m}-{d}-{t}")
    for m in MODELS
    for d in DATA
    for t in TIMES
    if not (m in ("per-step-obs-var", "per-series") and np.ndim(DATA[d]) != 2)
    and not (m == "tensor-params" and t not in ("none", "irregular"))
]


def _run(model, z, times) -> dict:
    out = {}
    for name, call in (
        ("loglik", lambda: model.loglik(z, times)),
        ("filter", lambda: model.filter(z, times)),
        ("smooth", lambda: model.smooth(z, times)),
        ("forecast", lambda: model.forecast(z, times, steps=2)),
    ):
        try:
            out.update(_flat(call(), name))
        except (ValueError, TypeError, OverflowError) as e:  # (the same refusal either way)
            out[name] = (np.asarray(f"{type(e).__name__}: {e}"), "error", None)
    return out


@pytest.mark.parametrize("m, d, t", CASES)
def test_results_bit_for_bit(m, d, t, monkeypatch):
    model, z = OUModel(**MODELS[m]), DATA[d]
    times = None if TIMES[t] is None else TIMES[t][: z.shape[0]]
    mn._SMALL_CACHE.clear()
    fast = _run(model, z, times)
    again = _run(model, z, times)  # (the transition remembered)
    with monkeypatch.context() as mp:
        _straightforward(mp)
        ref = _run(model, z, times)
    assert _same(fast, ref), m
    assert _same(again, ref), m


def test_checks_refuse_with_the_same_messages(monkeypatch):
    def message(f):
        with pytest.raises(ValueError) as e:
            f()
        return str(e.value)

    dt = np.array([0.0, 1.0])
    for args in [
        (0.1, np.array([1.0, np.nan]), dt),
        (0.1, np.array([1.0, np.inf]), dt),
        (-0.5, 1.0, dt),
        (0.1, 1.0, np.array([0.0, -1.0])),
        (np.array([0.1, 0.2, 0.3]), 1.0, dt),  # (shapes that do not broadcast)
    ]:
        want = message(lambda a=args: discretize_ou(*a))
        assert message(lambda a=args: mn._discretize(*a)) == want
        assert message(lambda a=args: mn._discretize_small(*a)) == want
    bad = OUModel(obs_var=np.ones((100, 1)))
    want = re.escape("obs_var: expected a scalar or values broadcasting to the data's shape")
    with pytest.raises(ValueError, match=want):
        bad.loglik(_Z)


def test_host_call_skips_the_checked_conversions(monkeypatch):
    """A 100-step float64 call discretizes its two distinct steps once, by ``ou_transition``
    (not ``discretize_ou``'s conversions and read-back), and a second call of the same scale
    not at all; the filter gets the one-number arguments as Python floats."""
    calls = {"discretize_ou": 0, "ou_transition": 0}
    seen = {}

    def count(name, f):
        def wrapped(*a, **k):
            calls[name] += 1
            return f(*a, **k)

        return wrapped

    loglik = filter_api.loglik

    def spy(z, **kw):
        seen.update(kw)
        return loglik(z, **kw)

    monkeypatch.setattr(mn, "discretize_ou", count("discretize_ou", mn.discretize_ou))
    monkeypatch.setattr(mn, "ou_transition", count("ou_transition", mn.ou_transition))
    monkeypatch.setattr(model_mod.filter_api, "loglik", spy)
    mn._SMALL_CACHE.clear()
    model = OUModel(theta=0.1, sigma2=1.0, obs_var=0.5)
    first = model.loglik(_Z)
    assert calls == {"discretize_ou": 0, "ou_transition": 1}
    assert model.loglik(_Z) == first
    assert calls == {"discretize_ou": 0, "ou_transition": 1}
    assert all(type(seen[k]) is float for k in ("obs_var", "prior_mean", "prior_var"))


def test_remembered_transition_is_read_only():
    mn._SMALL_CACHE.clear()
    dt = np.array([0.0, 1.0])
    decay, process_var = mn._discretize_small(0.1, 1.0, dt)
    again = mn._discretize_small(0.1, 1.0, dt.copy())
    assert again[0] is decay and not decay.flags.writeable and not process_var.flags.writeable
    # (-0.0 is its own key: the bits, not the value, name an entry)
    assert mn._discretize_small(-0.0, 1.0, dt)[0] is not decay


def _step_classes_by_unique(dt):
    """``step_classes`` with the sample's distinct steps counted by ``np.unique``."""
    bits = dt.view(np.uint64)
    if dt.shape[0] < 4 or (bits[1:] == bits[1]).all():
        return mn.step_classes(dt)
    sample = bits[: mn._STEP_SAMPLE]
    if np.unique(sample).size * 8 > sample.size:
        return None
    values, inverse = np.unique(bits, return_inverse=True)
    return values.view(dt.dtype), inverse


@pytest.mark.parametrize("T", [4, 9, 63, 64, 65, 100, 4096, 5000])
@pytest.mark.parametrize("distinct", [1, 2, 3, 7, 8, 9, 13, 500])
def test_step_classes_count_as_unique(T, distinct):
    """The sample's distinct steps counted on its sorted bits decide as ``np.unique``'s count,
    at the one-in-eight bound too (``distinct * 8`` against the sample size)."""
    rng = np.random.default_rng(T * 1000 + distinct)
    pool = np.concatenate([[0.5, -0.0, 0.0, 1.0, 2.0, 3.0, 7.0], rng.exponential(size=600)])
    steps = rng.choice(pool, size=distinct, replace=False)
    dt = np.concatenate([[0.0], rng.choice(steps, size=T - 1)])
    got, want = mn.step_classes(dt), _step_classes_by_unique(dt)
    assert (got is None) == (want is None)
    if got is not None and not got.regular:
        assert np.array_equal(got.values.view(np.uint64), want[0].view(np.uint64))
        assert np.array_equal(got.inverse, want[1])


_UNIT_DATA = {
    "plain": _Z,
    "f32": _Z.astype(np.float32),
    "missing": _ZMISS,
    "all-missing": np.full(5, np.nan),
    "zeros": np.zeros(5),
    "negative-zero": np.array([-0.0, 0.0]),
    "tiny": _Z * 1e-300,
    "subnormal": np.array([5e-324, -1e-310]),
    "huge": _Z * 1e300,
    "max": np.array([1.7e308, -1.0]),
    "power-of-two": np.array([4.0, -2.0]),
    "far-beyond-variances": np.array([1e300, 1.0]),
}
_UNIT_MODELS = {
    "ou": dict(theta=0.1, sigma2=1.0, obs_var=0.5),
    "mu": dict(theta=0.1, sigma2=1.0, mu=-3e5, obs_var=0.5),
    "proper": dict(sigma2=2.0, obs_var=1.5e4, prior_mean=7.0, prior_var=9.0),
    "diffuse-given": dict(sigma2=2.0, obs_var=1.0, prior_var=np.inf),
    "sigma2-0": dict(theta=0.0, sigma2=0.0, obs_var=1e-300),
    "tiny-vars": dict(theta=1.0, sigma2=1e-320, obs_var=1e-300),
    "huge-vars": dict(theta=1.0, sigma2=1e300, obs_var=1e308),
}


@pytest.mark.parametrize("d", _UNIT_DATA)
@pytest.mark.parametrize("m", _UNIT_MODELS)
@pytest.mark.parametrize("tau", [1.0, 1e-300, 1e300])
def test_unit_of_one_number_parameters_as_arrays(m, d, tau, monkeypatch):
    """The unit with parameters given as one number reduced without arrays is the array
    path's, at float64's ends too, warnings alike."""
    import warnings

    from kalmanscan.timeseries.times import as_time_axis

    model, z = OUModel(**_UNIT_MODELS[m]), _UNIT_DATA[d]
    ax = as_time_axis(None, z.shape[0])
    with warnings.catch_warnings(record=True) as fast_warnings:
        warnings.simplefilter("always")
        fast = model.unit(z, ax, tau=tau)
    monkeypatch.setattr(mn, "_one_number", lambda v: None)
    monkeypatch.setattr(model_mod, "_one_number", lambda v: None)
    with warnings.catch_warnings(record=True) as ref_warnings:
        warnings.simplefilter("always")
        ref = model.unit(z, ax, tau=tau)
    assert type(fast) is type(ref) and fast.dtype == ref.dtype and fast.shape == ref.shape
    assert np.array_equal(fast, ref), (fast, ref)
    assert [str(w.message) for w in fast_warnings] == [str(w.message) for w in ref_warnings]
