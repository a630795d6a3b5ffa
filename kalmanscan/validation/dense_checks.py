"""Validation rows for dense (matrix) state-space models: ``check_dense(quick) -> list[dict]``.

Truths (float64, none uses kalmanscan):

- ``dense: filterpy``: filterpy's ``KalmanFilter.batch_filter`` and ``rts_smoother`` with per-step
  F, Q, H, R (proper prior, whole observation vectors missing); the log-likelihood is summed from
  filterpy's own predicted moments.
- ``dense: oracle``: :func:`dense_oracle`, the joint Gaussian of all states and observations
  built explicitly in covariance form. A diffuse prior enters as flat (Lebesgue) coordinates ``u``
  of x_0 and is integrated out by generalized least squares, so diffuse priors, singular Q,
  offsets and partially missing vectors are all covered. Its log-likelihood is the exact diffuse
  convention of docs/dense.md computed from its definition: the sum over t of the log density of
  the part of z_t orthogonal to the directions the unresolved ``u`` still reach, given z_{1:t-1}.
- ``dense: statsmodels LLT (US GDP)``: ``UnobservedComponents(level="local linear trend",
  use_exact_diffuse=True)`` on 100 log US real GDP (bundled ``dense_us_realgdp.csv``). statsmodels
  reports Durbin & Koopman's diffuse log-likelihood; ours exceeds it by 1/2 sum_t log det(2 pi
  F_inf,t) over the diffuse steps, computed here by :func:`dk_diffuse_offset` (log 2 pi for this
  model).

Rows: truth, quantity, dtype, backend, max_rel_err, tol, n_models (+ worst_model). Errors are
normwise (:func:`metrics.normwise`) for moments and :func:`metrics.loglik_error` for
log-likelihoods.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from .metrics import loglik_error, normwise, worse

LOG2PI = math.log(2 * math.pi)


# ----------------------------------------------------------------------------- random models


def random_model(
    rng, n, d, T, *, tv=False, prior="cov", missing=0.0, partial=True, offset=True, singular_q=False
):
    """A random stable model: dict of float64 arrays, time on axis 0, per-step matrices."""

    def one():
        F = rng.normal(size=(n, n))
        F *= rng.uniform(0.5, 1.05) / max(np.abs(np.linalg.eigvals(F)).max(), 1e-12)
        G = rng.normal(size=(n, n))
        Q = G @ G.T / n + 0.05 * np.eye(n)
        if singular_q and n > 1:
            Q[0, :] = Q[:, 0] = 0.0
        H = rng.normal(size=(d, n))
        G = rng.normal(size=(d, d))
        R = G @ G.T / d + 0.3 * np.eye(d)
        return F, Q, H, R

    mats = [one() for _ in range(T if tv else 1)]
    F, Q, H, R = (np.stack([m[i] for m in mats]) for i in range(4))
    if not tv:
        F, Q, H, R = (np.broadcast_to(x, (T,) + x.shape[1:]) for x in (F, Q, H, R))
    c = rng.normal(size=(T, n)) * 0.3 if offset else np.zeros((T, n))
    m0 = rng.normal(size=n)
    # simulate
    x = m0 + rng.normal(size=n)
    z = np.empty((T, d))
    for t in range(T):
        x = F[t] @ x + c[t] + np.linalg.cholesky(Q[t] + 1e-12 * np.eye(n)) @ rng.normal(size=n)
        z[t] = H[t] @ x + np.linalg.cholesky(R[t]) @ rng.normal(size=d)
    if missing:
        if partial:
            z[rng.random((T, d)) < missing] = np.nan
        else:
            z[rng.random(T) < missing] = np.nan
    model = dict(
        z=z,
        F=np.ascontiguousarray(F),
        Q=np.ascontiguousarray(Q),
        H=np.ascontiguousarray(H),
        R=np.ascontiguousarray(R),
        offset=c,
        prior_mean=m0,
    )
    if prior == "cov":
        G = rng.normal(size=(n, n))
        model["prior_cov"] = G @ G.T / n + 0.5 * np.eye(n)
    elif prior == "diffuse":
        model["prior_precision"] = np.zeros((n, n))
    elif prior == "partial":
        G = rng.normal(size=(n, n - 1))
        model["prior_precision"] = G @ G.T  # rank n-1: one diffuse direction (a rotated one)
    return model


# ----------------------------------------------------------------------------- the oracle


def _prior_parts(model):
    n = model["F"].shape[-1]
    if "prior_cov" in model:
        return model["prior_cov"], np.zeros((n, 0))
    L0 = model.get("prior_precision", np.zeros((n, n)))
    w, U = np.linalg.eigh(L0)
    null = w <= 1e-12 * max(np.abs(w).max(), 1e-300)
    V = U[:, null]
    P = (U[:, ~null] / w[~null]) @ U[:, ~null].T
    return P, V


def _flat_logpdf(r, G, S):
    """log ∫ N(r; G v, S) dv over v in R^k (G full column rank k; k = 0 is a plain Gaussian)."""
    m = r.shape[0]
    if m == 0:
        return 0.0
    Li = np.linalg.inv(np.linalg.cholesky(S))
    rw, Gw = Li @ r, Li @ G
    logdet = -2.0 * np.log(np.diag(Li)).sum()
    k = G.shape[1]
    if k:
        Qg, Rg = np.linalg.qr(Gw)
        rw = rw - Qg @ (Qg.T @ rw)
        logdet += 2.0 * np.log(np.abs(np.diag(Rg))).sum()
    return -0.5 * ((m - k) * LOG2PI + logdet + rw @ rw)


def _orth(G, tol=1e-9, scale=None):
    """Orthonormal basis of range(G): singular values above tol * scale (default: the largest)."""
    if G.size == 0:
        return np.zeros((G.shape[0], 0))
    U, s, _ = np.linalg.svd(G, full_matrices=False)
    ref = s.max() if scale is None else scale
    return U[:, s > tol * ref] if ref > 0 else np.zeros((G.shape[0], 0))


def dense_oracle(model):
    """Filtered/smoothed moments and exact-diffuse log-likelihood of the explicit joint Gaussian.

    Returns dict(mean [T,n], cov [T,n,n] (NaN where the filtered state is not yet identified),
    smooth_mean, smooth_cov, loglik).
    """
    z, F, Q, H, R, c = (model[k] for k in ("z", "F", "Q", "H", "R", "offset"))
    T, d = z.shape
    n = F.shape[-1]
    m0 = model["prior_mean"]
    P0, V = _prior_parts(model)
    q = V.shape[1]
    # x_t = Phi_t x0 + sum_s Phi_{t,s} (c_s + w_s); noise vector eps = [xi0, w_1..w_T]
    ne = n * (T + 1)
    Sig_eps = np.zeros((ne, ne))
    Sig_eps[:n, :n] = P0
    for t in range(T):
        Sig_eps[n * (t + 1) : n * (t + 2), n * (t + 1) : n * (t + 2)] = Q[t]
    Lx = np.zeros((T * n, ne))  # X = mux + Gx u + Lx eps
    Gx = np.zeros((T * n, q))
    mux = np.zeros(T * n)
    Phi = np.eye(n)  # maps x0 -> x_t
    cur_L = np.zeros((n, ne))
    cur_L[:, :n] = np.eye(n)
    cur_mu = m0.copy()
    for t in range(T):
        cur_L = F[t] @ cur_L
        cur_L[:, n * (t + 1) : n * (t + 2)] += np.eye(n)
        cur_mu = F[t] @ cur_mu + c[t]
        Phi = F[t] @ Phi
        Lx[t * n : (t + 1) * n] = cur_L
        mux[t * n : (t + 1) * n] = cur_mu
        Gx[t * n : (t + 1) * n] = Phi @ V
    SX = Lx @ Sig_eps @ Lx.T
    obs = ~np.isnan(z)
    rows = []
    for t in range(T):
        for i in range(d):
            if obs[t, i]:
                rows.append((t, i))
    Hbig = np.zeros((len(rows), T * n))
    Rbig = np.zeros((len(rows), len(rows)))
    y = np.zeros(len(rows))
    for a, (t, i) in enumerate(rows):
        Hbig[a, t * n : (t + 1) * n] = H[t, i]
        y[a] = z[t, i]
        for b, (s, j) in enumerate(rows):
            if s == t:
                Rbig[a, b] = R[t, i, j]
    step = np.array([t for t, _ in rows], dtype=int)
    SY = Hbig @ SX @ Hbig.T + Rbig
    SXY = SX @ Hbig.T
    Gy = Hbig @ Gx
    ry = y - Hbig @ mux

    def posterior(sel, t):
        """Moments of x_t given the observations in sel (flat u); None if u not identified."""
        G, S, r = Gy[sel], SY[np.ix_(sel, sel)], ry[sel]
        Cxy = SXY[t * n : (t + 1) * n][:, sel]
        Si = np.linalg.inv(S)
        mean = mux[t * n : (t + 1) * n] + Cxy @ Si @ r
        cov = SX[t * n : (t + 1) * n, t * n : (t + 1) * n] - Cxy @ Si @ Cxy.T
        if q:
            Om = G.T @ Si @ G
            if np.linalg.matrix_rank(Om, tol=1e-9 * max(np.abs(Om).max(), 1e-300)) < q:
                return None
            u = np.linalg.solve(Om, G.T @ Si @ r)
            D = Gx[t * n : (t + 1) * n] - Cxy @ Si @ G
            mean = mean + D @ u
            cov = cov + D @ np.linalg.solve(Om, D.T)
        return mean, 0.5 * (cov + cov.T)

    mean = np.full((T, n), np.nan)
    cov = np.full((T, n, n), np.nan)
    sm_mean = np.full((T, n), np.nan)
    sm_cov = np.full((T, n, n), np.nan)
    allsel = np.arange(len(rows))
    for t in range(T):
        p = posterior(allsel[step <= t], t)
        if p is not None:
            mean[t], cov[t] = p
        p = posterior(allsel, t)
        if p is not None:
            sm_mean[t], sm_cov[t] = p
    # log-likelihood: sum_t log p(w_t | z_{1:t-1}) with w_t orthogonal to the unresolved directions
    ll = 0.0
    for t in range(T):
        past = allsel[step < t]
        now = allsel[step == t]
        if now.size == 0:
            continue
        Bres = _orth(Gy[past].T) if q else np.zeros((0, 0))  # resolved u-directions (orthonormal)
        if q:
            Nperp = np.eye(q) - Bres @ Bres.T
            Nb = _orth(Nperp, scale=1.0)  # unresolved u-directions
            Uu = _orth(Gy[now] @ Nb, scale=np.linalg.norm(Gy[now], 2))  # diffuse directions of z_t
            W = np.eye(now.size) - Uu @ Uu.T
            Wb = _orth(W, scale=1.0)  # orthonormal basis of the kept part
        else:
            Bres = np.zeros((0, 0))
            Wb = np.eye(now.size)
        if Wb.shape[1] == 0:
            continue
        k = Bres.shape[1]
        G_past = Gy[past] @ Bres if q else np.zeros((past.size, 0))
        G_now = Wb.T @ Gy[now] @ Bres if q else np.zeros((Wb.shape[1], 0))
        # joint of (w_t, z_{1:t-1}) as a linear map of y
        M = np.zeros((Wb.shape[1] + past.size, len(rows)))
        M[: Wb.shape[1], now] = Wb.T
        M[Wb.shape[1] :, past] = np.eye(past.size)
        Gj = np.concatenate([G_now, G_past], 0) if k else np.zeros((M.shape[0], 0))
        lj = _flat_logpdf(M @ ry, Gj, M @ SY @ M.T)
        lp = _flat_logpdf(
            ry[past], G_past if k else np.zeros((past.size, 0)), SY[np.ix_(past, past)]
        )
        ll += lj - lp
    return dict(mean=mean, cov=cov, smooth_mean=sm_mean, smooth_cov=sm_cov, loglik=ll)


# ----------------------------------------------------------------------------- filterpy


def filterpy_truth(model):
    """filterpy batch_filter + rts_smoother (proper prior, zero offset, whole vectors missing)."""
    from filterpy.kalman import KalmanFilter

    z, F, Q, H, R = (model[k] for k in ("z", "F", "Q", "H", "R"))
    T, d = z.shape
    n = F.shape[-1]
    kf = KalmanFilter(dim_x=n, dim_z=d)
    kf.x = model["prior_mean"].astype(np.float64).copy()
    kf.P = model["prior_cov"].astype(np.float64).copy()
    zs = [None if np.isnan(z[t]).any() else z[t].copy() for t in range(T)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        means, covs, mp, Pp = kf.batch_filter(zs, Fs=list(F), Qs=list(Q), Hs=list(H), Rs=list(R))
        sm, sP, _, _ = kf.rts_smoother(means, covs, Fs=list(F), Qs=list(Q))
    ll = 0.0
    for t in range(T):
        if zs[t] is None:
            continue
        S = H[t] @ Pp[t] @ H[t].T + R[t]
        v = zs[t] - H[t] @ mp[t]
        ll += -0.5 * (d * LOG2PI + np.linalg.slogdet(S)[1] + v @ np.linalg.solve(S, v))
    return dict(
        mean=np.asarray(means),
        cov=np.asarray(covs),
        smooth_mean=np.asarray(sm),
        smooth_cov=np.asarray(sP),
        loglik=ll,
    )


# ----------------------------------------------------------------------------- statsmodels


def dk_diffuse_offset(F, H, observed):
    """1/2 sum_t log det(2 pi F_inf,t) over diffuse steps, Durbin & Koopman's P_inf = I on x_1.

    Our exact-diffuse log-likelihood minus statsmodels' (use_exact_diffuse=True) equals this value
    for a fully diffuse model whose prior applies to the first state (statsmodels' convention).
    F [n,n], H [d,n] time-invariant; observed [T] bool (whole vectors).
    """
    n = F.shape[0]
    Pinf = np.eye(n)
    off = 0.0
    for t in range(len(observed)):
        if observed[t]:
            Finf = H @ Pinf @ H.T
            w = np.linalg.eigvalsh(Finf)
            keep = w > 1e-10 * max(w.max(), 1.0)
            if keep.any():
                off += 0.5 * (keep.sum() * LOG2PI + np.log(w[keep]).sum())
                Pinf = Pinf - Pinf @ H.T @ np.linalg.pinv(Finf) @ H @ Pinf
        Pinf = F @ Pinf @ F.T
        if np.abs(Pinf).max() < 1e-12:
            break
    return off


def gdp_series():
    path = Path(__file__).resolve().parent.parent / "data" / "dense_us_realgdp.csv"
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    col = lines[0].split(",").index("realgdp")
    return 100.0 * np.log(np.array([float(ln.split(",")[col]) for ln in lines[1:]]))


def statsmodels_llt(params=None):
    """statsmodels' exact-diffuse local linear trend on log US real GDP at ``params``
    (obs var, level var, slope var; None: its maximum-likelihood fit)."""
    import statsmodels.api as sm

    y = gdp_series()
    mod = sm.tsa.UnobservedComponents(y, level="local linear trend", use_exact_diffuse=True)
    # statsmodels freezes the covariances once they change by less than ssm.tolerance (steady
    # state); that shortcut alone moves its covariances by ~1e-9 relative here, so turn it off.
    mod.ssm.tolerance = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = mod.fit(disp=False) if params is None else mod.smooth(np.asarray(params, dtype=float))
    return y, np.asarray(res.params), res


# ----------------------------------------------------------------------------- the rows


def _runners():
    import torch

    out = [("torch", "cpu", ("float64", "float32")), ("sequential", "cpu", ("float64",))]
    if torch.cuda.is_available():
        out.append(("torch-cuda", "cuda", ("float64", "float32")))
    return out


def _run_ks(model, backend, device, dtype):
    import torch

    import kalmanscan.dense as kd

    tdt = torch.float64 if dtype == "float64" else torch.float32
    kw = {k: torch.as_tensor(np.asarray(v), dtype=tdt, device=device) for k, v in model.items()}
    be = "sequential" if backend == "sequential" else "torch"
    z = kw.pop("z")
    res = kd.smooth(z, kw.pop("F"), kw.pop("Q"), kw.pop("H"), kw.pop("R"), backend=be, **kw)
    f = res.filtered
    np_ = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    return dict(
        mean=np_(f.mean),
        cov=np_(f.cov),
        smooth_mean=np_(res.mean),
        smooth_cov=np_(res.cov),
        loglik=float(np_(f.loglik)),
        nobs=int(np.isfinite(model["z"]).sum()),
    )


class _Rows:
    def __init__(self):
        self.rows = {}

    def add(self, truth, quantity, dtype, backend, err, name):
        from kalmanscan.testing import tolerance

        key = (truth, quantity, dtype, backend)
        row = self.rows.setdefault(
            key,
            dict(
                truth=truth,
                quantity=quantity,
                dtype=dtype,
                backend=backend,
                max_rel_err=0.0,
                tol=tolerance("truth", dtype),
                n_models=0,
                worst_model="",
            ),
        )
        row["n_models"] += 1
        err = float(err)
        if worse(err, row["max_rel_err"]):
            row["max_rel_err"], row["worst_model"] = err, name


def _compare(rows, truth_name, truth, ks, dtype, backend, name, which=("filtered", "smoothed")):
    # the steps the truth identifies, chosen by the truth alone: a kalmanscan mean or covariance
    # that is NaN or infinite there makes the error infinite (metrics.normwise), so it fails
    fin = np.isfinite(truth["mean"]).all(-1)
    if "filtered" in which:
        rows.add(
            truth_name,
            "filtered mean",
            dtype,
            backend,
            normwise(ks["mean"][fin], truth["mean"][fin]),
            name,
        )
        rows.add(
            truth_name,
            "filtered cov",
            dtype,
            backend,
            normwise(ks["cov"][fin], truth["cov"][fin]),
            name,
        )
        rows.add(
            truth_name,
            "loglik",
            dtype,
            backend,
            loglik_error(ks["loglik"], truth["loglik"], ks["nobs"]),
            name,
        )
    if "smoothed" in which:
        fs = np.isfinite(truth["smooth_mean"]).all(-1)
        rows.add(
            truth_name,
            "smoothed mean",
            dtype,
            backend,
            normwise(ks["smooth_mean"][fs], truth["smooth_mean"][fs]),
            name,
        )
        rows.add(
            truth_name,
            "smoothed cov",
            dtype,
            backend,
            normwise(ks["smooth_cov"][fs], truth["smooth_cov"][fs]),
            name,
        )


def check_dense(quick: bool = True, seed: int = 0, backends=None) -> list[dict]:
    """All dense rows (module docstring). ``quick``: short sequences, seconds on a laptop.
    ``backends``: only the runners with these labels (``kalmanscan validate --backend``;
    ``None``: all of ``torch``, ``sequential`` and, on a GPU, ``torch-cuda``)."""
    rng = np.random.default_rng(seed)
    rows = _Rows()
    runners = [r for r in _runners() if backends is None or r[0] in backends]
    # filterpy: proper prior, whole vectors missing, zero offset, n up to 8
    fp_cases = [
        (n, d, T, tv)
        for n, d in ((1, 1), (2, 1), (4, 2), (8, 3))
        for T, tv in ((50, False), (40, True))
    ]
    fp_cases.append((8, 3, 1000 if quick else 10_000, False))
    for n, d, T, tv in fp_cases:
        model = random_model(
            rng, n, d, T, tv=tv, prior="cov", missing=0.1, partial=False, offset=False
        )
        truth = filterpy_truth(model)
        name = f"n{n}-d{d}-T{T}" + ("-tv" if tv else "")
        for backend, device, dtypes in runners:
            for dtype in dtypes:
                _compare(
                    rows,
                    "dense: filterpy",
                    truth,
                    _run_ks(model, backend, device, dtype),
                    dtype,
                    backend,
                    name,
                )
    # oracle: diffuse / partly diffuse / proper priors, partial missing, offsets, singular Q
    oc = [(1, 1, 12), (2, 1, 15), (3, 2, 12), (4, 2, 10)] + (
        [] if quick else [(8, 3, 12), (6, 1, 20)]
    )
    for n, d, T in oc:
        for prior in ("cov", "diffuse", "partial"):
            for singular_q in (False, True) if n > 1 else (False,):
                model = random_model(
                    rng,
                    n,
                    d,
                    T,
                    tv=True,
                    prior=prior,
                    missing=0.15,
                    partial=True,
                    singular_q=singular_q,
                )
                truth = dense_oracle(model)
                name = f"n{n}-d{d}-T{T}-{prior}" + ("-singQ" if singular_q else "")
                for backend, device, dtypes in runners:
                    for dtype in dtypes:
                        if dtype == "float32" and prior != "cov":
                            continue  # diffuse float32 rows: see the LLT rows below
                        ks = _run_ks(model, backend, device, dtype)
                        _compare(rows, "dense: oracle", truth, ks, dtype, backend, name)
    # statsmodels: local linear trend on log US real GDP, MLE and a fixed parameter set
    # Two parameter sets: statsmodels' maximum-likelihood fit puts the observation variance on its
    # boundary (~1e-11), where the smoothed covariances are ill-conditioned for both programs, so we
    # use that fit's level and slope variances with a small positive observation variance, and a
    # second, rougher set.
    for label, params in (("near-mle", (0.01, 0.58, 0.043)), ("rough", (0.5, 0.3, 0.01))):
        y, p, res = statsmodels_llt(params)
        truth = dict(
            mean=np.asarray(res.filtered_state).T,
            cov=np.moveaxis(np.asarray(res.filtered_state_cov), -1, 0),
            smooth_mean=np.asarray(res.smoothed_state).T,
            smooth_cov=np.moveaxis(np.asarray(res.smoothed_state_cov), -1, 0),
            loglik=float(res.llf),
        )
        truth["mean"][:2] = (
            np.nan
        )  # the two diffuse steps: statsmodels reports only the finite part
        F = np.array([[1.0, 1.0], [0.0, 1.0]])
        H = np.array([[1.0, 0.0]])
        off = dk_diffuse_offset(F, H, np.isfinite(y))
        model = dict(z=y[:, None], F=F, Q=np.diag([p[1], p[2]]), H=H, R=np.array([[p[0]]]))
        for backend, device, dtypes in runners:
            for dtype in dtypes:
                ks = _run_ks(model, backend, device, dtype)
                ks["loglik"] -= off
                truth_name = "dense: statsmodels LLT (US GDP)"
                _compare(rows, truth_name, truth, ks, dtype, backend, f"llt-{label}")
    return list(rows.rows.values())
