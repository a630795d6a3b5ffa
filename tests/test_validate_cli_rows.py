"""``kalmanscan validate``: ``--backend`` selects the dense rows too, a
backend that raises fails its rows instead of ending the command, a check cannot be passed by
a non-finite covariance or by a NaN error followed by a finite one, and rows that are reported
but not judged say so."""

from __future__ import annotations

import math
import re
import sys
import types

import numpy as np
import pytest

from kalmanscan import validate
from kalmanscan.validation import battery, conventions, dense_checks, metrics, regimes, report

needs_classics = pytest.mark.skipif(
    any(
        __import__("importlib").util.find_spec(n) is None
        for n in ("filterpy", "statsmodels", "scipy")
    ),
    reason="needs filterpy, statsmodels and scipy",
)


def _row(backend, err=0.0, tol=1e-9, truth="dense: test"):
    return dict(
        truth=truth,
        quantity="loglik",
        dtype="float64",
        backend=backend,
        max_rel_err=err,
        tol=tol,
        n_models=1,
        worst_model="m",
    )


# --- --backend ---------------------------------------------------------------------------------


def test_dense_model_rows_follow_the_selected_runners(monkeypatch):
    """``run_battery(runners=[torch])`` ran and reported the dense checks on every dense runner
    (``kalmanscan validate --backend torch`` listed ``sequential`` rows). Now ``check_dense``
    gets the labels, and rows of other runners are dropped even from one that ignores them."""
    seen = {}

    def check_dense(quick, backends=None):
        seen["backends"] = backends
        return [_row("torch"), _row("sequential"), _row("-")]

    fake = types.ModuleType("kalmanscan.validation.dense_checks")
    fake.check_dense = check_dense
    monkeypatch.setitem(sys.modules, "kalmanscan.validation.dense_checks", fake)
    rows = battery._dense_model_rows(True, ["torch"])
    assert seen["backends"] == ["torch"]
    assert [r["backend"] for r in rows] == ["torch", "-"]
    fake.check_dense = lambda quick: [_row("torch"), _row("sequential")]  # the old protocol
    assert [r["backend"] for r in battery._dense_model_rows(True, ["torch"])] == ["torch"]
    assert len(battery._dense_model_rows(True)) == 2  # no selection: every row


class _Stop(Exception):
    pass


def test_check_dense_runs_only_the_selected_runners(monkeypatch):
    """``check_dense(backends=[...])`` runs no other runner (stopped at its statsmodels part,
    after the filterpy and oracle parts)."""
    pytest.importorskip("filterpy")
    ran = []
    real = dense_checks._run_ks

    def spy(model, backend, device, dtype):
        ran.append(backend)
        return real(model, backend, device, dtype)

    def stop(params=None):
        raise _Stop

    monkeypatch.setattr(dense_checks, "_run_ks", spy)
    monkeypatch.setattr(dense_checks, "statsmodels_llt", stop)
    with pytest.raises(_Stop):
        dense_checks.check_dense(True, backends=["sequential"])
    assert set(ran) == {"sequential"}


def test_regime_rows_get_the_selected_dense_backends(monkeypatch):
    """``validate_rows(backends=[...])`` ran the dense regimes on every dense backend."""
    seen = {}

    def regime_rows(**kw):
        seen.update(kw)
        return []

    monkeypatch.setattr(regimes, "regime_rows", regime_rows)
    monkeypatch.setattr(regimes, "gradient_rows", lambda **kw: [])
    regimes.validate_rows(backends=["torch"])
    assert seen["backends"] == ("torch",) and seen["dense_backends"] == ("torch",)
    regimes.validate_rows(backends=["torch-cuda"])
    assert seen["dense_backends"] == ()


def test_the_command_passes_the_selection_to_the_convention_rows(monkeypatch):
    """``_regime_rows`` gave ``convention_rows`` no dense selection (every dense backend ran)."""
    pytest.importorskip("mpmath")
    seen = {}
    monkeypatch.setattr(regimes, "validate_rows", lambda **kw: [])

    def convention_rows(scalar_backends, dense_backends=None):
        seen.update(scalar=scalar_backends, dense=dense_backends)
        return []

    monkeypatch.setattr(conventions, "convention_rows", convention_rows)
    validate._regime_rows(True, [battery.Runner("torch", "torch", "cpu")], lambda m: None)
    assert seen == {"scalar": ["torch"], "dense": ["torch"]}


@needs_classics
def test_an_empty_dense_selection_runs_no_dense_backend():
    """``convention_rows(dense_backends=[])`` read ``[] or all`` and ran every dense backend."""
    rows = conventions.convention_rows(scalar_backends=["sequential"], dense_backends=[])
    assert rows and {r["backend"] for r in rows} == {"sequential"}
    assert not any(r["truth"].startswith("KFAS") for r in rows)


# --- a backend that raises ---------------------------------------------------------------------

TINY = battery.BatteryConfig(
    random_lengths=(7,),
    lanes_per_length=2,
    growth_lengths=(16,),
    named_regimes=False,
    dense_checks=False,
)


@needs_classics
def test_a_raising_backend_fails_its_rows_and_the_battery_goes_on(monkeypatch):
    """Before: the exception ended ``run_battery`` (and ``kalmanscan validate``) with a
    traceback and no table. Now its rows have an infinite error naming the exception."""
    real = battery.run_kalmanscan

    def broken(batch, runner, dtype):
        if runner.label == "sequential" and dtype == "float32":
            raise RuntimeError("kernel exploded")
        return real(batch, runner, dtype)

    monkeypatch.setattr(battery, "run_kalmanscan", broken)
    runners = [
        battery.Runner("sequential", "sequential", "cpu"),
        battery.Runner("torch", "torch", "cpu"),
    ]
    res = battery.run_battery(config=TINY, runners=runners)
    bad = [r for r in res.rows if not battery.row_passes(r)]
    assert bad and all((r["backend"], r["dtype"]) == ("sequential", "float32") for r in bad)
    assert {r["truth"] for r in bad} >= {"filterpy", "statsmodels (Nile)"}
    assert all(r["max_rel_err"] == math.inf and "kernel exploded" in r["worst_model"] for r in bad)
    assert all(battery.row_passes(r) for r in res.rows if r["backend"] == "torch")


@needs_classics
def test_a_raising_backend_fails_its_convention_rows(monkeypatch):
    """Before: ``convention_rows`` let the exception out (ending ``kalmanscan validate`` after
    its whole battery had run); a dense backend's non-ValueError too."""
    import kalmanscan as ks
    import kalmanscan.dense as kd

    real, real_dense = ks.filter, kd.filter

    def broken(*args, backend="auto", **kw):
        if backend == "torch":
            raise RuntimeError("scalar boom")
        return real(*args, backend=backend, **kw)

    def broken_dense(*args, backend="auto", **kw):
        if backend == "torch":
            raise FloatingPointError("dense boom")
        return real_dense(*args, backend=backend, **kw)

    monkeypatch.setattr(ks, "filter", broken)
    monkeypatch.setattr(kd, "filter", broken_dense)
    rows = conventions.convention_rows(
        scalar_backends=["sequential", "torch"], dense_backends=["sequential", "torch"]
    )
    for r in rows:
        if r["backend"] == "torch":
            assert not battery.row_passes(r) and "boom" in r["worst_model"], r
        else:
            assert battery.row_passes(r), r
    assert any(r["truth"].startswith("KFAS") and r["backend"] == "torch" for r in rows)


# --- checks that could not fail ------------------------------------------------------------------


def test_a_non_finite_dense_covariance_fails_the_row():
    """``dense_checks._compare`` chose the compared steps where *kalmanscan's* covariance was
    finite, so a backend returning inf or NaN covariances at every step passed with error 0."""
    T, n = 4, 2
    truth = dict(
        mean=np.ones((T, n)),
        cov=np.broadcast_to(np.eye(n), (T, n, n)).copy(),
        smooth_mean=np.ones((T, n)),
        smooth_cov=np.broadcast_to(np.eye(n), (T, n, n)).copy(),
        loglik=-3.0,
    )
    for bad in (np.inf, np.nan):
        ours = {k: np.array(v, copy=True) for k, v in truth.items()}
        ours["cov"][:] = bad
        ours["nobs"] = T
        rows = dense_checks._Rows()
        dense_checks._compare(rows, "dense: test", truth, ours, "float64", "torch", "m")
        got = {q: r["max_rel_err"] for (_, q, _, _), r in rows.rows.items()}
        assert got["filtered cov"] == math.inf and got["filtered mean"] == 0.0


def test_a_nan_error_is_not_replaced_by_a_later_finite_one(monkeypatch):
    """``validate_rows``, ``convention_rows`` and ``dense_checks`` kept the worst error with
    ``if not err <= worst``: after a NaN every later error compared larger and replaced it, so
    a row whose first model gave NaN passed. ``metrics.worse`` keeps the NaN."""
    base = dict(kind="scalar", T=10, backend="torch", dtype="float64", error="")
    cols = dict(filter_mean_sd=0.0, filter_var=0.0, loglik=0.0, smooth_mean_sd=0.0, smooth_var=0.0)
    first = dict(base, regime="a", **dict(cols, loglik=math.nan))
    second = dict(base, regime="b", **dict(cols, loglik=1e-12))
    monkeypatch.setattr(regimes, "regime_rows", lambda **kw: [first, second])
    monkeypatch.setattr(regimes, "gradient_rows", lambda **kw: [])
    (row,) = [r for r in regimes.validate_rows(backends=["torch"]) if r["quantity"] == "loglik"]
    assert row["max_rel_err"] != row["max_rel_err"] and not battery.row_passes(row)
    rows = dense_checks._Rows()
    rows.add("dense: test", "loglik", "float64", "torch", math.nan, "a")
    rows.add("dense: test", "loglik", "float64", "torch", 1e-12, "b")
    (row,) = rows.rows.values()
    assert not battery.row_passes(row) and row["worst_model"] == "a"
    worse = metrics.worse
    assert worse(math.nan, 0.0) and not worse(1.0, math.nan) and worse(2.0, 1.0)


def test_rows_against_an_infinite_tolerance_say_they_are_not_judged():
    """The float32 regime rows (tolerance inf) printed PASS; now ``report``. A raise still
    fails them."""
    rows = [_row("torch", 9e-3, math.inf), _row("native", math.inf, math.inf), _row("seq", 1e-12)]
    table = report.format_table(rows)
    cells = [re.split(r"\s{2,}", line) for line in table.splitlines()[2:]]
    status = {c[3]: c[-1] for c in cells}
    assert status == {"torch": "report", "native": "FAIL", "seq": "PASS"}
    assert "| report |" in report.markdown_table(rows)
