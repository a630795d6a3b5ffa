"""statsmodels' exact-diffuse local level on the bundled Nile data.

Model (Durbin & Koopman 2012, ch. 2): ``z_t = x_t + e_t``, ``x_t = x_{t-1} + w_t``, diffuse prior,
``e ~ N(0, obs_var)``, ``w ~ N(0, level_var)``. statsmodels' ``use_exact_diffuse=True``
log-likelihood (``llf``) is DK's eq. 7.2 form: its diffuse first step contributes
``-0.5 log 2 pi`` (with ``F_inf = 1``). kalmanscan's convention excludes that step, so the
aligned value is ``llf_obs[d:].sum()`` with ``d = nobs_diffuse`` (= ``llf + 0.5 log 2 pi`` on
Nile): -632.5456 at the Durbin–Koopman variances, as KFAS reports.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load_nile", "statsmodels_local_level", "NILE_PARAMS", "DK_MISSING"]

# (obs_var, level_var): the Durbin-Koopman MLE and two points elsewhere on the likelihood surface
NILE_PARAMS = [(15099.0, 1469.1), (5000.0, 5000.0), (30000.0, 100.0)]
# DK's missing-observations example: observations 21-40 and 61-80 (1-based) removed
DK_MISSING = np.r_[20:40, 60:80]


def load_nile() -> tuple[np.ndarray, np.ndarray]:
    """``(years, flow)`` of the bundled Nile data (100 annual flows, 1871–1970), float64.

    >>> years, flow = load_nile()
    >>> int(years[0]), float(flow[0]), flow.shape
    (1871, 1120.0, (100,))
    """
    from importlib.resources import files

    text = (files("kalmanscan") / "data" / "nile.csv").read_text()
    rows = [ln.split(",") for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    body = [r for r in rows if r[0].strip().lstrip("-").replace(".", "").isdigit()]
    years = np.array([float(r[0]) for r in body])
    flow = np.array([float(r[1]) for r in body])
    return years, flow


def statsmodels_local_level(z: np.ndarray, obs_var: float, level_var: float) -> dict:
    """Filter and smooth ``z`` with statsmodels' exact-diffuse local level at fixed variances.

    Returns float64 ``mean``, ``var``, ``smooth_mean``, ``smooth_var`` ``[T]`` and ``loglik``
    (kalmanscan's convention), plus statsmodels' own ``llf`` and the dropped ``llf_diffuse``.

    >>> _, flow = load_nile()
    >>> round(statsmodels_local_level(flow, 15099.0, 1469.1)["loglik"], 4)
    -632.5456
    """
    import warnings

    from statsmodels.tsa.statespace.structural import UnobservedComponents

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = UnobservedComponents(
            np.asarray(z, dtype=np.float64), level="llevel", use_exact_diffuse=True
        )
        res = mod.smooth([obs_var, level_var])
    d = int(res.nobs_diffuse)
    llf_obs = np.asarray(res.llf_obs)
    return dict(
        mean=np.asarray(res.filtered_state[0]),
        var=np.asarray(res.filtered_state_cov[0, 0]),
        smooth_mean=np.asarray(res.smoothed_state[0]),
        smooth_var=np.asarray(res.smoothed_state_cov[0, 0]),
        loglik=float(llf_obs[d:].sum()),
        llf=float(res.llf),
        llf_diffuse=float(llf_obs[:d].sum()),
        n_terms=int(np.isfinite(np.asarray(z)[d:]).sum()),
    )
