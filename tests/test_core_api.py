"""Public API of the core: types in and out, broadcasting, conventions, bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import kalmanscan as ks
from kalmanscan.testing import assert_close, tolerance


def test_numpy_in_numpy_out_dtype_kept():
    z = np.arange(10, dtype=np.float32)
    r = ks.filter(z, 1.0, 0.9, 0.1)
    assert (
        isinstance(r.mean, np.ndarray) and r.mean.dtype == np.float32 and r.var.dtype == np.float32
    )
    r = ks.filter(z.astype(np.float64), 1.0, 0.9, 0.1)
    assert r.mean.dtype == np.float64
    r = ks.filter(list(range(5)), 1.0, 0.9, 0.1)  # integers / lists become float64
    assert r.mean.dtype == np.float64 and isinstance(r.loglik, float | np.floating)


def test_torch_in_torch_out_with_autograd():
    z = torch.linspace(0, 1, 50, dtype=torch.float32)
    pv = torch.tensor(0.1, requires_grad=True)
    r = ks.filter(z, 1.0, 0.9, pv)
    assert isinstance(r.mean, torch.Tensor) and r.mean.dtype == torch.float32
    r.loglik.backward()
    assert pv.grad is not None and torch.isfinite(pv.grad)


def test_time_axis_and_lanes():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(3, 40, 2))
    a = ks.filter(z, 1.0, 0.8, 0.2, axis=1)
    b = ks.filter(np.moveaxis(z, 1, 0), 1.0, 0.8, 0.2)
    np.testing.assert_allclose(
        a.mean, np.moveaxis(b.mean, 0, 1), rtol=tolerance("identical", "float64")
    )
    assert a.loglik.shape == (3, 2) and a.final.lam.shape == (3, 2)
    c = ks.filter(z, 1.0, 0.8, 0.2, axis=-2)
    np.testing.assert_array_equal(a.mean, c.mean)


def test_time_varying_parameters_broadcast():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(30, 4))
    ov = rng.uniform(0.5, 1.5, (30, 1))  # varies along time, shared by lanes
    pv = rng.uniform(0.1, 0.3, 4)  # per lane
    r = ks.filter(z, ov, 0.9, pv)
    for n in range(4):
        rn = ks.filter(z[:, n], ov[:, 0], 0.9, pv[n])
        np.testing.assert_allclose(r.mean[:, n], rn.mean, rtol=tolerance("identical", "float64"))


def test_missing_by_nan_or_infinite_obs_var_and_unknown_lanes():
    z = np.array([[np.nan, 1.0], [np.nan, 2.0], [3.0, np.nan]])
    ov = np.array([[1.0, 1.0], [1.0, np.inf], [1.0, 1.0]])
    r = ks.filter(z, ov, 1.0, 0.5)
    assert np.isnan(r.mean[0, 0]) and r.var[0, 0] == math.inf and r.precision[0, 0] == 0
    assert np.isfinite(r.mean[2, 0])
    r2 = ks.filter(np.array([[np.nan, 1.0], [np.nan, np.nan], [3.0, np.nan]]), 1.0, 1.0, 0.5)
    np.testing.assert_allclose(r.mean, r2.mean, rtol=tolerance("identical", "float64"))
    never = ks.smooth(np.full(5, np.nan), 1.0, 0.9, 0.1)
    assert np.isnan(never.mean).all() and np.isinf(never.var).all() and never.filtered.loglik == 0


def test_total_forgetting_step_even_after_diffuse_past():
    # decay 0: x_t = offset + w, whatever came before (also a diffuse past)
    r = ks.filter(np.array([np.nan, np.nan, 2.0]), 1.0, np.array([1.0, 0.0, 1.0]), 0.5, offset=3.0)
    assert r.pred_var[0] == math.inf and r.pred_var[1] == 0.5 and r.pred_mean[1] == 3.0
    assert math.isclose(r.pred_var[2], 1.0)


def test_final_state_continues_the_filter():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(100, 3))
    whole = ks.filter(z, 1.0, 0.95, 0.1)
    first = ks.filter(z[:60], 1.0, 0.95, 0.1)
    rest = ks.filter(z[60:], 1.0, 0.95, 0.1, init=first.final)
    tol = tolerance("rounding", "float64")
    np.testing.assert_allclose(rest.mean, whole.mean[60:], rtol=tol)
    np.testing.assert_allclose(first.loglik + rest.loglik, whole.loglik, rtol=tol)


def test_discretize_ou_limits():
    a, p = ks.discretize_ou(0.0, 2.0, 0.25)
    assert a == 1.0 and p == 0.5  # exactly sigma2 * dt
    theta, dt = 1e-12, 1e-3
    a, p = ks.discretize_ou(theta, 1.0, dt)
    assert p == dt * (1 - theta * dt)  # exact: the old bound, 1e-25, was below one ulp of p
    a, p = ks.discretize_ou(np.array([0.5, 2.0]), np.array([[1.0], [3.0]]), 0.1)
    assert a.shape == p.shape == (2, 2)
    assert_close(p[1, 1], 3.0 / 4.0 * (1 - math.exp(-0.4)), "identical", "float64")
    t = torch.tensor(0.3, requires_grad=True)
    a, p = ks.discretize_ou(t, 1.0, torch.tensor([0.0, 1.0]))
    (a.sum() + p.sum()).backward()
    assert torch.isfinite(t.grad)


@pytest.mark.parametrize(
    "theta, sigma2, dt",
    [
        (0.5, 1e300, 1e300),  # sigma2 * dt overflows, p = 1e300
        (1e300, 1.0, 1e300),  # 2 theta dt overflows, p = 5e-301
        (1e308, 1e308, 1.0),  # 2 theta overflows, p = 0.5
        (0.3, 1e-200, 1e100),
        (1e-300, 2.0, 1e5),
        (1.0, 2.0, 0.5),  # an ordinary step on either side of x = 1
        (2.0, 1.0, 0.2500001),
        (1e-5, 1.0, 5.0),
    ],
)
def test_discretize_ou_extreme_ranges(theta, sigma2, dt):
    """Against a 50-digit mpmath truth: p stays in range wherever it is representable (it was inf
    for theta = 0.5, sigma2 = dt = 1e300 and 0 for theta = dt = 1e300)."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    th, s2, h = mp.mpf(theta), mp.mpf(sigma2), mp.mpf(dt)
    true_a, true_p = mp.exp(-th * h), s2 / (2 * th) * -mp.expm1(-2 * th * h)
    a, p = ks.discretize_ou(np.float64(theta), np.float64(sigma2), np.float64(dt))
    assert float(abs((mp.mpf(float(p)) - true_p) / true_p)) < 1e-15
    assert float(abs(mp.mpf(float(a)) - true_a)) <= 1e-16 * float(true_a) or float(true_a) < 1e-300


def test_import_is_light():
    code = (
        "import sys, kalmanscan; "
        "print([m for m in ('triton', 'xarray', 'matplotlib', 'scipy') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


Z = np.ones(5)
BAD = [
    ("z-none", dict(z=None), TypeError, "z"),
    ("z-string", dict(z="abc"), TypeError, "z"),
    ("z-object", dict(z=[1, "a"]), TypeError, "z"),
    ("z-complex", dict(z=np.ones(3) * 1j), TypeError, "z"),
    ("z-bool", dict(z=np.ones(3, bool)), TypeError, "z"),
    ("z-scalar", dict(z=1.0), ValueError, "z"),
    ("z-empty", dict(z=np.ones(0)), ValueError, "time step"),
    ("z-inf", dict(z=np.array([1.0, np.inf])), ValueError, "z"),
    ("z-int-tensor", dict(z=torch.ones(3, dtype=torch.int64)), TypeError, "z"),
    ("obs_var-negative", dict(obs_var=-1.0), ValueError, "obs_var"),
    ("obs_var-zero", dict(obs_var=0.0), ValueError, "obs_var"),
    ("obs_var-nan", dict(obs_var=np.nan), ValueError, "obs_var"),
    ("process_var-negative", dict(process_var=-0.1), ValueError, "process_var"),
    ("process_var-nan", dict(process_var=np.nan), ValueError, "process_var"),
    ("process_var-inf", dict(process_var=np.inf), ValueError, "process_var"),
    ("decay-nan", dict(decay=np.nan), ValueError, "decay"),
    ("decay-inf", dict(decay=np.inf), ValueError, "decay"),
    ("loading-nan", dict(loading=np.nan), ValueError, "loading"),
    ("offset-inf", dict(offset=np.inf), ValueError, "offset"),
    ("prior_var-negative", dict(prior_var=-1.0), ValueError, "prior_var"),
    ("prior_var-nan", dict(prior_var=np.nan), ValueError, "prior_var"),
    ("prior_mean-nan", dict(prior_mean=np.nan), ValueError, "prior_mean"),
    ("shape-mismatch", dict(obs_var=np.ones(4)), ValueError, "obs_var"),
    ("prior-shape", dict(z=np.ones((5, 2)), prior_mean=np.ones(3)), ValueError, "prior_mean"),
    ("axis-range", dict(axis=1), ValueError, "axis"),
    ("axis-type", dict(axis=0.5), TypeError, "axis"),
    ("backend-name", dict(backend="cuda"), ValueError, "backend"),
    ("backend-triton-cpu", dict(backend="triton"), ValueError, "backend"),
    ("init-type", dict(init=3.0), TypeError, "init"),
    ("init-negative", dict(init=ks.InfoState(-1.0, 0.0)), ValueError, "init.lam"),
    ("init-inconsistent", dict(init=ks.InfoState(0.0, 1.0)), ValueError, "init.eta"),
    ("mixed-dtype-param", dict(obs_var=np.array(["x"])), TypeError, "obs_var"),
]


@pytest.mark.parametrize("case,kw,exc,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named(case, kw, exc, needle):
    args = dict(z=Z, obs_var=1.0, decay=0.9, process_var=0.1)
    args.update(kw)
    with pytest.raises(exc, match=needle):
        ks.filter(
            args.pop("z"), args.pop("obs_var"), args.pop("decay"), args.pop("process_var"), **args
        )


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(theta=-1.0), "theta"),
        (dict(sigma2=np.nan), "sigma2"),
        (dict(dt=-0.1), "dt"),
        (dict(dt=np.inf), "dt"),
        (dict(theta=np.ones(2), dt=np.ones(3)), "broadcast"),
        (dict(theta="a"), "theta"),
    ],
)
def test_discretize_bad_input(kw, needle):
    args = dict(theta=1.0, sigma2=1.0, dt=1.0)
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=needle):
        ks.discretize_ou(**args)


def test_mismatched_devices():
    other = "cuda" if torch.cuda.is_available() else "meta"
    with pytest.raises(ValueError, match="obs_var"):
        ks.filter(torch.ones(3), torch.ones(3, device=other), 0.9, 0.1)


def test_docstring_examples_run():
    import doctest

    import kalmanscan.core.discretize
    import kalmanscan.core.filter

    for mod in (kalmanscan, kalmanscan.core.filter, kalmanscan.core.discretize):
        res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert res.failed == 0 and res.attempted > 0, mod.__name__


def test_core_api_doc_examples_run():
    import doctest
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "api-core.md"
    res = doctest.testfile(str(doc), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_readme_python_example_runs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    # the example's results are the documented ones (docstring of ks.filter / ks.smooth); the
    # bounds are half a unit of the last digit those docs print, not numerical tolerances
    np.testing.assert_allclose(scope["res"].var, [0.1, 0.0524, 0.0624, 0.042], atol=5e-5)
    np.testing.assert_allclose(scope["sm"].var, [0.0392, 0.0365, 0.0398, 0.042], atol=5e-5)
    assert float(scope["ll"]) == pytest.approx(-0.749, abs=5e-4)
    assert float(scope["res"].loglik) == float(scope["ll"])
    assert scope["a"].shape == scope["p"].shape == (3,)


def test_numpy_float64_scalars_are_plain_numbers():
    """numpy float64 scalars (``np.exp(-0.1)``) take the Python floats' path (kept constants, no
    conversion a call): the same results bit for bit, float32 data staying float32."""
    from kalmanscan.core._args import _plain_number

    assert _plain_number(np.float64(0.5)) and not _plain_number(np.float32(0.5))
    z = np.random.default_rng(3).normal(size=50).cumsum()
    d = np.exp(-0.1)
    for data in (z, z.astype(np.float32)):
        a = ks.filter(data, np.float64(0.5), d, (1 - d * d) / 0.2, prior_var=np.float64(4.0))
        b = ks.filter(data, 0.5, float(d), float((1 - d * d) / 0.2), prior_var=4.0)
        for k in ("mean", "var", "loglik"):
            assert getattr(a, k).dtype == data.dtype
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
