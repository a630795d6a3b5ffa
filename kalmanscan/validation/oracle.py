"""High-precision oracles (mpmath): the truth for the regime battery (:mod:`regimes`).

- :func:`scalar_oracle`: one scalar lane (docs/architecture.md notation: ``decay`` a,
  ``process_var`` p, ``offset`` c, ``loading`` h, ``obs_var`` R, NaN = not observed), covariance
  form with an exact diffuse start, the RTS smoother, and the exact diffuse log-likelihood in
  kalmanscan's convention (a step whose prior precision is 0 contributes nothing).
- :func:`dense_oracle`: a dense model (``kalmanscan.dense`` notation: F, Q, H, R, offset) at small
  ``n``: filtered and smoothed moments from a covariance filter and RTS smoother with the diffuse
  directions started at ``kappa`` (``10**(dps // 3)``: the ``O(1/kappa)`` error is far below
  float64), and the exact diffuse log-likelihood from Durbin & Koopman's exact initial filter
  (univariate treatment, correlated observation noise whitened), in kalmanscan's, Durbin &
  Koopman's (statsmodels) and KFAS's conventions.

Precision. Every recursion runs in ``mpmath`` at ``dps`` decimal digits. The filter has no
cancellation (``P = Pp R / (h^2 Pp + R)``); the RTS backward pass multiplies earlier errors by
the gains ``J_t = a P_t / Pp_{t+1}``, which exceed 1 when ``process_var`` is small (``J = 1/a``
with ``p = 0``: a ``decay`` of 0.9577 over 1000 steps amplifies by ``10**19``, OU theta = 0.5 over
2000 unit steps by ``10**434``). So ``dps`` is chosen per lane: a first pass at 50 digits measures
``G = log10 prod_t max(1, |J_t|)`` and the oracle reruns at ``dps = 40 + G`` (at least 60). With
``certify=True`` it also reruns at ``dps + 25`` and reports the largest change (in the units of
:mod:`regimes`' metrics) as ``own_error``; the battery checks it is negligible.

Outputs are float64 numpy arrays (values below float64's range underflow to 0, as a float64
filter's would), with ``dps`` the digits they were computed with; no mpf values are returned.
Derivations and conventions: docs/validation.md ("The high-precision oracle").
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = [
    "GRAD_PARAMS",
    "scalar_loglik_grad",
    "OracleResult",
    "DenseOracleResult",
    "scalar_oracle",
    "dense_oracle",
    "loglik_offset",
    "scalar_loglik_offset",
]


def _mp():
    try:
        import mpmath
    except ModuleNotFoundError as exc:  # pragma: no cover - mpmath ships with the test extra
        raise ModuleNotFoundError(
            "validation.oracle needs mpmath (pip install mpmath, or kalmanscan[test])",
            name="mpmath",
        ) from exc
    return mpmath


class OracleResult(NamedTuple):
    """One lane's truth; float64 arrays ``[T]`` (NaN mean / inf var while diffuse)."""

    mean: np.ndarray
    var: np.ndarray
    pred_mean: np.ndarray
    pred_var: np.ndarray
    loglik: float
    n_loglik_terms: int
    smooth_mean: np.ndarray
    smooth_var: np.ndarray
    dps: int  # digits the returned values were computed with
    log10_gain: float  # log10 prod max(1, |J_t|): the RTS amplification absorbed by dps
    own_error: dict | None  # {"mean_sd", "var", "loglik"}: change from dps to dps + 25


def _f(x) -> float:
    """mpf -> float64 (underflow to 0, overflow to inf, like a float64 filter)."""
    try:
        return float(x)
    except OverflowError:  # pragma: no cover - mpmath returns inf itself
        return math.inf if x > 0 else -math.inf


def _scalar_pass(mp, z, R, a, p, c, h, m0, P0, smooth, forget):
    """One filter (+ RTS) pass at the current mp.dps; returns mpf lists (None = diffuse)."""
    T = len(z)
    half_log2pi = mp.log(2 * mp.pi) / 2
    diffuse = P0 is None
    m, P = (None, None) if diffuse else (mp.mpf(m0), mp.mpf(P0))
    pm, pP, fm, fP = [None] * T, [None] * T, [None] * T, [None] * T
    ll, nll = mp.mpf(0), 0
    for t in range(T):
        at, pt, ct = a[t], p[t], c[t]
        if forget[t]:  # total forgetting: the prior of step t is N(c, p) whatever came before
            diffuse, m, P = False, ct, pt
        elif not diffuse:
            m, P = at * m + ct, at * at * P + pt
        pm[t], pP[t] = (None, None) if diffuse else (m, P)
        if z[t] is not None:
            zt, Rt, ht = z[t], R[t], h[t]
            if diffuse:
                if ht == 0:
                    ll -= half_log2pi + mp.log(Rt) / 2 + zt * zt / (2 * Rt)
                    nll += 1
                else:
                    diffuse, m, P = False, zt / ht, Rt / (ht * ht)
            else:
                S = ht * ht * P + Rt
                v = zt - ht * m
                ll -= half_log2pi + mp.log(S) / 2 + v * v / (2 * S)
                nll += 1
                m = m + P * ht * v / S
                P = P * Rt / S
        fm[t], fP[t] = (None, None) if diffuse else (m, P)
    if not smooth:
        return pm, pP, fm, fP, ll, nll, None, None, mp.mpf(0)
    sm, sP = [None] * T, [None] * T
    sm[T - 1], sP[T - 1] = fm[T - 1], fP[T - 1]
    log_gain = mp.mpf(0)
    for t in range(T - 2, -1, -1):
        a1, p1, c1 = a[t + 1], p[t + 1], c[t + 1]
        if sm[t + 1] is None:  # never proper after t: nothing known about x_t
            continue
        if forget[t + 1]:  # x_{t+1} does not depend on x_t: smoothed = filtered
            sm[t], sP[t] = fm[t], fP[t]
        elif fm[t] is None:  # flat belief at t: x_t = (x_{t+1} - c - w) / a
            sm[t], sP[t] = (sm[t + 1] - c1) / a1, (sP[t + 1] + p1) / (a1 * a1)
            log_gain += max(0, -mp.log10(abs(a1)))
        else:
            Pp = a1 * a1 * fP[t] + p1
            if Pp == 0:  # state known exactly at t
                sm[t], sP[t] = fm[t], fP[t]
                continue
            J = a1 * fP[t] / Pp
            sm[t] = fm[t] + J * (sm[t + 1] - (a1 * fm[t] + c1))
            sP[t] = fP[t] + J * J * (sP[t + 1] - Pp)
            if abs(J) > 1:
                log_gain += mp.log10(abs(J))
    return pm, pP, fm, fP, ll, nll, sm, sP, log_gain


def _mean_arr(xs):
    return np.array([math.nan if x is None else _f(x) for x in xs])


def _var_arr(xs):
    return np.array([math.inf if x is None else _f(x) for x in xs])


def _lane_inputs(mp, z, obs_var, decay, process_var, loading, offset, T):
    def col(x):
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (T,))

    z, R, a, p, h, c = map(col, (z, obs_var, decay, process_var, loading, offset))
    zs = [
        None if (not math.isfinite(z[t]) or not math.isfinite(R[t])) else mp.mpf(float(z[t]))
        for t in range(T)
    ]
    conv = lambda v: [mp.mpf(float(x)) for x in v]  # noqa: E731 - exact: floats are dyadic
    Rs = [mp.mpf(float(x)) if math.isfinite(x) else None for x in R]
    return zs, Rs, conv(a), conv(p), conv(c), conv(h)


def scalar_oracle(
    z,
    obs_var,
    decay,
    process_var,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=math.inf,
    *,
    smooth: bool = True,
    dps: int | None = None,
    certify: bool = False,
) -> OracleResult:
    """Filter (+ RTS smoother) one scalar lane in mpmath; the model of ``kalmanscan.filter``.

    Arguments are float64 arrays ``[T]`` (or scalars) as for ``ks.filter`` on one lane; the prior
    applies to the state before step 0 (step 0 predicts with ``decay[0]``), ``prior_var = inf``
    is diffuse; only a step with ``decay == 0`` forgets (kalmanscan's rule: a nonzero decay
    keeps a diffuse past diffuse, also where its square underflows).
    ``dps=None`` picks the digits from the measured RTS amplification (module docstring);
    ``certify`` reruns 25 digits higher and reports the change as ``own_error``.

    >>> r = scalar_oracle([1.0, 2.0, float("nan"), 4.0], 1.0, 1.0, 0.5)
    >>> round(float(r.mean[1]), 12), round(float(r.var[1]), 12), r.n_loglik_terms
    (1.6, 0.6, 2)
    """
    mp = _mp()
    z = np.atleast_1d(np.asarray(z, dtype=np.float64))
    T = int(z.shape[0])
    if T == 0:
        raise ValueError("z: expected at least one step, got 0")
    prior_var = float(prior_var)
    # kalmanscan's convention: a step forgets where decay is 0, even a diffuse past; a nonzero
    # decay keeps a diffuse past diffuse (a^2 inf = inf), also where a^2 underflows
    # (docs/backend-contract.md)
    a64 = np.broadcast_to(np.asarray(decay, dtype=np.float64), (T,))
    forget = (a64 == 0.0).tolist()

    def run(digits):
        with mp.workdps(digits):
            zs, Rs, a, p, c, h = _lane_inputs(
                mp, z, obs_var, decay, process_var, loading, offset, T
            )
            P0 = None if math.isinf(prior_var) else mp.mpf(prior_var)
            out = _scalar_pass(
                mp, zs, Rs, a, p, c, h, mp.mpf(float(prior_mean)), P0, smooth, forget
            )
            pm, pP, fm, fP, ll, nll, sm, sP, g = out
            arrs = dict(
                pred_mean=_mean_arr(pm),
                pred_var=_var_arr(pP),
                mean=_mean_arr(fm),
                var=_var_arr(fP),
                smooth_mean=_mean_arr(sm) if smooth else None,
                smooth_var=_var_arr(sP) if smooth else None,
            )
            return arrs, _f(ll), nll, float(g)

    if dps is None:
        if smooth:
            _, _, _, g0 = run(50)
            dps = max(60, 40 + int(math.ceil(g0)))
        else:
            dps = 60
    arrs, ll, nll, g = run(dps)
    own = None
    if certify:
        arrs2, ll2, _, _ = run(dps + 25)
        own = _self_difference(arrs, ll, arrs2, ll2, nll)
    return OracleResult(
        mean=arrs["mean"],
        var=arrs["var"],
        pred_mean=arrs["pred_mean"],
        pred_var=arrs["pred_var"],
        loglik=ll,
        n_loglik_terms=nll,
        smooth_mean=arrs["smooth_mean"],
        smooth_var=arrs["smooth_var"],
        dps=dps,
        log10_gain=g,
        own_error=own,
    )


GRAD_PARAMS = ("obs_var", "decay", "process_var", "offset")


def scalar_loglik_grad(
    z,
    obs_var,
    decay,
    process_var,
    loading=1.0,
    offset=0.0,
    prior_mean=0.0,
    prior_var=math.inf,
    *,
    dps: int = 120,
) -> dict:
    """d loglik / d (obs_var, decay, process_var, offset) for one lane whose four parameters are
    constant in time (scalars), by a forward difference at ``dps`` digits (plus
    ``-log10 |theta|`` for a parameter below 1, which moves the log-likelihood that much less)
    with a relative step ``10**(-dps/3)``: truncation and rounding both far below float64
    (~1e-40 relative at the default 120 digits).

    >>> g = scalar_loglik_grad([1.0, 2.0], 1.0, 1.0, 1.0)  # S = 2 R + p, v = 1 - c
    >>> round(g["obs_var"], 12), round(g["process_var"], 12), round(g["offset"], 12)
    (-0.222222222222, -0.111111111111, 0.333333333333)
    """
    mp = _mp()
    z = np.atleast_1d(np.asarray(z, dtype=np.float64))
    T = int(z.shape[0])
    base = dict(obs_var=obs_var, decay=decay, process_var=process_var, offset=offset)
    for k, v in base.items():
        if np.ndim(v) != 0:
            raise ValueError(f"{k}: expected a scalar (constant in time), got shape {np.shape(v)}")
    a64 = float(decay)
    forget = [a64 == 0.0] * T
    with mp.workdps(dps):
        step = mp.mpf(10) ** (-(dps // 3))
        zs = [None if not math.isfinite(v) else mp.mpf(v) for v in z]
        if not math.isfinite(float(obs_var)):
            zs = [None] * T
        h = [mp.mpf(float(loading))] * T
        P0 = None if math.isinf(float(prior_var)) else mp.mpf(float(prior_var))
        m0 = mp.mpf(float(prior_mean))

        def ll(vals):
            R = [vals["obs_var"]] * T
            out = _scalar_pass(
                mp,
                zs,
                R,
                [vals["decay"]] * T,
                [vals["process_var"]] * T,
                [vals["offset"]] * T,
                h,
                m0,
                P0,
                False,
                forget,
            )
            return out[4]

        vals = {k: mp.mpf(float(v)) for k, v in base.items()}
        grad = {}
        for k in GRAD_PARAMS:
            # a parameter far below 1 moves the log-likelihood by ~theta * step: more digits
            extra = max(0, int(-mp.floor(mp.log10(abs(vals[k]))))) if vals[k] != 0 else 0
            with mp.workdps(dps + extra):
                d = step * (abs(vals[k]) if vals[k] != 0 else 1)
                grad[k] = _f((ll({**vals, k: vals[k] + d}) - ll(vals)) / d)
    return grad


def _self_difference(a1, ll1, a2, ll2, nll):
    """Largest change between two oracle runs, in the battery's metrics (regimes.py)."""
    from .regimes import loglik_rel, mean_err_sd, var_rel

    out = {"mean_sd": 0.0, "var": 0.0}
    for m, v in (("mean", "var"), ("smooth_mean", "smooth_var")):
        if a1[m] is None:
            continue
        out["mean_sd"] = max(out["mean_sd"], mean_err_sd(a1[m], a2[m], a2[v]))
        out["var"] = max(out["var"], var_rel(a1[v], a2[v]))
    out["loglik"] = loglik_rel(ll1, ll2, nll)
    return out


# --------------------------------------------------------------------------------------------
# dense


class DenseOracleResult(NamedTuple):
    """Dense truth; float64 arrays. ``diffuse[t]``: the filtered state is still unbounded.

    ``loglik`` is kalmanscan's exact diffuse convention; ``loglik_dk`` Durbin & Koopman's
    (statsmodels ``use_exact_diffuse=True``); ``loglik_kfas`` KFAS's ``logLik``. ``pdet_terms``
    is ``1/2 sum_t log pdet(H_t P_inf,t H_t')`` over the diffuse steps, ``n_diffuse_obs`` the
    number of diffuse observation elements (sum of the ranks), with ``P_inf = I`` on the
    diffuse coordinates of the state *before step 0*, pushed through ``F_0`` (i.e. P_inf on
    the first state is ``F_0 D F_0'``).
    """

    mean: np.ndarray  # [T, n]
    cov: np.ndarray  # [T, n, n]
    pred_mean: np.ndarray
    pred_cov: np.ndarray
    smooth_mean: np.ndarray
    smooth_cov: np.ndarray
    diffuse: np.ndarray  # [T] bool
    loglik: float
    loglik_dk: float
    loglik_kfas: float
    pdet_terms: float
    n_diffuse_obs: int
    n_loglik_terms: int
    dps: int


def _as_steps(x, T, shape):
    x = np.asarray(x, dtype=np.float64)
    if x.shape == shape:
        x = np.broadcast_to(x, (T,) + shape)
    if x.shape != (T,) + shape:
        raise ValueError(f"expected {shape} or {(T,) + shape}, got {x.shape}")
    return x


def _mpmat(mp, a):
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 1:
        return mp.matrix([float(v) for v in a])
    return mp.matrix([[float(v) for v in row] for row in a])


def _sym(mp, M):
    return (M + M.T) / 2


def _pinv_sym(mp, M, tol, floor=0):
    """Pseudo-inverse of a symmetric PSD mp matrix (eigenvalues below ``tol`` of the largest, or
    below ``floor``, dropped).

    ``floor``: the size below which an eigenvalue is rounding, not information (e.g. ``tol``
    times the scale ``M`` would have: a diffuse part ``H P_inf H'`` that is 0 in exact arithmetic
    but 1e-50 after rounding must count as 0, however small it is next to its own largest
    eigenvalue). Without a floor, a Cholesky factor whose pivots all exceed ``tol`` of the
    largest proves M nonsingular at this precision; then the plain inverse is used (much cheaper
    than the eigen-decomposition).
    """
    n = M.rows
    if not floor:
        try:
            L = mp.cholesky(_sym(mp, M))
            piv = [L[i, i] ** 2 for i in range(n)]
            if min(piv) > tol * max(piv):
                return mp.inverse(M)
        except (ValueError, ZeroDivisionError):
            pass
    E, Q = mp.eigsy(_sym(mp, M))
    big = max([abs(E[i]) for i in range(n)] + [mp.mpf(0)])
    out = mp.zeros(n, n)
    for i in range(n):
        if big > 0 and abs(E[i]) > max(tol * big, floor):
            q = Q[:, i]
            out += (q * q.T) / E[i]
    return out


def _logpdet(mp, M, tol, floor=0):
    """``(log pdet M, rank)`` of a symmetric PSD mp matrix over the eigenvalues above ``tol`` of
    the largest and above ``floor`` (see :func:`_pinv_sym`)."""
    n = M.rows
    E = mp.eigsy(_sym(mp, M), eigvals_only=True)
    big = max([abs(E[i]) for i in range(n)] + [mp.mpf(0)])
    keep = [E[i] for i in range(n) if big > 0 and E[i] > max(tol * big, floor)]
    return sum((mp.log(e) for e in keep), mp.mpf(0)), len(keep)


def _np(mp, M):
    return np.array([[_f(M[i, j]) for j in range(M.cols)] for i in range(M.rows)])


def _npv(mp, v):
    return np.array([_f(v[i]) for i in range(v.rows)])


def dense_oracle(
    z,
    F,
    Q,
    H,
    R,
    *,
    offset=None,
    prior_mean=None,
    prior_cov=None,
    dps: int = 120,
) -> DenseOracleResult:
    """Filter, RTS-smooth and exact-diffuse log-likelihood of one dense series in mpmath.

    ``z`` [T, d] (NaN entries missing); F, Q [n, n] or [T, n, n]; H [d, n] or [T, d, n];
    R [d, d] or [T, d, d] (diagonal blocks may hold 0: noise-free elements; a correlated block
    must be positive definite and is whitened by its Cholesky factor; the exact initial filter
    treats the observation vector one element at a time, as KFAS and statsmodels do);
    ``prior_cov`` [n, n] with ``inf`` on the diagonal marking diffuse coordinates (their rows
    and columns must be 0 elsewhere), ``None``: fully diffuse. Same model and step indexing as
    ``kalmanscan.dense.filter`` (the prior is on the state before step 0).

    >>> import numpy as np
    >>> r = dense_oracle(np.array([[1.0], [2.0]]), np.eye(1), np.eye(1), np.eye(1), np.eye(1))
    >>> ll = -0.5 * np.log(2 * np.pi * 3) - 1 / 6  # step 1: S = 2 + 1, innovation 1
    >>> round(float(r.mean[1, 0]), 12), bool(abs(r.loglik - ll) < 1e-14)
    (1.666666666667, True)
    """
    mp = _mp()
    z = np.asarray(z, dtype=np.float64)
    T, d = z.shape
    n = np.asarray(F).shape[-1]
    Fs, Qs = _as_steps(F, T, (n, n)), _as_steps(Q, T, (n, n))
    Hs, Rs = _as_steps(H, T, (d, n)), _as_steps(R, T, (d, d))
    cs = _as_steps(np.zeros(n) if offset is None else offset, T, (n,))
    m0 = np.zeros(n) if prior_mean is None else np.asarray(prior_mean, dtype=np.float64)
    if prior_cov is None:
        dif = np.ones(n, dtype=bool)
        P0f = np.zeros((n, n))
    else:
        P0 = np.array(prior_cov, dtype=np.float64)
        dif = np.isinf(np.diag(P0))
        P0f = np.where(np.isinf(P0), 0.0, P0)
        if np.any(P0f[dif, :]) or np.any(P0f[:, dif]):
            raise ValueError("prior_cov: a diffuse coordinate must have no finite covariance")
    obs = np.isfinite(z)

    with mp.workdps(dps):
        tol = mp.mpf(10) ** (-(dps // 2))
        kappa = mp.mpf(10) ** (dps // 3)
        Fm = [_mpmat(mp, Fs[t]) for t in range(T)]
        Qm = [_mpmat(mp, Qs[t]) for t in range(T)]
        Hm = [_mpmat(mp, Hs[t]) for t in range(T)]
        cm = [_mpmat(mp, cs[t]) for t in range(T)]
        Dm = mp.diag([1 if v else 0 for v in dif])
        # 1) exact initial filter (univariate), for the log-likelihood in three conventions
        a = _mpmat(mp, m0)
        Pinf, Pst = Dm.copy(), _mpmat(mp, P0f)
        half_log2pi = mp.log(2 * mp.pi) / 2
        ll_dk = mp.mpf(0)
        ll_ks = mp.mpf(0)
        pdet_sum = mp.mpf(0)
        n_dif_obs, n_terms = 0, 0
        for t in range(T):
            a = Fm[t] * a + cm[t]
            Pinf = _sym(mp, Fm[t] * Pinf * Fm[t].T)
            Pst = _sym(mp, Fm[t] * Pst * Fm[t].T + Qm[t])
            idx = [i for i in range(d) if obs[t, i]]
            if not idx:
                continue
            pinf_scale = mp.mnorm(Pinf, 1)
            if pinf_scale > 0:
                Ho = mp.matrix([[Hm[t][i, j] for j in range(n)] for i in idx])
                A = Ho * Pinf * Ho.T
                # H P_inf H' of a direction the diffuse state no longer reaches is rounding:
                # below tol times the size it would have (|P_inf| |H|^2), the scale on which the
                # univariate steps below judge F_inf
                floor = tol * pinf_scale * max(1, mp.mnorm(Ho, 1) ** 2)
                lpd, _ = _logpdet(mp, A, tol, floor)
            else:
                lpd = mp.mpf(0)
            step_ks, dif_log_finf = mp.mpf(0), mp.mpf(0)
            Ho = mp.matrix([[Hm[t][i, j] for j in range(n)] for i in idx])
            zo = mp.matrix([float(z[t, i]) for i in idx])
            Rblk = Rs[t][np.ix_(idx, idx)]
            if np.any(Rblk - np.diag(np.diag(Rblk))):
                # correlated noise: whiten with R = L L' (the density gains -log det L)
                L = mp.cholesky(_mpmat(mp, Rblk))
                Linv = mp.inverse(L)
                Ho, zo = Linv * Ho, Linv * zo
                rw = [mp.mpf(1)] * len(idx)
                log_det_l = sum((mp.log(L[j, j]) for j in range(len(idx))), mp.mpf(0))
            else:
                rw = [mp.mpf(float(Rblk[j, j])) for j in range(len(idx))]
                log_det_l = mp.mpf(0)
            for j in range(len(idx)):
                Zi = Ho[j, :]
                v = zo[j] - (Zi * a)[0]
                Finf = (Zi * Pinf * Zi.T)[0]
                Fst = (Zi * Pst * Zi.T)[0] + rw[j]
                if pinf_scale > 0 and Finf > tol * pinf_scale * max(1, mp.norm(Zi) ** 2):
                    Minf, Mst = Pinf * Zi.T, Pst * Zi.T
                    a = a + Minf * (v / Finf)
                    Pst = _sym(
                        mp,
                        Pst
                        + Minf * Minf.T * (Fst / Finf**2)
                        - (Mst * Minf.T + Minf * Mst.T) / Finf,
                    )
                    Pinf = _sym(mp, Pinf - Minf * Minf.T / Finf)
                    ll_dk -= half_log2pi + mp.log(Finf) / 2
                    dif_log_finf += mp.log(Finf) / 2
                    n_dif_obs += 1
                elif Fst > tol * max(1, mp.mnorm(Pst, 1)):
                    K = Pst * Zi.T / Fst
                    a = a + K * v
                    Pst = _sym(mp, Pst - K * K.T * Fst)
                    term = half_log2pi + mp.log(Fst) / 2 + v * v / (2 * Fst)
                    ll_dk -= term
                    step_ks -= term
                    n_terms += 1
                # else: an element with no variance at all (its value is implied); skipped
            if pinf_scale > 0 and mp.mnorm(Pinf, 1) <= tol * pinf_scale:
                Pinf = mp.zeros(n, n)
            # kalmanscan's step term: the density of the part orthogonal to the diffuse reach
            # (docs/dense.md) = univariate non-diffuse terms - 1/2 sum log Finf_i + 1/2 log pdet A
            # (A in the original observation space; whitened elements: - log det L)
            ll_ks += step_ks - dif_log_finf + lpd / 2 - log_det_l
            ll_dk -= log_det_l
            pdet_sum += lpd / 2
        # 2) covariance filter + RTS smoother with the diffuse coordinates at variance kappa
        a = _mpmat(mp, m0)
        P = _mpmat(mp, P0f) + Dm * kappa
        fm, fP, pmn, pPm = [], [], [], []
        for t in range(T):
            a = Fm[t] * a + cm[t]
            P = _sym(mp, Fm[t] * P * Fm[t].T + Qm[t])
            pmn.append(a.copy())
            pPm.append(P.copy())
            idx = [i for i in range(d) if obs[t, i]]
            if idx:
                Ho = mp.matrix([[Hm[t][i, j] for j in range(n)] for i in idx])
                Ro = _mpmat(mp, Rs[t][np.ix_(idx, idx)])
                zo = mp.matrix([float(z[t, i]) for i in idx])
                S = _sym(mp, Ho * P * Ho.T + Ro)
                Si = _pinv_sym(mp, S, tol)
                K = P * Ho.T * Si
                a = a + K * (zo - Ho * a)
                P = _sym(mp, P - K * S * K.T)
            fm.append(a.copy())
            fP.append(P.copy())
        sm, sP = [None] * T, [None] * T
        sm[T - 1], sP[T - 1] = fm[T - 1], fP[T - 1]
        for t in range(T - 2, -1, -1):
            J = fP[t] * Fm[t + 1].T * _pinv_sym(mp, pPm[t + 1], tol)
            sm[t] = fm[t] + J * (sm[t + 1] - pmn[t + 1])
            sP[t] = _sym(mp, fP[t] + J * (sP[t + 1] - pPm[t + 1]) * J.T)
        big = mp.sqrt(kappa)  # a variance this large is the kappa part: still diffuse
        diffuse = np.array([bool(max(fP[t][i, i] for i in range(n)) > big) for t in range(T)])
        out = dict(
            mean=np.stack([_npv(mp, x) for x in fm]),
            cov=np.stack([_np(mp, x) for x in fP]),
            pred_mean=np.stack([_npv(mp, x) for x in pmn]),
            pred_cov=np.stack([_np(mp, x) for x in pPm]),
            smooth_mean=np.stack([_npv(mp, x) for x in sm]),
            smooth_cov=np.stack([_np(mp, x) for x in sP]),
        )
        return DenseOracleResult(
            **out,
            diffuse=diffuse,
            loglik=_f(ll_ks),
            loglik_dk=_f(ll_dk),
            loglik_kfas=_f(ll_dk + half_log2pi * n_dif_obs),
            pdet_terms=_f(pdet_sum),
            n_diffuse_obs=n_dif_obs,
            n_loglik_terms=n_terms,
            dps=dps,
        )


# --------------------------------------------------------------------------------------------
# log-likelihood conventions

CONVENTIONS = ("kalmanscan", "diffuse-omitted", "statsmodels", "kfas")  # the first two: one


def loglik_offset(convention: str, F, H, observed, *, diffuse=None, dps: int = 50) -> float:
    """``loglik_kalmanscan - loglik_<convention>`` for a dense model with a diffuse prior.

    ``convention``: ``"statsmodels"`` (Durbin & Koopman's exact diffuse log-likelihood,
    statsmodels ``use_exact_diffuse=True``), ``"kfas"`` (KFAS ``logLik``) or ``"kalmanscan"``
    (= ``"diffuse-omitted"``, ``ks.filter``'s default ``loglik_convention``: 0). With
    ``P_inf`` the diffuse part of the predicted covariance, equal to ``I`` on the
    diffuse coordinates of the *first state* (the peers' normalization; kalmanscan's prior sits
    one step earlier, which matters only through ``F_0``, so pass F as the peers' transitions)
    and ``A_t = H_t P_inf,t H_t'`` over the observed rows of each step while ``P_inf != 0``:

        statsmodels:  1/2 sum_t [rank(A_t) log(2 pi) + log pdet(A_t)]
        kfas:         1/2 sum_t log pdet(A_t)

    F [n, n] or [T, n, n]; H [d, n] or [T, d, n]; observed [T, d] bool (or [T]: whole
    vectors); ``diffuse`` [n] bool (default all). The offsets do not depend on the data, the
    variances or the offsets of the model, only on F, H, the missing pattern and which
    coordinates are diffuse.

    >>> import numpy as np
    >>> round(loglik_offset("statsmodels", np.eye(1), np.eye(1), np.ones(100, bool)), 10)
    0.9189385332
    >>> round(loglik_offset("kfas", np.eye(1), 2 * np.eye(1), np.ones(5, bool)), 12)  # log 2
    0.69314718056
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    if convention in ("kalmanscan", "diffuse-omitted"):
        return 0.0
    mp = _mp()
    observed = np.asarray(observed, dtype=bool)
    T = observed.shape[0]
    n = np.asarray(F).shape[-1]
    d = np.asarray(H).shape[-2]
    if observed.ndim == 1:
        observed = np.repeat(observed[:, None], d, axis=1)
    Fs, Hs = _as_steps(F, T, (n, n)), _as_steps(H, T, (d, n))
    dif = np.ones(n, dtype=bool) if diffuse is None else np.asarray(diffuse, dtype=bool)
    with mp.workdps(dps):
        tol = mp.mpf(10) ** (-(dps // 2))
        Pinf = mp.diag([1 if v else 0 for v in dif])
        total, rank_total = mp.mpf(0), 0
        for t in range(T):
            if t > 0:
                Fm = _mpmat(mp, Fs[t])
                Pinf = _sym(mp, Fm * Pinf * Fm.T)
            scale = mp.mnorm(Pinf, 1)
            if scale == 0:
                break
            idx = [i for i in range(d) if observed[t, i]]
            if not idx:
                continue
            Ho = _mpmat(mp, Hs[t][idx, :])
            A = _sym(mp, Ho * Pinf * Ho.T)
            # below this, H P_inf H' is rounding of a direction the diffuse state no longer reaches
            floor = tol * scale * max(1, mp.mnorm(Ho, 1) ** 2)
            lpd, rank = _logpdet(mp, A, tol, floor)
            total += lpd / 2
            rank_total += rank
            # resolve: P_inf <- P_inf - P_inf H' A^+ H P_inf
            Pinf = _sym(mp, Pinf - Pinf * Ho.T * _pinv_sym(mp, A, tol, floor) * Ho * Pinf)
            if mp.mnorm(Pinf, 1) <= tol * scale:
                Pinf = mp.zeros(n, n)
        if convention == "kfas":
            return _f(total)
        return _f(total + rank_total * mp.log(2 * mp.pi) / 2)


def scalar_loglik_offset(convention: str, decay, loading, observed, diffuse: bool = True) -> float:
    """``loglik_kalmanscan - loglik_<convention>`` for one scalar lane (``ks.filter``'s model).

    With ``s`` the first observed step with ``loading != 0`` and no ``decay == 0`` at steps
    ``1..s`` (else the lane is proper before any observation and the offset is 0):

        statsmodels:  1/2 log(2 pi) + 1/2 log(h_s^2 prod_{k=1..s} a_k^2)
        kfas:         1/2 log(h_s^2 prod_{k=1..s} a_k^2)

    (``P_inf = 1`` on the state at step 0, the peers' first state.) Arrays ``[T]``.

    >>> round(scalar_loglik_offset("statsmodels", 1.0, 1.0, [True, True]), 10)
    0.9189385332
    >>> round(scalar_loglik_offset("kfas", [1.0, 0.5], [1.0, 3.0], [False, True]), 12)  # log 1.5
    0.405465108108
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    observed = np.asarray(observed, dtype=bool)
    T = observed.shape[0]
    a = np.broadcast_to(np.asarray(decay, dtype=np.float64), (T,))
    h = np.broadcast_to(np.asarray(loading, dtype=np.float64), (T,))
    if convention in ("kalmanscan", "diffuse-omitted") or not diffuse:
        return 0.0
    log_pinf = 0.0
    for t in range(T):
        if t > 0:
            if a[t] == 0:
                return 0.0
            log_pinf += 2 * math.log(abs(a[t]))
        if observed[t] and h[t] != 0:
            off = 0.5 * (log_pinf + 2 * math.log(abs(h[t])))
            return off + (0.5 * math.log(2 * math.pi) if convention == "statsmodels" else 0.0)
    return 0.0
