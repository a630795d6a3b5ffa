"""Log-likelihood conventions: kalmanscan's exact diffuse log-likelihood against statsmodels'
(Durbin & Koopman, ``use_exact_diffuse``) and KFAS's, on real series.

kalmanscan drops every step whose prior precision is 0. Durbin & Koopman (2012, sec. 7.2.2) keep
``-1/2 (log 2 pi + log F_inf)`` for each diffuse observation element; KFAS keeps
``-1/2 log F_inf`` only. The differences are constants of the model's F, H, missing pattern and
diffuse coordinates (:func:`oracle.loglik_offset`, :func:`oracle.scalar_loglik_offset`; formulas
and derivation in docs/validation.md). :func:`check_datasets` measures them on Nile, CO2,
sunspots and El Niño (statsmodels.datasets) for scalar and dense models; the KFAS relation is
checked on KFAS's own fixtures in ``tests/test_oracle.py`` (R is not available here).

    python -m kalmanscan.validation.conventions       # the table of docs/validation.md
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .metrics import worse
from .oracle import dense_oracle, loglik_offset, scalar_loglik_offset, scalar_oracle

__all__ = ["datasets", "statsmodels_scalar", "check_datasets"]


def datasets() -> dict[str, np.ndarray]:
    """The four series (float64, NaN = missing): Nile flow, weekly CO2 (59 missing), yearly
    sunspots, monthly El Niño sea temperatures 1950-2010 (rows of the table, flattened)."""
    from statsmodels import datasets as d

    el = d.elnino.load_pandas().data.drop(columns="YEAR").to_numpy(dtype=np.float64).ravel()
    return {
        "Nile": d.nile.load_pandas().data["volume"].to_numpy(dtype=np.float64),
        "CO2": d.co2.load_pandas().data["co2"].to_numpy(dtype=np.float64),
        "sunspots": d.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(dtype=np.float64),
        "El Nino": el,
    }


def statsmodels_scalar(z, obs_var, decay, process_var, loading=1.0, offset=0.0) -> float:
    """statsmodels' exact diffuse log-likelihood (``llf``) of ``ks.filter``'s scalar model with
    constant parameters and a diffuse prior on the first state."""
    from statsmodels.tsa.statespace.mlemodel import MLEModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = MLEModel(np.asarray(z, dtype=np.float64), k_states=1, initialization="diffuse")
        ssm = mod.ssm
        ssm["design", 0, 0] = loading
        ssm["obs_cov", 0, 0] = obs_var
        ssm["transition", 0, 0] = decay
        ssm["selection", 0, 0] = 1.0
        ssm["state_cov", 0, 0] = process_var
        ssm["state_intercept", 0, 0] = offset
        res = ssm.filter()
    return float(np.sum(res.llf_obs))


SCALAR_MODELS = {
    # name: (dataset, obs_var, decay, process_var, loading, offset, leading missing steps)
    "Nile local level (DK variances)": ("Nile", 15099.0, 1.0, 1469.1, 1.0, 0.0, 0),
    "Nile, loading 0.5": ("Nile", 15099.0, 1.0, 1469.1, 0.5, 0.0, 0),
    "CO2 random walk + drift, 59 missing": ("CO2", 0.2, 1.0, 0.1, 1.0, 0.03, 0),
    "sunspots AR(0.8) + offset, first 5 missing": ("sunspots", 100.0, 0.8, 400.0, 1.0, 10.0, 5),
    "El Nino AR(0.9), loading 2, offset 2.4": ("El Nino", 0.1, 0.9, 0.5, 2.0, 2.4, 0),
}


def _row(model, kind, z, ours, statsmodels, offset, offset_kfas, oracle) -> dict:
    """One model's row: our and statsmodels' log-likelihoods, their difference against the
    convention offset (statsmodels' and KFAS's), and the oracle's value."""
    return dict(
        model=model,
        kind=kind,
        T=int(z.shape[0]),
        kalmanscan=ours,
        statsmodels=statsmodels,
        measured=ours - statsmodels,
        formula=offset,
        formula_kfas=offset_kfas,
        rel_err=abs(ours - statsmodels - offset) / max(abs(ours), 1.0),
        oracle=oracle,
    )


def _scalar_rows(data):
    import kalmanscan as ks

    rows = []
    for name, (ds, r, a, p, h, c, lead) in SCALAR_MODELS.items():
        z = data[ds].copy()
        z[:lead] = np.nan
        ours = float(ks.filter(z, r, a, p, loading=h, offset=c, backend="sequential").loglik)
        truth = scalar_oracle(z, r, a, p, h, c, smooth=False).loglik
        sm = statsmodels_scalar(z, r, a, p, h, c)
        off = scalar_loglik_offset("statsmodels", a, h, np.isfinite(z))
        off_kfas = scalar_loglik_offset("kfas", a, h, np.isfinite(z))
        rows.append(_row(name, "scalar", z, ours, sm, off, off_kfas, truth))
    return rows


def _dense_rows(data):
    import statsmodels.api as sm

    import kalmanscan.dense as kd

    rows = []
    specs = {
        "CO2 local linear trend (dense, 2 diffuse states)": ("CO2", "lltrend", [0.2, 0.05, 1e-4]),
        "Nile local linear trend": ("Nile", "lltrend", [15099.0, 1469.1, 10.0]),
        "sunspots local level + 4-season dummies (4 diffuse states)": (
            "sunspots",
            None,
            None,
        ),
    }
    for name, (ds, level, params) in specs.items():
        z = data[ds]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if level is None:
                mod = sm.tsa.UnobservedComponents(
                    z, level="llevel", seasonal=4, use_exact_diffuse=True
                )
                params = [100.0, 400.0, 5.0]
            else:
                mod = sm.tsa.UnobservedComponents(z, level=level, use_exact_diffuse=True)
            res = mod.smooth(params)
        ssm = mod.ssm
        F = np.asarray(ssm["transition"])[..., 0] if ssm["transition"].ndim == 3 else None
        F = np.asarray(ssm["transition"]) if F is None else F
        H = np.asarray(ssm["design"]).reshape(1, -1)
        Rs = np.asarray(ssm["selection"])
        Q = Rs @ np.asarray(ssm["state_cov"]) @ Rs.T
        R = np.asarray(ssm["obs_cov"]).reshape(1, 1)
        ours = float(kd.filter(z[:, None], F, Q, H, R, backend="sequential").loglik)
        truth = dense_oracle(z[:, None], F, Q, H, R, dps=60).loglik if len(z) <= 400 else math.nan
        llf = float(np.sum(res.llf_obs))
        off = loglik_offset("statsmodels", F, H, np.isfinite(z))
        off_kfas = loglik_offset("kfas", F, H, np.isfinite(z))
        rows.append(_row(name, "dense", z, ours, llf, off, off_kfas, truth))
    return rows


def kfas_fixtures_dir():
    """statsmodels' folder of KFAS results (``results_exact_initial_*_R.csv``), or None."""
    from pathlib import Path

    try:
        import statsmodels
    except ModuleNotFoundError:
        return None
    p = Path(statsmodels.__file__).parent / "tsa" / "statespace" / "tests" / "results"
    return p if p.is_dir() else None


def kfas_models() -> dict[str, dict]:
    """The models of KFAS's exact diffuse fixtures (statsmodels' ``test_exact_diffuse_filtering``
    R scripts), as ``kalmanscan.dense`` arguments ``z, F, Q, H, R`` (fully diffuse prior)."""
    from .regimes import KFAS_VAR1_F, KFAS_VAR1_Q, kfas_var1_data

    th = 0.1111
    ll_obs = np.r_[10.2394, 4.2039, 6.123123, [1.0] * 7][:, None]
    ll_miss = ll_obs.copy()
    ll_miss[1] = np.nan
    llt = dict(
        F=np.array([[1.0, 1.0], [0.0, 1.0]]),
        Q=np.diag([8.253, 2.334]),
        H=np.array([[1.0, 0.0]]),
        R=np.array([[1.993]]),
    )
    cl_obs = np.stack([np.r_[10.2394, [1.0] * 9], np.r_[8.2304, [1.0] * 9]], axis=1)
    var1 = dict(F=KFAS_VAR1_F, Q=KFAS_VAR1_Q, H=np.eye(2))
    return {
        "var1": dict(z=kfas_var1_data(False), R=np.zeros((2, 2)), **var1),
        "var1_missing": dict(z=kfas_var1_data(True), R=np.zeros((2, 2)), **var1),
        "var1_measurement_error": dict(z=kfas_var1_data(False), R=np.diag([4.0, 5.0]), **var1),
        "dfm": dict(
            z=kfas_var1_data(False),
            F=np.array([[0.9, 0.1], [1.0, 0.0]]),
            Q=np.diag([1.0, 0.0]),
            H=np.array([[0.5, 0.0], [1.0, 0.0]]),
            R=np.diag([1.5, 2.0]),
        ),
        "local_linear_trend": dict(z=ll_obs, **llt),
        "local_linear_trend_missing": dict(z=ll_miss, **llt),
        "common_level": dict(
            z=cl_obs,
            F=np.eye(2),
            Q=np.diag([3.2324, 0.0]),
            H=np.array([[1.0, 0.0], [th, 1.0]]),
            R=np.eye(2),
        ),
        "common_level_restricted": dict(
            z=cl_obs, F=np.eye(1), Q=np.array([[3.2324]]), H=np.array([[1.0], [th]]), R=np.eye(2)
        ),
    }


def kfas_loglik(name: str) -> float:
    """KFAS's ``logLik`` for fixture ``name`` (the ``llf`` column)."""
    import csv

    path = kfas_fixtures_dir() / f"results_exact_initial_{name}_R.csv"
    with open(path) as f:
        row = next(csv.DictReader(f))
    return float(row["llf"])


def convention_rows(scalar_backends=("sequential", "torch", "native"), dense_backends=None):
    """Rows of ``kalmanscan validate`` (format: :mod:`kalmanscan.validation`): kalmanscan's
    log-likelihood minus the convention offset against statsmodels' ``llf`` (Nile, sunspots,
    El Nino scalar models; a dense local linear trend on Nile) and against KFAS's ``logLik``
    (its fixtures), per backend, float64, tolerance ``("truth", "float64")``.
    ``dense_backends``: ``None`` for every dense backend here, or a list (empty: none). A
    backend that raises gets an infinite error, the exception named, and the rows go on."""
    import kalmanscan as ks
    import kalmanscan.dense as kd
    from kalmanscan.testing import TOLERANCES

    tol = float(TOLERANCES[("truth", "float64")])
    out: dict[tuple, dict] = {}

    def add(truth, backend, err, model):
        row = out.setdefault(
            (truth, backend),
            dict(
                truth=truth,
                quantity="loglik",
                dtype="float64",
                backend=backend,
                max_rel_err=0.0,
                tol=tol,
                n_models=0,
                worst_model="",
            ),
        )
        row["n_models"] += 1
        if worse(err, row["max_rel_err"]):
            row["max_rel_err"], row["worst_model"] = err, model

    def loglik(model, *args, **kw):
        """``(value, note)``: ``ks.filter(*args, **kw)``'s log-likelihood and ``model``, or NaN
        and the exception it raised."""
        try:
            return float(ks.filter(*args, **kw).loglik), model
        except Exception as exc:  # a raise on a valid model is a failure, not a crash
            return math.nan, f"{model} ({type(exc).__name__}: {exc})"[:200]

    data = datasets()
    for name, (ds, r, a, p, h, c, lead) in SCALAR_MODELS.items():
        if ds == "CO2":
            continue  # statsmodels' own error there is 3.7e-10 (its steady-state shortcut)
        z = data[ds].copy()
        z[:lead] = np.nan
        sm = statsmodels_scalar(z, r, a, p, h, c)
        off = scalar_loglik_offset("statsmodels", a, h, np.isfinite(z))
        for be in scalar_backends:
            ll, note = loglik(name, z, r, a, p, loading=h, offset=c, backend=be)
            add("statsmodels llf (convention offset)", be, _rel_err(ll - off, sm), note)
            if _has_convention_argument():
                # the filter's own loglik_convention= against the peers' values: statsmodels'
                # llf, and KFAS's = llf + 1/2 log 2 pi (one diffuse element; KFAS's fixtures)
                for conv, ref in (("statsmodels", sm), ("kfas", sm + 0.5 * math.log(2 * math.pi))):
                    ll, note = loglik(
                        name, z, r, a, p, loading=h, offset=c, backend=be, loglik_convention=conv
                    )
                    add(f"loglik_convention={conv!r}", be, _rel_err(ll, ref), note)
    if kfas_fixtures_dir() is None:
        return list(out.values())
    dense_backends = available_dense_backends() if dense_backends is None else dense_backends
    for name, m in kfas_models().items():
        ref = kfas_loglik(name)
        off = loglik_offset("kfas", m["F"], m["H"], np.isfinite(m["z"]))
        for be in dense_backends:
            try:
                ll = float(kd.filter(m["z"], m["F"], m["Q"], m["H"], m["R"], backend=be).loglik)
                note = name
            except ValueError as exc:
                if "use backend=" in str(exc):
                    continue  # R = 0: served by the backend the message names
                ll, note = math.nan, f"{name} (ValueError: {exc})"[:200]
            except Exception as exc:
                ll, note = math.nan, f"{name} ({type(exc).__name__}: {exc})"[:200]
            add("KFAS logLik (convention offset)", be, _rel_err(ll - off, ref), note)
    return list(out.values())


def _rel_err(value: float, ref: float) -> float:
    """``|value - ref| / max(|ref|, 1)``; infinite where ``value`` is not a number (a raise)."""
    err = abs(value - ref) / max(abs(ref), 1.0)
    return err if err == err else math.inf


def _has_convention_argument() -> bool:
    import inspect

    import kalmanscan as ks

    return "loglik_convention" in inspect.signature(ks.filter).parameters


def available_dense_backends() -> list[str]:
    """The CPU backends of ``kalmanscan.dense`` built here: sequential, torch and (when built)
    native."""
    from .regimes import DENSE_BACKENDS, _dense_native

    return [b for b in DENSE_BACKENDS if b != "native" or _dense_native()]


def check_datasets(dense: bool = True) -> list[dict]:
    """One row per (dataset, model): kalmanscan's and statsmodels' log-likelihoods, their
    measured difference, the formula's offset and the relative mismatch.

    >>> rows = check_datasets(dense=False)  # doctest: +SKIP
    >>> max(r["rel_err"] for r in rows) < 1e-12  # doctest: +SKIP
    True
    """
    data = datasets()
    rows = _scalar_rows(data)
    if dense:
        rows += _dense_rows(data)
    return rows


def _rel(x, truth) -> str:
    if not math.isfinite(truth):
        return "-"
    return f"{abs(x - truth) / max(abs(truth), 1.0):.1e}"


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | T | kalmanscan | statsmodels | difference | formula (statsmodels) "
        "| formula (KFAS) | mismatch | kalmanscan vs oracle | statsmodels vs oracle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['T']} | {r['kalmanscan']:.6f} | {r['statsmodels']:.6f} "
            f"| {r['measured']:.10f} | {r['formula']:.10f} | {r['formula_kfas']:.10f} "
            f"| {r['rel_err']:.1e} | {_rel(r['kalmanscan'], r['oracle'])} "
            f"| {_rel(r['statsmodels'] + r['formula'], r['oracle'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(check_datasets()))
    print(f"1/2 log(2 pi) = {0.5 * math.log(2 * math.pi):.10f}")
