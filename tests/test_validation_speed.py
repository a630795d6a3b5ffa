"""The battery's cheaper truths compute what the plain calls compute, bit for bit, and its
timings say where the CPU time goes.

The filterpy truth gives filterpy a 1x1 inverse without ``np.linalg.inv``'s per-call overhead and
floats for ``z``; the dense oracle calls LAPACK's banded Cholesky without scipy's wrappers and
takes ``log det`` only where it uses it. None of that may change a single bit of a truth.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from kalmanscan.validation import battery, models, truths

needs_filterpy = pytest.mark.skipif(
    importlib.util.find_spec("filterpy") is None, reason="filterpy is not installed"
)


def _plain_filterpy(lane: models.Lane):
    """filterpy's ``KalmanFilter`` with its defaults (``np.linalg.inv``, ``z`` as 1x1 arrays) on
    a proper-prior lane, smoothed as the truth smooths (offset-free model ``x - d``)."""
    from filterpy.kalman import KalmanFilter

    a, p, h, c, R = lane.decay, lane.process_var, lane.loading, lane.offset, lane.obs_var
    obs, T = lane.observed, lane.T
    kf = KalmanFilter(dim_x=1, dim_z=1)
    kf.x, kf.P = np.array([[lane.prior_mean]]), np.array([[lane.prior_var]])
    xs, Ps, xps, Pps = kf.batch_filter(
        [np.array([[lane.z[t]]]) if obs[t] else None for t in range(T)],
        Fs=[np.array([[a[t]]]) for t in range(T)],
        Qs=[np.array([[p[t]]]) for t in range(T)],
        Hs=[np.array([[h[t]]]) for t in range(T)],
        Rs=[np.array([[R[t] if obs[t] else 1.0]]) for t in range(T)],
        Bs=[np.eye(1)] * T,
        us=[np.array([[c[t]]]) for t in range(T)],
    )
    d = np.zeros(T)
    for t in range(1, T):
        d[t] = a[t] * d[t - 1] + c[t]
    xsm, Psm, _, _ = kf.rts_smoother(
        (xs[:, 0, 0] - d).reshape(T, 1, 1),
        Ps[:, 0, 0].reshape(T, 1, 1).copy(),
        Fs=[np.array([[a[t]]]) for t in range(T)],
        Qs=[np.array([[p[t]]]) for t in range(T)],
    )
    return dict(
        mean=xs[:, 0, 0],
        var=Ps[:, 0, 0],
        pred_mean=xps[:, 0, 0],
        pred_var=Pps[:, 0, 0],
        smooth_mean=xsm[:, 0, 0] + d,
        smooth_var=Psm[:, 0, 0],
    )


@needs_filterpy
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filterpy_truth_is_filterpys_default_run_bit_for_bit(seed):
    lanes = [
        lane
        for lane in models.random_batch(seed, 63, 12).lanes()
        if not lane.diffuse and float(lane.prior_var) > 0
    ]
    assert len(lanes) >= 3
    for lane in lanes:
        tr, ref = truths.filterpy_truth(lane), _plain_filterpy(lane)
        for q, want in ref.items():
            np.testing.assert_array_equal(getattr(tr, q), want, err_msg=f"{lane.name}: {q}")


def test_inv_1x1_is_numpys_inverse_bit_for_bit():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [np.exp(rng.uniform(-700, 700, 2000)), rng.standard_normal(2000), [5e-324, 1.7e308]]
    )
    with np.errstate(over="ignore"):  # 1/5e-324 is inf in both
        for v in values:
            m = np.array([[v]])
            assert truths._inv_1x1(m)[0, 0] == np.linalg.inv(m)[0, 0], v


@pytest.mark.parametrize("n", [1, 2, 63, 1000])
def test_dense_oracle_solve_is_scipys_banded_cholesky_bit_for_bit(n):
    from scipy.linalg import cho_solve_banded, cholesky_banded

    rng = np.random.default_rng(n)
    off = -rng.uniform(0.1, 2.0, max(n - 1, 0))
    diag = rng.uniform(0.0, 1.0, n) + 2.0 * np.abs(np.concatenate([[0.0], off]))
    diag += np.abs(np.concatenate([off, [0.0]])) + 1e-3
    rhs = rng.standard_normal((n, 2))
    ab = np.zeros((2, n))
    ab[1], ab[0, 1:] = diag, off
    cb = cholesky_banded(ab, lower=False, check_finite=False)
    want = cho_solve_banded((cb, False), rhs, check_finite=False)
    sol, logdet, cancel = truths._solve(diag, off, rhs, logdet=True)
    np.testing.assert_array_equal(sol, want)
    assert logdet == 2.0 * math.fsum(np.log(cb[1]))
    assert cancel == float(np.max(diag / cb[1] ** 2))
    assert truths._solve(diag, off, rhs)[1] is None  # log det only where asked


def test_solve_names_a_matrix_that_is_not_positive_definite():
    from scipy.linalg import LinAlgError

    with pytest.raises(LinAlgError, match="LAPACK info 2"):
        truths._solve(np.array([1.0, 1.0]), np.array([-2.0]), np.ones((2, 1)))


def test_sequential_runner_skips_only_lanes_beyond_its_cap_and_timings_are_per_batch():
    cfg = battery.BatteryConfig(
        random_lengths=(7,),
        lanes_per_length=2,
        growth_lengths=(16, 64),
        named_regimes=False,
        dense_checks=False,
        sequential_max_T=16,
    )
    runners = [
        battery.Runner("sequential", "sequential", "cpu"),
        battery.Runner("torch", "torch", "cpu"),
    ]
    res = battery.run_battery(config=cfg, runners=runners)
    lengths = {
        r: {x["T"] for x in res.records if x["backend"] == r and x["family"] != "nile"}
        for r in ("sequential", "torch")
    }
    assert lengths == {"sequential": {7, 16}, "torch": {7, 16, 64}}
    t = res.timings
    assert [(b["batch"], b["T"], b["lanes"]) for b in t["batches"]] == [
        ("random T=7", 7, 2),
        ("growth T=16", 16, 5),
        ("growth T=64", 64, 5),
    ]
    assert "sequential" not in t["batches"][-1] and t["batches"][-1]["torch"] > 0
    for part in ("filterpy", "dense oracle", "sequential", "torch", "compare", "Nile"):
        assert t[part] == pytest.approx(
            sum(b.get(part, 0.0) for b in t["batches"]) + (t[part] if part == "Nile" else 0.0)
        )
    assert t["total"] >= sum(v for k, v in t.items() if k not in ("total", "batches")) - 1e-9


@needs_filterpy
@pytest.mark.parametrize("module", ["kalmanscan.validate", "kalmanscan.validation.truths"])
def test_docstring_examples_run(module):
    """Among them ``_cpu_parts``, the command's line of CPU time by part."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.slow  # the mpmath oracle of a 500-step regime, about 4 s each on 2 cores
@pytest.mark.parametrize("cap, backends", [(499, {"torch"}), (500, {"sequential", "torch"})])
def test_regime_rows_skip_sequential_only_beyond_its_cap(cap, backends):
    """The command's regime battery: the sequential loop skips regimes longer than the scalar
    battery's cap (the two 10^5-step regimes in full mode); the other backends run them."""
    pytest.importorskip("mpmath")
    from kalmanscan.validation import regimes

    name = "obs_var 1e-155, a=0.9 p=1"  # T = 500
    rows = regimes.regime_rows(
        backends=("sequential", "torch"),
        dense_backends=(),
        dtypes=("float64",),
        certify=False,
        names=[name],
        sequential_max_T=cap,
    )
    assert {r["regime"] for r in rows} == {name}
    assert {r["backend"] for r in rows} == backends


def test_drift_figure_picks_the_worst_model_at_any_length():
    """In full mode the sequential loop stops at 16 384 steps; its float32 drift there (the
    battery's largest) still chooses the drift figure's model, drawn at the longest length."""
    from kalmanscan.validation import report

    def rec(model, backend, T, err, dtype="float32"):
        return dict(family="growth", dtype=dtype, quantity="filtered var", truth="filterpy",
                    model=model, backend=backend, T=T, rel_err=err)  # fmt: skip

    records = [
        rec("rw, p*phi=6e-8", "sequential", 16384, 1.06e-4),
        rec("rw, p*phi=6e-8", "torch", 100_000, 2.27e-5),
        rec("a=1-1e-9, p=1e-6", "torch", 100_000, 3.99e-5),
        rec("AR a=0.9", "torch", 100_000, 1.0, dtype="float64"),
    ]
    assert report.drift_model(records) == ("rw, p*phi=6e-8", 100_000)
    with pytest.raises(ValueError, match="growth-study records"):
        report.drift_model([])
