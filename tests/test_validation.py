"""The validation suite: each truth on its own, then the quick battery end to end.

The truths are checked against a hand-written covariance-form loop and against published Nile
figures, so the battery's verdicts rest on something independent of kalmanscan.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types

import numpy as np
import pytest

import kalmanscan as ks
from kalmanscan import validation
from kalmanscan.validate import main
from kalmanscan.validation import battery, metrics, models, nile, report, truths, vanloan

# filterpy comes with the validation extra; without it these tests skip (the command says so)
needs_filterpy = pytest.mark.skipif(
    importlib.util.find_spec("filterpy") is None, reason="filterpy is not installed"
)

# --- a hand-written covariance-form filter and RTS smoother (float64), the reference for the truths


def covariance_loop(lane: models.Lane):
    """Textbook Kalman filter + RTS smoother; a diffuse prior must see its first step."""
    T = lane.T
    obs = lane.observed
    m, P = lane.prior_mean, lane.prior_var
    mean, var, pm, pv = (np.empty(T) for _ in range(4))
    ll = 0.0
    for t in range(T):
        a, p, c, h = lane.decay[t], lane.process_var[t], lane.offset[t], lane.loading[t]
        if math.isinf(P):
            assert a != 0 and obs[t], "the loop handles a diffuse prior observed at step 0 only"
            pm[t], pv[t] = np.nan, np.inf
            m, P = lane.z[t] / h, lane.obs_var[t] / h**2
        else:
            m, P = a * m + c, a * a * P + p
            pm[t], pv[t] = m, P
            if obs[t]:
                S = h * h * P + lane.obs_var[t]
                v = lane.z[t] - h * m
                ll += -0.5 * (math.log(2 * math.pi * S) + v * v / S)
                K = P * h / S
                m, P = m + K * v, (1 - K * h) * P
        mean[t], var[t] = m, P
    sm, sv = mean.copy(), var.copy()
    for t in range(T - 2, -1, -1):
        J = var[t] * lane.decay[t + 1] / pv[t + 1]
        sm[t] = mean[t] + J * (sm[t + 1] - pm[t + 1])
        sv[t] = var[t] + J * J * (sv[t + 1] - pv[t + 1])
    return dict(
        mean=mean, var=var, pred_mean=pm, pred_var=pv, loglik=ll, smooth_mean=sm, smooth_var=sv
    )


def _lane(T, seed, *, diffuse, missing=0.2, offset=0.3):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=T) * 2 + 1
    miss = rng.random(T) < missing
    miss[0] = False
    z[miss] = np.nan
    return models.Lane(
        name=f"T{T}-s{seed}",
        z=z,
        obs_var=rng.uniform(0.2, 3, T),
        decay=rng.uniform(-1, 1.1, T),
        process_var=rng.uniform(0.05, 2, T),
        loading=rng.uniform(0.5, 2, T),
        offset=offset * rng.normal(size=T),
        prior_mean=0.7,
        prior_var=np.inf if diffuse else 1.5,
    )


TINY = [
    pytest.param(T, seed, diffuse, id=f"T{T}-s{seed}-{'diffuse' if diffuse else 'prior'}")
    for T in (1, 3, 63, 1000)
    for seed in (0, 1)
    for diffuse in (False, True)
]


def _close(a, b, rtol):
    np.testing.assert_allclose(
        np.asarray(a, float), np.asarray(b, float), rtol=rtol, atol=0, equal_nan=True
    )


@pytest.mark.parametrize("T,seed,diffuse", TINY)
def test_dense_oracle_matches_covariance_loop(T, seed, diffuse):
    lane = _lane(T, seed, diffuse=diffuse)
    ref = covariance_loop(lane)
    tr = truths.dense_truth(lane)
    assert tr.own_error["moments"] < 1e-12
    for q in ("mean", "var", "smooth_mean", "smooth_var"):
        assert metrics.normwise(getattr(tr, q), ref[q]) < 1e-11, q
    assert metrics.loglik_error(tr.loglik, ref["loglik"], tr.n_loglik_terms) < 1e-11


@needs_filterpy
@pytest.mark.parametrize("T,seed,diffuse", TINY)
def test_filterpy_truth_matches_covariance_loop(T, seed, diffuse):
    lane = _lane(T, seed, diffuse=diffuse)
    ref = covariance_loop(lane)
    tr = truths.filterpy_truth(lane)
    for q in ("mean", "var", "pred_mean", "pred_var", "smooth_mean", "smooth_var"):
        assert metrics.normwise(getattr(tr, q), ref[q]) < 1e-12, q
    assert metrics.loglik_error(tr.loglik, ref["loglik"], tr.n_loglik_terms) < 1e-12


@needs_filterpy
def test_filterpy_predict_update_matches_batch_filter():
    """The truth reads batch_filter; filterpy's per-step predict/update and loglik agree."""
    from filterpy.kalman import KalmanFilter

    lane = _lane(63, 3, diffuse=False)
    tr = truths.filterpy_truth(lane)
    kf = KalmanFilter(dim_x=1, dim_z=1)
    kf.x, kf.P = np.array([[lane.prior_mean]]), np.array([[lane.prior_var]])
    ll = 0.0
    for t in range(lane.T):
        kf.predict(
            u=np.array([[lane.offset[t]]]),
            B=np.eye(1),
            F=np.array([[lane.decay[t]]]),
            Q=np.array([[lane.process_var[t]]]),
        )
        if lane.observed[t]:
            kf.update(
                np.array([[lane.z[t]]]),
                R=np.array([[lane.obs_var[t]]]),
                H=np.array([[lane.loading[t]]]),
            )
            ll += kf.log_likelihood
        assert abs(kf.x[0, 0] - tr.mean[t]) <= 1e-12 * max(1.0, abs(tr.mean[t]))
        assert abs(kf.P[0, 0] / tr.var[t] - 1) < 1e-12
    assert abs(ll - tr.loglik) < 1e-10 * abs(ll)


@needs_filterpy
def test_truths_handle_a_diffuse_prefix_of_missing_steps():
    """Before the first observation a diffuse lane is unknown; its smoothed moments are not."""
    lane = _lane(40, 5, diffuse=True, missing=0.0)
    lane.z[:4] = np.nan
    f, d = truths.filterpy_truth(lane), truths.dense_truth(lane)
    assert np.all(np.isinf(f.var[:4])) and np.all(np.isinf(d.var[:4]))
    assert np.all(np.isfinite(f.smooth_var)) and np.all(np.isfinite(d.smooth_var))
    assert metrics.elementwise(f.smooth_var, d.smooth_var) < 1e-11
    assert metrics.normwise(f.smooth_mean, d.smooth_mean) < 1e-11
    assert abs(f.loglik - d.loglik) < 1e-10 * abs(d.loglik)
    assert f.n_loglik_terms == d.n_loglik_terms == int(lane.observed.sum()) - 1


@needs_filterpy
@pytest.mark.parametrize("small_decay", [0.0, 0.01], ids=["forget", "a=0.01"])
def test_truths_agree_behind_a_diffuse_prefix_with_small_decays(small_decay):
    """A flat prefix is integrated out exactly; a decay of 0 there resets the state."""
    lane = _lane(50, 7, diffuse=True, missing=0.0)
    lane.z[:6] = np.nan
    lane.decay[3] = small_decay
    f, d = truths.filterpy_truth(lane), truths.dense_truth(lane)
    first = 3 if small_decay == 0.0 else 6
    assert np.all(np.isinf(f.var[:first])) and np.isfinite(f.var[first])
    for q in ("mean", "var", "smooth_mean", "smooth_var"):
        assert metrics.normwise(getattr(d, q), getattr(f, q)) < 1e-11, q
    assert metrics.loglik_error(d.loglik, f.loglik, f.n_loglik_terms) < 1e-11


def test_dense_oracle_refuses_what_it_cannot_represent():
    lane = _lane(10, 0, diffuse=False)
    lane.process_var[3] = 0.0
    with pytest.raises(truths.NotApplicable):
        truths.dense_truth(lane)


@needs_filterpy
def test_dense_oracle_reports_its_own_rounding_where_observations_are_weak():
    """obs_var/process_var = 1e12: the joint precision keeps phi to ~1e-4 only, and says so."""
    lane = models.named_regimes(0, True)[3].lane(1)  # "huge obs var": R = 1e12, random walk
    assert "R=1e12" in lane.name
    tr = truths.dense_truth(lane)
    assert tr.own_error["moments"] > 1e-6
    err = metrics.elementwise(tr.var, truths.filterpy_truth(lane).var)
    assert err < tr.own_error["moments"]


# --- Van Loan against discretize_ou

VANLOAN = [
    (0.0, 2.0, 0.5),
    (1e-12, 1.0, 1.0),
    (1e-8, 3.0, 1e-9),
    (0.3, 1e-6, 1e-3),
    (1.0, 2.0, 0.5),
    (10.0, 1e4, 65.0),
    (1e3, 1.0, 0.7),
]


@pytest.mark.parametrize(
    "theta,sigma2,dt", VANLOAN, ids=[f"th{v[0]:g}-dt{v[2]:g}" for v in VANLOAN]
)
@pytest.mark.parametrize(
    "dtype,rtol", [(np.float64, 1e-13), (np.float32, 1e-6)], ids=["f64", "f32"]
)
def test_van_loan_matches_discretize_ou(theta, sigma2, dt, dtype, rtol):
    a_ref, p_ref = vanloan.van_loan_ou(theta, sigma2, dt)
    a, p = ks.discretize_ou(
        np.array([theta], dtype), np.array([sigma2], dtype), np.array([dt], dtype)
    )
    assert a.dtype == dtype and p.dtype == dtype
    if a_ref >= np.finfo(dtype).tiny:
        assert abs(float(a[0]) / a_ref - 1) < rtol
    assert abs(float(p[0]) / p_ref - 1) < rtol


def test_van_loan_random_walk_and_closed_form():
    a, p = vanloan.van_loan_ou(0.0, 3.0, 2.0)  # expm of a nilpotent matrix: a few ulps
    assert abs(a - 1.0) < 1e-15 and abs(p / 6.0 - 1) < 1e-15
    a, p = vanloan.van_loan_ou(0.5, 2.0, 1.5)
    assert abs(a - math.exp(-0.75)) < 1e-15
    assert abs(p - 2.0 * (1 - math.exp(-1.5)) / 1.0) < 1e-14
    with pytest.raises(ValueError, match="theta\\*dt"):
        vanloan.van_loan_ou(10.0, 1.0, 100.0)


# --- statsmodels on Nile, and the published figures


def test_statsmodels_nile_convention_and_published_figures():
    _, flow = nile.load_nile()
    ref = nile.statsmodels_local_level(flow, 15099.0, 1469.1)
    assert abs(ref["llf_diffuse"] + 0.5 * math.log(2 * math.pi)) < 1e-12  # the one diffuse step
    assert abs(ref["llf"] - (-633.4646)) < 1e-4  # DK eq. 7.2 form
    assert abs(ref["loglik"] - (-632.5456)) < 1e-4  # KFAS fitSSM at these variances
    assert abs(ref["var"][-1] - 4032.1579) < 1e-3 and abs(ref["smooth_mean"][0] - 1111.6683) < 1e-3


@pytest.mark.parametrize("gaps", [False, True], ids=["Nile", "Nile-DK-gaps"])
@pytest.mark.parametrize("backend", ["sequential", "torch"])
def test_kalmanscan_matches_statsmodels_on_nile(gaps, backend):
    _, flow = nile.load_nile()
    z = flow.copy()
    if gaps:
        z[nile.DK_MISSING] = np.nan
    ref = nile.statsmodels_local_level(z, 15099.0, 1469.1)
    sm = ks.smooth(z, obs_var=15099.0, decay=1.0, process_var=1469.1, backend=backend)
    assert abs(sm.filtered.loglik / ref["loglik"] - 1) < 1e-8
    for got, q in (
        (sm.filtered.mean, "mean"),
        (sm.filtered.var, "var"),
        (sm.mean, "smooth_mean"),
        (sm.var, "smooth_var"),
    ):
        assert metrics.normwise(got, ref[q]) < 1e-8, q
    if gaps:
        assert abs(ref["loglik"] - (-380.5871)) < 1e-4 and abs(ref["var"][39] - 33414.196) < 1e-3


# --- metrics, models, report


def test_metrics_flag_wrong_infinities_and_nans():
    assert metrics.elementwise([1.0, 2.0], [1.0, np.inf]) == math.inf
    assert metrics.elementwise([1.0, np.inf], [1.0, 2.0]) == math.inf
    assert metrics.normwise([np.nan, 2.0], [1.0, 2.0]) == math.inf
    assert metrics.normwise([np.nan, 2.0], [np.nan, 2.0]) == 0.0
    assert metrics.loglik_error(np.nan, -3.0, 2) == math.inf
    assert metrics.loglik_error(0.5, 0.0, 0) == 0.5  # floor 1 when nothing contributes


def test_random_models_are_seeded_and_varied():
    a, b = models.random_batch(3, 63, 12), models.random_batch(3, 63, 12)
    np.testing.assert_array_equal(a.z, b.z)
    assert np.isinf(a.prior_var).any() and np.isfinite(a.prior_var).any()
    assert np.isnan(a.z).any() and np.isinf(a.obs_var).any()
    assert (np.ptp(a.decay, axis=0) > 0).any()
    assert all(np.any(ln.observed) for ln in a.lanes())


def test_rows_follow_the_documented_format_and_dense_checks_join(monkeypatch):
    fake = types.ModuleType("kalmanscan.validation.dense_checks")
    fake.check_dense = lambda quick: [
        dict(
            truth="dense: test",
            quantity="filtered mean",
            dtype="float64",
            backend="torch",
            max_rel_err=2e-3,
            tol=1e-9,
            n_models=1,
        )
    ]
    monkeypatch.setitem(sys.modules, "kalmanscan.validation.dense_checks", fake)
    rows = battery._dense_model_rows(quick=True)
    assert rows and set(report.ROW_KEYS) <= set(rows[0])
    assert not battery.row_passes(rows[0])
    assert "FAIL" in report.format_table(rows)


def test_a_raising_dense_check_becomes_a_failing_row(monkeypatch):
    fake = types.ModuleType("kalmanscan.validation.dense_checks")

    def check_dense(quick):
        raise RuntimeError("broken")

    fake.check_dense = check_dense
    monkeypatch.setitem(sys.modules, "kalmanscan.validation.dense_checks", fake)
    (row,) = battery._dense_model_rows(quick=True)
    assert not battery.row_passes(row) and "broken" in row["worst_model"]


TINY_CONFIG = battery.BatteryConfig(
    random_lengths=(1, 63),
    lanes_per_length=3,
    growth_lengths=(16,),
    named_regimes=False,
    dense_checks=False,
)


@needs_filterpy
def test_battery_catches_a_wrong_filter(monkeypatch):
    """A 1e-7 relative error in float64 smoothed means must fail the float64 rows."""
    real = battery.run_kalmanscan

    def skewed(batch, runner, dtype):
        out = real(batch, runner, dtype)
        out["smooth_mean"] = out["smooth_mean"] * (1 + 1e-7)
        return out

    monkeypatch.setattr(battery, "run_kalmanscan", skewed)
    res = battery.run_battery(config=TINY_CONFIG, runners=[battery.Runner("torch", "torch", "cpu")])
    bad = {(r["truth"], r["quantity"], r["dtype"]) for r in res.rows if not battery.row_passes(r)}
    assert ("filterpy", "smoothed mean", "float64") in bad
    assert ("dense oracle", "smoothed mean", "float64") in bad
    assert not any(q == "filtered mean" for _, q, _ in bad)


@needs_filterpy
@pytest.mark.slow  # the whole quick battery end to end, about a minute on 2 cores (CI: -m slow)
def test_validate_command_quick_passes(tmp_path):
    """`kalmanscan validate --quick` on this machine: every row within its tolerance."""
    csv_path, md_path, fig = tmp_path / "v.csv", tmp_path / "v.md", tmp_path / "fig.png"
    rc = main(
        ["--quick", "-q", "--csv", str(csv_path), "--markdown", str(md_path), "--figure", str(fig)]
    )
    assert rc == 0
    text = csv_path.read_text()
    for truth in ("filterpy", "dense oracle", "statsmodels (Nile)", "scipy expm (Van Loan)"):
        assert truth in text
    assert "float32" in text and "float64" in text
    assert md_path.read_text().startswith("| truth |")
    assert fig.stat().st_size > 10_000


def test_validate_command_usage():
    assert main(["--help"]) == 0
    assert main(["--no-such-flag"]) == 2
    assert main(["--quick", "--backend", "no-such-backend"]) == 2


def test_validate_command_names_the_missing_classic_filters(monkeypatch, capsys):
    """Without the validation extra the command says what to install, and runs nothing."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "filterpy" else real(n, *a)
    )
    monkeypatch.setattr(validation, "run_battery", lambda *a, **k: pytest.fail("battery ran"))
    assert main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "needs filterpy, not installed here" in err and "kalmanscan[validation]" in err


@pytest.mark.parametrize(
    "module", [metrics, report, vanloan, nile, models], ids=lambda m: m.__name__
)
def test_docstring_examples_run(module):
    import doctest

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


# --- the regime battery in `kalmanscan validate`: refusals, raises, and the docs' tables

PV_HUGE = "process_var 1e155, a=0.9"  # its data (~1e78) overflow float32: z becomes inf


def _regime_row(monkeypatch, message, backend="torch"):
    """The float32 row of the ``process_var 1e155`` regime when the backend raises ``message``
    (native checks ``z`` first, sequential and torch ``process_var``)."""
    pytest.importorskip("mpmath")
    from kalmanscan.validation import regimes

    real = regimes._run_scalar

    def run(reg, be, dtype):
        if dtype == "float32":
            raise ValueError(message)
        return real(reg, be, dtype)

    monkeypatch.setattr(regimes, "_run_scalar", run)
    rows = regimes.regime_rows(backends=(backend,), dense_backends=(), certify=False,
                               names=[PV_HUGE])  # fmt: skip
    (row,) = [r for r in rows if r["dtype"] == "float32"]
    return row


@pytest.mark.parametrize("arg", ["z", "process_var"])
def test_a_value_float32_cannot_hold_is_a_refusal_whichever_argument_is_named(monkeypatch, arg):
    row = _regime_row(monkeypatch, f"{arg}: expected finite values, got inf at index (0,)")
    assert row["refused"] and row["passes"] is None


def test_a_float32_raise_about_a_value_float32_holds_fails(monkeypatch):
    """decay = 0.9 is a float32 number: a ValueError about it is a failure, and the row of
    `kalmanscan validate` (float32: tolerance inf) fails instead of passing at inf."""
    from kalmanscan.validation import regimes

    row = _regime_row(monkeypatch, "decay: expected values in [-1, 1], got 0.9")
    assert not row["refused"]
    monkeypatch.setattr(regimes, "regime_rows", lambda **k: [row])
    monkeypatch.setattr(regimes, "gradient_rows", lambda **k: [])
    out = [r for r in regimes.validate_rows(backends=["torch"]) if r["dtype"] == "float32"]
    assert out and all(r["max_rel_err"] == math.inf for r in out)
    assert not any(battery.row_passes(r) for r in out)
    assert "decay" in out[0]["worst_model"]
    assert "**torch raises ValueError**" in regimes.compact_markdown([row])


def test_unheld_inputs_names_overflow_and_underflow():
    from kalmanscan.validation import regimes

    reg = next(r for r in regimes.scalar_regimes() if r.name == PV_HUGE)
    assert regimes.unheld_inputs(regimes._scalar_inputs(reg), "float32") == ("z", "process_var")
    assert regimes.unheld_inputs(regimes._scalar_inputs(reg), "float64") == ()
    assert regimes.unheld_inputs(dict(obs_var=[1.0, 1e-155], R=None), "float32") == ("obs_var",)
    assert regimes.unheld_inputs(dict(z=[np.nan, np.inf, -3e38, 0.0]), "float32") == ()


def test_native_float32_regime_rows_show_its_accuracy(monkeypatch):
    """`kalmanscan validate`'s native float32 regime rows: the process_var 1e155 regime is a
    refusal (as for sequential and torch), so the rows show native's error on the others."""
    pytest.importorskip("mpmath")
    from kalmanscan.core import native
    from kalmanscan.validation import regimes

    if not native.available():
        pytest.skip("native extension not built")
    monkeypatch.setattr(regimes, "VALIDATE_QUICK", (PV_HUGE, "OU theta=0.5 sigma2=0, 500 steps"))
    monkeypatch.setattr(regimes, "gradient_rows", lambda **k: [])
    rows = regimes.validate_rows(backends=["native", "torch"])
    f32 = [r for r in rows if r["dtype"] == "float32" and r["truth"].startswith("mpmath")]
    assert {r["backend"] for r in f32} == {"native", "torch"}
    for r in f32:
        assert r["n_models"] == 1, r  # the OU regime; the other refused
        assert 0 < r["max_rel_err"] < 0.1 and battery.row_passes(r), r
        assert PV_HUGE not in r["worst_model"]


def _md_table(text: str, header_start: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(header_start))
    head = [c.strip() for c in lines[i].strip("|").split("|")]
    out = {}
    for ln in lines[i + 2 :]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        out[cells[0]] = dict(zip(head, cells, strict=True))
    return out


def _pair(cell: str):
    m, v = (float(x) for x in cell.split(" / "))
    return m, v


def test_docs_regime_tables_agree():
    """docs/validation.md: the CPU summary's "float32 worst" is the worst of the per-backend
    float32 table, cell by cell, and the float64 bullets bound the table's rows."""
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parents[1] / "docs" / "validation.md").read_text()
    summary = _md_table(doc, "| regime | T | sequential float64 | torch float64 | native float64")
    per = _md_table(doc, "| regime | T | sequential float32 | torch float32 | native float32")
    assert set(summary) == set(per)
    for name, row in summary.items():
        cells = [per[name][f"{b} float32"] for b in ("sequential", "torch", "native")]
        nums = [_pair(c) for c in cells if " / " in c]
        if not nums:
            assert row["float32 worst"] in ("refused", "n/a"), name
            continue
        worst = tuple(max(p[k] for p in nums) for k in (0, 1))
        assert _pair(row["float32 worst"]) == pytest.approx(worst, rel=1e-9), name
    # "the `3 states, ...` rows: every backend within A sd and B relative" (and `2 states`)
    for prefix in ("3 states", "2 states"):
        m = re.search(rf"`{prefix}, \.\.\.`\s+rows: (?:every backend within )?"
                      rf"([0-9.e+-]+) sd,? (?:and )?([0-9.e+-]+) relative", doc)  # fmt: skip
        assert m, prefix
        bound = (float(m.group(1)), float(m.group(2)))
        for name, row in summary.items():
            if name.startswith(prefix):
                for b in ("sequential", "torch", "native"):
                    got = _pair(row[f"{b} float64"])
                    assert got[0] <= bound[0] and got[1] <= bound[1], (name, b, got, bound)
