"""The native smoother where it converts Durbin & Koopman's ``r, N`` into information: a noise-free
entry at the conversion step, and an ill-conditioned conversion (docs/dense.md, "Native path").

1. A partially diffuse prior (``prior_cov = diag(inf, 1)``) and a noise-free entry (``R =
   diag(0, 1)``) missing at step 0: the smoothed variance at step 0 was 1.026 for 1.199 (14 %),
   while ``"sequential"`` and ``"torch"`` agreed with the truth to 3e-16. The information form
   that serves the diffuse steps started from ``J = (I - N P)^-1 N`` at step 1, where the exact
   entry makes the smoothed covariance ``P - P N P`` singular and ``J`` infinite: the solve
   returned rounding. The same with a large proper prior's head (``1e4 I``, carried as a
   factor): 3.5e-2 relative. Random models with a partially diffuse prior and a singular ``R``
   (seeds 80, 440 and 792 of a sweep of 1,000 degenerate models): 7.9e-3, 1.2e-4 and 9.3e-2.
2. An integrated trend (unit upper-triangular ``F``, fully diffuse, one scalar entry): smoothed
   means at the four diffuse steps 55 times the truth, 20 posterior sd off. The backward
   square-root rows that serve those steps were set from ``r, N`` at a later step by a solve
   with ``I - N P``, of condition 5e11 there (smoothed covariances of condition 1.5e12); run
   from the end they are within 4.1e-10 sd. ``"sequential"`` and ``"torch"`` raise on this model
   (a Cholesky factor), so the truth here is mpmath alone.

Truth: an mpmath covariance filter (missing entries dropped) and Rauch-Tung-Striebel smoother at
100 digits, a diffuse state's prior variance at ``kappa = 1e40`` (unchanged at 1e60 with 200
digits, checked when this was written).
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.testing import TOLERANCES

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

KAPPA = 1e40
TRUTH = TOLERANCES[("truth", "float64")]  # 1e-9 relative
ORACLE = TOLERANCES[("oracle", "float64")]  # 1e-8 relative
ORACLE_SD = TOLERANCES[("oracle_sd", "float64")]  # 1e-6 posterior sd


def _mp_smooth(z, F, Q, H, R, P0, dps=100):
    """Smoothed means [T, n] and covariances [T, n, n] (float64) of the model with prior N(0, P0)
    on x_0, in mpmath at ``dps`` digits."""
    with mp.workdps(dps):
        M = lambda A: mp.matrix(np.asarray(A, float).tolist())  # noqa: E731
        Fm, Qm = M(F), M(Q)
        m, P = mp.matrix(len(F), 1), M(P0)
        fm, fP, pm, pP = [], [], [], []
        for t in range(len(z)):
            m = Fm * m
            P = Fm * P * Fm.T + Qm
            pm.append(m)
            pP.append(P)
            o = ~np.isnan(z[t])
            if o.any():
                Ht = M(H[o])
                S = Ht * P * Ht.T + M(R[np.ix_(o, o)])
                K = P * Ht.T * mp.inverse(S)
                m = m + K * (M(z[t][o][:, None]) - Ht * m)
                P = P - K * Ht * P
                P = (P + P.T) / 2
            fm.append(m)
            fP.append(P)
        sm, sP = fm[:], fP[:]
        for t in range(len(z) - 2, -1, -1):
            G = fP[t] * Fm.T * mp.inverse(pP[t + 1])
            sm[t] = fm[t] + G * (sm[t + 1] - pm[t + 1])
            sP[t] = fP[t] + G * (sP[t + 1] - pP[t + 1]) * G.T
        f = lambda X: np.array(X.tolist(), dtype=float)  # noqa: E731
        return np.array([f(x)[:, 0] for x in sm]), np.array([f(x) for x in sP])


def _rel(a, b):
    """max |a - b| / max |b| (over every step: the sweep's metric)."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def _sd_error(mean, truth_mean, truth_cov):
    """Per step: the largest error of the smoothed means in posterior sd."""
    sd = np.sqrt(np.einsum("tii->ti", truth_cov))
    return (np.abs(mean - truth_mean) / sd).max(-1)


# --- 1. a noise-free entry at the step where r, N become information ---------------------------

F2 = np.array([[-0.56, 0.17], [-1.16, 0.46]])
Q2 = 0.5 * np.eye(2)
H2 = np.array([[1.14, -0.45], [0.43, 0.25]])
R2 = np.diag([0.0, 1.0])  # entry 0 observed without noise
Z2 = np.array([[np.nan, -0.86], [-2.03, 1.41], [-0.05, 2.52], [0.83, 0.28], [-0.66, np.nan],
               [-0.51, 1.57]])  # fmt: skip


def test_partly_diffuse_exact_entry_missing_at_the_first_step():
    """Was 3.3e-2 (1.026 for 1.199 at step 0); measured 5e-16."""
    _, truth = _mp_smooth(Z2, F2, Q2, H2, R2, np.diag([KAPPA, 1.0]))
    s = kd.smooth(Z2, F2, Q2, H2, R2, prior_mean=np.zeros(2), prior_cov=np.diag([np.inf, 1.0]),
                  backend="native")  # fmt: skip
    assert _rel(s.cov, truth) < TRUTH
    assert _rel(s.cov[0], truth[0]) < TRUTH


def test_large_prior_exact_entry_missing_at_the_first_step():
    """A large proper prior's head (1e4 I, above native.LARGE_PRIOR times Q): the same
    conversion at the exact entry's step. Was 3.5e-2; measured 1.0e-11 (Durbin & Koopman's
    P - P N P, which cancels like the prior over the posterior), means 4.7e-14 sd."""
    P0 = 1e4 * np.eye(2)
    mean, truth = _mp_smooth(Z2, F2, Q2, H2, R2, P0)
    s = kd.smooth(Z2, F2, Q2, H2, R2, prior_mean=np.zeros(2), prior_cov=P0, backend="native")
    assert _rel(s.cov, truth) < TRUTH
    assert _sd_error(s.mean, mean, truth).max() < ORACLE_SD


def _sweep_model(seed):
    """Model ``seed`` of the random sweep of degenerate dense models (the probe's
    dense_sweep.py): 2-4 states, 1-3 entries, T = 18, 30 % missing, R singular in 1 of 5."""
    rng = np.random.default_rng(seed)
    n = rng.integers(2, 5)
    d = rng.integers(1, 4)
    T = 18
    F = rng.normal(size=(n, n)) * rng.choice([0.3, 0.6, 1.0])
    if rng.random() < 0.3:
        F = np.eye(n) + np.triu(rng.normal(size=(n, n)) * 0.3, 1)
    A = rng.normal(size=(n, rng.integers(1, n + 1)))
    Q = A @ A.T
    H = rng.normal(size=(d, n))
    if rng.random() < 0.3:
        H[:, rng.integers(n)] = 0
    B = rng.normal(size=(d, d))
    R = B @ B.T * rng.choice([1e-3, 0.1, 1.0])
    if rng.random() < 0.2 and d > 1:
        R[0, :] = 0
        R[:, 0] = 0
    z = rng.normal(size=(T, d)) * 2
    z[rng.random(z.shape) < 0.3] = np.nan
    ndiff = rng.integers(1, n + 1) if rng.random() < 0.5 else 0
    P0 = np.eye(n) * 2.0
    P0k = P0.copy()
    for i in range(ndiff):
        P0[i, i] = np.inf
        P0k[i, i] = KAPPA
    return z, F, Q, H, R, P0, P0k


@pytest.mark.parametrize("seed", [80, 440, 792])
def test_sweep_models_partly_diffuse_with_a_singular_r(seed):
    """Partially diffuse priors with a noise-free entry. Smoothed covariances were 7.9e-3,
    1.2e-4 and 9.3e-2 relative off; measured 1.7e-14, 6.1e-14, 6.2e-13."""
    z, F, Q, H, R, P0, P0k = _sweep_model(seed)
    assert np.isinf(np.diag(P0)).any() and not np.isinf(np.diag(P0)).all()
    assert np.linalg.eigvalsh(R)[0] < 1e-12  # a noise-free direction
    mean, truth = _mp_smooth(z, F, Q, H, R, P0k)
    s = kd.smooth(z, F, Q, H, R, prior_mean=np.zeros(len(F)), prior_cov=P0, backend="native")
    assert _rel(s.cov, truth) < TRUTH
    assert _sd_error(s.mean, mean, truth).max() < ORACLE_SD


# --- 2. an ill-conditioned conversion: the integrated trend -----------------------------------

F4 = np.array([[1.0, -0.020145633255359237, -0.3138744990197448, -0.31427965005315545],
               [0.0, 1.0, 0.09566194734192143, 0.3609448352346369],
               [0.0, 0.0, 1.0, -0.32662559374912387],
               [0.0, 0.0, 0.0, 1.0]])  # fmt: skip
Q4 = np.array([
    [4.986527427149689, -3.537947650477021, 1.881695925087719, 4.824593731332991],
    [-3.537947650477021, 2.669616748300135, -1.4109287003066413, -3.4393339730383663],
    [1.881695925087719, -1.4109287003066413, 1.0816192700892113, 1.4061124661507467],
    [4.824593731332991, -3.4393339730383663, 1.4061124661507467, 6.17845731956235],
])  # fmt: skip
H4 = np.array([[0.36123359856172743, 0.06510806568211731, -0.17008531061814844, 0.0]])
R4 = np.array([[0.0007138690900535068]])
Z4 = np.array([1.4100510662098096, 0.26960376781415, -1.1751586928346502, -2.228018137549004,
               1.9807834823994586, 2.594202595582534, 1.1441545486963662, -2.11138995661771,
               -0.6105725805524826, -0.12114630756491769, -2.7544005905744045,
               -0.6328048583942804, -2.202621578118268, np.nan, -1.7294158633167243, np.nan,
               -0.23219470407118956, -1.119865739624423])[:, None]  # fmt: skip


def test_integrated_trend_diffuse_steps_against_mpmath():
    """Smoothed means at the diffuse steps 0-3 were 20 sd off (about 55 times the truth:
    [-340034, 1604014, -108175, -2273] at step 0 for [-6109, 28840, -1943, -38]), their
    covariances 1.5e-2 relative; measured 4.1e-10 sd and 8.3e-11. The later steps are the
    filter's (condition 8e15 in its covariance at step 3): 2.7e-5 sd, as before."""
    mean, truth = _mp_smooth(Z4, F4, Q4, H4, R4, KAPPA * np.eye(4))
    s = kd.smooth(Z4, F4, Q4, H4, R4, backend="native")
    nd = 4  # steps predicted with a diffuse part (one scalar entry a step, 4 states)
    assert bool(s.filtered.diffuse[nd - 2]) and not bool(s.filtered.diffuse[nd - 1])
    err = _sd_error(s.mean, mean, truth)
    assert err[:nd].max() < ORACLE_SD
    assert err.max() < 1e-4  # the filter's own level after the head: 2.7e-5
    for t in range(nd):
        assert _rel(s.cov[t], truth[t]) < ORACLE
