"""``backend="torch"`` smoother with noise-free observation entries (``R`` singular, ``H Q H' + R``
positive definite), and its gradients, against the mpmath oracle.

The scan's smoother combined the filtered moments with the suffix information ``(eta, J)`` that
``z_{t+1:T}`` carry about ``x_t``, held as a matrix and combined through ``X = I + C J``. With an
explosive ``F`` observed through a noise-free entry that information spans 12 decades (7e12
beside 2.1 on the model below): a matrix keeps its weak directions only to ``eps |J|``, and the
LU of ``X`` (condition 1e12) and the rounding of ``C`` in the directions the exact entry pins
(``eps |I - K H|^2 |Q|``, times the information) lost them entirely. Before: smoothed means 46.5
off a truth of 3.2 on the three-state model below (problem 1 of the dense probe), 9.6 off at
``R[0, 0] = 1e-12``; 8141 off on a two-state model whose exact entry sees the process noise at
1.3e-7 of its scale, where a smoothed covariance with negative variances made the
known-direction rule raise torch's ``LinAlgError`` (problem 7); and the default CPU path
(``"auto"``), whose gradients are the scan's, had ``d smoothed mean / d z`` 163 off. Now the
suffix holds the information as square-root rows and the covariance as a root, conditioned by
QR (``kalmanscan.dense.scan.RowElement``, ``condition``; docs/dense.md, "Prior after the scan").

Truth: ``kalmanscan.validation.oracle.dense_oracle`` (mpmath filter and RTS smoother) for the
moments, and central differences of the oracle's values for the gradients.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import kalmanscan.dense as kd
from kalmanscan.dense import native
from kalmanscan.validation.oracle import dense_oracle

needs_native = pytest.mark.skipif(not native.available(), reason="native extension not built")
nan = np.nan

# Problem 1: three states, explosive F (spectral radius 2.1), rank-1 Q, entry 0 noise-free.
F1 = np.array([[1.58, -0.82, 0.25], [0.24, 1.23, -0.96], [-1.06, 1.46, 1.72]])
G1 = np.array([[0.862], [-0.351], [0.0876]])  # Q = G G'
H1 = np.array([[0.90, 2.42, 0.46], [0.25, 0.65, 0.70]])
R1 = np.diag([0.0, 0.186])
Z1 = np.array([
    [-0.47, 1.58], [0.87, 5.74], [nan, -1.98], [nan, -0.46], [3.32, nan], [nan, nan],
    [0.16, -0.01], [-1.11, -3.24], [2.51, nan], [nan, 0.92], [nan, -2.28], [3.62, -1.01],
    [nan, -5.07], [-0.14, nan], [1.45, 1.12], [0.02, -0.76], [1.23, nan], [0.94, -1.77],
])  # fmt: skip

# Problem 7: two states, proper prior, rank-1 Q that the exact entry sees at 1.3e-7 of its scale.
F7 = np.array([[-0.18780551773123413, 1.1226743355208588],
               [-0.6298943443790226, 0.0288108556319135]])  # fmt: skip
Q7 = np.array([[1.0328916974996172, 0.4875643634636687],
               [0.4875643634636687, 0.23014901668315574]])  # fmt: skip
H7 = np.array([[0.18550428449907636, -0.3937289770101651],
               [-0.7434156219733538, 0.6248597581757683]])  # fmt: skip
R7 = np.diag([0.0, 0.0007036311118953392])
Z7 = np.array([
    [-3.5219685373810563, nan], [-0.10299897053665161, 0.8093192570994475],
    [0.6085929634904089, -4.557335059925872], [2.2003420916970646, nan], [nan, nan],
    [-0.3875250481178611, 1.2904512107065684], [0.6355653994535468, nan],
    [-2.0002560574008914, 4.367062152757686], [-3.881397981205372, 1.4962313179663551],
    [-1.5244022809865567, -1.5729365629113938], [nan, 1.4829624402766068],
    [3.6306576962638224, nan], [4.084226371583851, nan], [-0.3237867043795618, nan],
    [nan, 0.18265487758904955], [1.8409476325456022, 1.5952065932258772],
    [-0.5666927355848843, -0.15981771060043432], [-0.4683869348108625, -3.8616972978321016],
])  # fmt: skip
PRIOR7 = dict(prior_mean=np.zeros(2), prior_cov=2.0 * np.eye(2))


def _long_model():
    """70 steps (three chunks of 32, nine of 8), three states, F of spectral radius 1.97,
    rank-1 Q, entry 0 noise-free, 30 % missing; fully diffuse prior."""
    rng = np.random.default_rng(3)
    F = rng.normal(size=(3, 3)) * 0.9
    q = rng.normal(size=3)
    H = rng.normal(size=(2, 3))
    z = rng.normal(size=(70, 2)) * 2
    z[rng.random(z.shape) < 0.3] = nan
    return z, F, np.outer(q, q), H, np.diag([0.0, 0.2])


def _errors(res, truth):
    """(max |mean - truth| / max |truth mean|, max |cov - truth| / max |truth cov|)."""
    em = np.abs(res.mean - truth.smooth_mean).max() / np.abs(truth.smooth_mean).max()
    ec = np.abs(res.cov - truth.smooth_cov).max() / np.abs(truth.smooth_cov).max()
    return em, ec


@pytest.mark.parametrize("r00", [0.0, 1e-12], ids=["R00-0", "R00-1e-12"])
@pytest.mark.parametrize("prior", ["diffuse", "proper-I", "proper-100I"])
def test_explosive_exact_entry_smoother_against_oracle(prior, r00):
    """Problem 1 (before: means 46 off at R00 = 0 with every prior, 9.6 at 1e-12, covariances
    4e-4 relative; now 1.6e-10 off at most, 5e-11 relative, with the prior 100 I)."""
    R = np.diag([r00, 0.186])
    kw = {} if prior == "diffuse" else dict(prior_mean=np.zeros(3), prior_cov=np.eye(3))
    if prior == "proper-100I":
        kw["prior_cov"] = 100.0 * np.eye(3)
    Q = G1 @ G1.T
    truth = dense_oracle(Z1, F1, Q, H1, R, dps=60, **kw)
    res = kd.smooth(Z1, F1, Q, H1, R, backend="torch", **kw)
    em, ec = _errors(res, truth)
    assert em < 1e-9 and ec < 1e-9, (em, ec)


@functools.cache
def _long_oracle():
    """:func:`dense_oracle` of :func:`_long_model` (60 digits), the same for every chunk:
    computed once."""
    return dense_oracle(*_long_model(), dps=60)


@pytest.mark.parametrize("chunk", [8, 16, 32])
def test_long_series_blocked_suffix_against_oracle(chunk):
    """The blocked suffix scan (chunk totals combined, then the fix-up) carries the rows too
    (before: means 39, 1.2e-2, 4.7e-2 relative off at chunk 8, 16, 32; now 2.5e-10 at most)."""
    z, F, Q, H, R = _long_model()
    truth = _long_oracle()
    em, ec = _errors(kd.smooth(z, F, Q, H, R, backend="torch", chunk=chunk), truth)
    assert em < 1e-8 and ec < 1e-8, (em, ec)


def test_exact_entry_barely_seeing_process_noise_is_served():
    """Problem 7: the scan raised torch's LinAlgError (its smoothed covariance at step 4 had
    negative variances; means 8141 off). Now the values, 4e-10 relative (8.5e-9 absolute): the
    scan's filter's error, which loses eps cond(H Q H' + R) = eps 5e8 there."""
    truth = dense_oracle(Z7, F7, Q7, H7, R7, dps=60, **PRIOR7)
    res = kd.smooth(Z7, F7, Q7, H7, R7, backend="torch", **PRIOR7)
    em, ec = _errors(res, truth)
    assert em < 1e-8 and ec < 1e-9, (em, ec)
    assert np.isfinite(res.mean).all() and np.isfinite(res.cov).all()


def _loss_np(z, F, G, H, r11, w, R00=0.0, kw=None, oracle=True):
    """sum(w * smoothed mean) + sum(diag smoothed cov), from the oracle (numpy in)."""
    R = np.diag([R00, r11])
    o = dense_oracle(z, F, G @ G.T, H, R, dps=60, **(kw or {}))
    return float((o.smooth_mean * w).sum() + np.einsum("tii->", o.smooth_cov))


def _central(f, x, idx, h=1e-6):
    xp, xm = x.copy(), x.copy()
    xp[idx] += h
    xm[idx] -= h
    return (f(xp) - f(xm)) / (2 * h)


@functools.cache
def _central_reference():
    """The oracle's central differences of :func:`test_smoother_gradients_against_central_
    differences` (the same for both backends: computed once): ``w``, ``{name: (idxs, fd)}``
    and the report's ``d sum(smoothed mean[11]) / d z[11, 0]``."""
    w = np.random.default_rng(1).normal(size=(18, 3))
    args = dict(z=Z1, F=F1, G=G1, H=H1, r11=np.array(0.186))
    out = {}
    for name, x in args.items():
        x = np.asarray(x, dtype=np.float64)
        idxs = [i for i in np.ndindex(x.shape) if np.isfinite(x[i])]
        if name == "z":  # the steps around the worst one (11), both entries where observed
            idxs = [i for i in idxs if 9 <= i[0] <= 13]

        def f(v, name=name):
            return _loss_np(**{**args, name: v}, w=w)

        out[name] = (idxs, np.array([_central(f, x, i) for i in idxs]))
    zp, zm = Z1.copy(), Z1.copy()
    zp[11, 0] += 1e-6
    zm[11, 0] -= 1e-6
    Q = G1 @ G1.T
    fd = (dense_oracle(zp, F1, Q, H1, R1, dps=60).smooth_mean[11].sum()
          - dense_oracle(zm, F1, Q, H1, R1, dps=60).smooth_mean[11].sum()) / 2e-6  # fmt: skip
    w.flags.writeable = False
    return w, out, fd


# one pytest-xdist worker runs both (``--dist loadgroup``): _central_reference once
@pytest.mark.xdist_group("exact-entry-central-differences")
@pytest.mark.parametrize("backend", [pytest.param("auto", marks=needs_native), "torch"])
def test_smoother_gradients_against_central_differences(backend):
    """Problem 1's autograd path: the gradients of smoothed means and covariances w.r.t. z, F,
    Q (as G G'), H and the noisy entry's variance; "auto" returns native values carrying the
    scan's gradients. Before: 4.5 (the variance) .. 2.4e3 (H) relative off, d sum(mean[11]) /
    d z[11, 0] 1.1270 for 1.1386; now 6e-7 at most (the differences' own error)."""
    w, central, fd_report = _central_reference()
    args = dict(z=Z1, F=F1, G=G1, H=H1, r11=np.array(0.186))
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in args.items()}
    res = kd.smooth(ts["z"], ts["F"], ts["G"] @ ts["G"].T, ts["H"],
                    torch.diag(torch.stack([torch.zeros((), dtype=torch.float64), ts["r11"]])),
                    backend=backend)  # fmt: skip
    loss = (res.mean * torch.tensor(w)).sum() + res.cov.diagonal(0, -2, -1).sum()
    grads = dict(zip(ts, torch.autograd.grad(loss, list(ts.values())), strict=True))
    for name in args:
        idxs, fd = central[name]
        g = grads[name].numpy()
        got = np.array([g[i] for i in idxs])
        err = np.abs(got - fd).max() / np.abs(fd).max()
        assert err < 1e-5, (name, err)
    # the report's number: d sum(smoothed mean[11]) / d z[11, 0]
    tz = torch.tensor(Z1, requires_grad=True)
    kd.smooth(tz, F1, G1 @ G1.T, H1, R1, backend=backend).mean[11].sum().backward()
    fd = fd_report
    assert abs(float(tz.grad[11, 0]) - fd) < 1e-6 * abs(fd), (float(tz.grad[11, 0]), fd)


def test_data_gradients_on_the_weakly_seen_exact_entry():
    """Problem 7 on the autograd path: d loss / d z (before: the call raised)."""
    w = np.random.default_rng(2).normal(size=(18, 2))
    tz = torch.tensor(Z7, requires_grad=True)
    res = kd.smooth(tz, F7, Q7, H7, R7, backend="torch", **PRIOR7)
    ((res.mean * torch.tensor(w)).sum()).backward()

    def f(z):
        return float((dense_oracle(z, F7, Q7, H7, R7, dps=60, **PRIOR7).smooth_mean * w).sum())

    idxs = [i for i in np.ndindex(Z7.shape) if np.isfinite(Z7[i])]
    fd = np.array([_central(f, Z7, i) for i in idxs])
    got = np.array([tz.grad.numpy()[i] for i in idxs])
    assert np.abs(got - fd).max() < 1e-6 * np.abs(fd).max()


def test_gradient_wrt_the_noise_free_entrys_variance_at_zero():
    """d smoothed outputs / d R[0, 0] at R[0, 0] = 0 (a one-sided derivative: the entry turns
    noisy) stays the covariance form's, through the square-root values: 135.24 on this model,
    against the oracle's forward difference."""
    rng = np.random.default_rng(3)
    F = np.array([[0.8, 0.2], [-0.1, 0.7]])
    A = rng.normal(size=(2, 2))
    Q = A @ A.T * 0.3
    H = rng.normal(size=(2, 2))
    z = rng.normal(size=(12, 2))
    z[3, 0] = nan
    kw = dict(prior_mean=np.zeros(2), prior_cov=np.eye(2))
    Rt = torch.tensor(np.diag([0.0, 0.7]), requires_grad=True)
    res = kd.smooth(z, F, Q, H, Rt, backend="torch", **kw)
    (res.mean.sum() + res.cov.sum()).backward()

    def f(r00):
        o = dense_oracle(z, F, Q, H, np.diag([r00, 0.7]), dps=60, **kw)
        return float(o.smooth_mean.sum() + o.smooth_cov.sum())

    h = 1e-10
    fd = (f(h) - f(0.0)) / h
    assert abs(float(Rt.grad[0, 0]) - fd) < 1e-5 * abs(fd), (float(Rt.grad[0, 0]), fd)


def test_float32():
    """float32 on the scan. A mild exact-entry model (stable F, 40 steps, chunks of 8) within
    the float32 table's 1e-4; the explosive model of problem 1 (before: torch's LinAlgError from
    eigh) within 1e-3: its information spans 12 decades, 6e5 of float32's 1/eps, and keeps
    4e-4 of its means (5e-5 of its covariances)."""
    rng = np.random.default_rng(5)
    F = np.array([[0.9, 0.2, 0.0], [-0.1, 0.8, 0.3], [0.0, -0.2, 0.7]])
    q = rng.normal(size=3)
    Q = np.outer(q, q) + 0.05 * np.eye(3)
    H = rng.normal(size=(2, 3))
    R = np.diag([0.0, 0.5])
    z = rng.normal(size=(40, 2))
    z[rng.random(z.shape) < 0.25] = nan
    kw = dict(prior_mean=np.zeros(3), prior_cov=np.eye(3))
    truth = dense_oracle(z, F, Q, H, R, dps=60, **kw)
    f32 = [a.astype(np.float32) for a in (z, F, Q, H, R)]
    kw32 = {k: v.astype(np.float32) for k, v in kw.items()}
    res = kd.smooth(*f32, backend="torch", chunk=8, **kw32)
    em, ec = _errors(res, truth)
    assert res.mean.dtype == np.float32 and em < 1e-4 and ec < 1e-4, (em, ec)

    Q1 = G1 @ G1.T
    truth = dense_oracle(Z1, F1, Q1, H1, R1, dps=60)
    res = kd.smooth(*(a.astype(np.float32) for a in (Z1, F1, Q1, H1, R1)), backend="torch")
    em, ec = _errors(res, truth)
    assert em < 1e-3 and ec < 1e-3, (em, ec)
