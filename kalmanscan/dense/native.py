"""Native CPU path of the dense filter and smoother (``kalmanscan/dense/_native_dense.c``).

One compiled pass over time per series (series one after another, GIL released): the exact
sequential filter with Durbin & Koopman's exact initial update for diffuse priors (the diffuse
part kept as an exact rank-k factor, reduced by Householder reflections; a large proper prior,
:data:`LARGE_PRIOR`, and a step's near noise-free entries are carried on such a factor with the
exact finite update), entries of ``z_t``
processed one at a time after decorrelating ``R_t = L Dg L'`` (so singular ``R``, ``R = 0``
included, is allowed), and Durbin & Koopman's univariate state smoother (``r, N`` and, while
diffuse, ``r1, N1, N2``). float64 throughout; float32 inputs are computed in float64. No
adjoint of its own: with inputs that require grad, :mod:`kalmanscan.dense.api` attaches the
torch path's gradients to its values. ``backend="auto"`` uses it for CPU inputs. Math:
docs/dense.md ("Native path").

Notation as in :mod:`kalmanscan.dense.parallel` ([B, T, ...] tensors of a laid-out Model).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.dense._args import Z_INF_MESSAGE, Model
from kalmanscan.dense.parallel import _range_projector, _sym, rank_tol

try:
    from kalmanscan.dense import _native_dense as _ext
except ImportError:  # built without a C compiler: the torch backend serves the CPU
    _ext = None


def available() -> bool:
    """Whether the compiled extension ``kalmanscan.dense._native_dense`` is importable."""
    return _ext is not None


class NativeParts(NamedTuple):
    """Outputs of :func:`run`, [B, T, ...]; ``filtered_cov`` holds +-inf where still diffuse."""

    filtered_mean: torch.Tensor
    filtered_cov: torch.Tensor
    filtered_precision: torch.Tensor
    diffuse: torch.Tensor  # [B, T] bool
    pred_mean: torch.Tensor
    pred_cov: torch.Tensor
    loglik: torch.Tensor  # [B]
    smoothed_mean: torch.Tensor | None
    smoothed_cov: torch.Tensor | None
    smoothed_precision: torch.Tensor | None


def _empty(*shape) -> torch.Tensor:
    """float64 storage on ordinary pages. numpy's allocator asks the OS for huge pages on blocks
    of 4 MB and more (madvise): faster to fault in when free huge pages are at hand, but where they
    are not (a previous call's outputs still held, as in a loop that keeps its last result) the
    kernel compacts memory first, and a 13-state filter at T = 1e5 (405 MB of outputs) took 1.7 s
    instead of 0.2-0.3 s, its smoother up to 3 s instead of 0.5; on ordinary pages 0.3 s and
    0.75 s (medians, same process, alternating)."""
    return torch.empty(shape, dtype=torch.float64)


def _ready(t: torch.Tensor, k: int) -> torch.Tensor:
    """float64 with contiguous trailing k dims (broadcast leading axes kept as stride 0)."""
    if t.dtype != torch.float64:
        t = t.to(torch.float64)
    if k == 2:
        n1, n2 = t.shape[-2:]
        if t.stride(-1) != 1 or t.stride(-2) != n2:
            t = t.contiguous()
    return t


def _spec(t: torch.Tensor, k: int):
    """(address, series stride, time stride, entry stride) in elements."""
    sb = t.stride(0) if t.shape[0] > 1 else 0
    st = t.stride(1) if t.shape[1] > 1 else 0
    se = t.stride(2) if k == 1 and t.shape[2] > 1 else (1 if k == 1 else 0)
    return (t.data_ptr(), sb, st, se)


LARGE_PRIOR = 1e4
"""A proper prior whose largest variance exceeds this times the first step's largest process
variance (or any proper prior of a model without process noise there) is a large prior: the
kernel carries it as a factor, P0 = D0 D0', resolved one direction per observed entry like a
diffuse one but exactly (docs/dense.md, "Native path"), so that no rank-one update subtracts
terms of the prior's size."""


def _large(P0: torch.Tensor, Q0: torch.Tensor) -> torch.Tensor:
    """[B] bool: which proper priors P0 [B, n, n] are large next to Q0 [B, n, n]."""
    top = torch.linalg.eigvalsh(_sym(P0))[..., -1]
    q = torch.linalg.eigvalsh(_sym(Q0))[..., -1].clamp_min(0.0)
    return top > LARGE_PRIOR * q


def _prior(model: Model):
    """Finite part P0 [B, n, n], factor D0 [B, n, n] (zero columns where proper) and whether
    D0 factors large proper priors (1) or spans diffuse directions (0)."""
    B, n = model.m0.shape
    f64 = dict(dtype=torch.float64, device="cpu")
    if model.P0 is not None:
        P0 = model.P0.to(torch.float64).expand(B, n, n)
        big = _large(P0, model.Q[:, 0].to(torch.float64).expand(B, n, n))
        if not bool(big.any()):
            return P0.contiguous(), torch.zeros(B, n, n, **f64), 0
        L, info = torch.linalg.cholesky_ex(P0)
        big = big & (info == 0)
        D0 = torch.where(big[:, None, None], L, torch.zeros_like(L)).contiguous()
        P0 = torch.where(big[:, None, None], torch.zeros_like(P0), P0).contiguous()
        return P0, D0, int(bool(big.any()))
    L0 = model.L0.to(torch.float64)
    if not bool(L0.any()):  # fully diffuse
        return (
            torch.zeros(B, n, n, **f64),
            torch.eye(n, **f64).expand(B, n, n).contiguous(),
            0,
        )
    tol = rank_tol(torch.float64)
    scale = torch.linalg.matrix_norm(L0)
    w, U = torch.linalg.eigh(_sym(L0))
    null = (w <= tol * scale.unsqueeze(-1)).to(L0.dtype)
    D0 = (U * null.unsqueeze(-2)).contiguous()
    Pr, _ = _range_projector(L0, scale, tol)
    Pinf = torch.eye(n, **f64) - Pr
    P0 = _sym(torch.linalg.inv(L0 + Pinf) - Pinf)
    return P0.contiguous(), D0, 0


def _fill_precision(prec: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """Rows the kernel could not invert by Cholesky (NaN): invert them by LU as the torch path."""
    bad = torch.isnan(prec[..., 0, 0])
    if bool(bad.any()):
        c = cov[bad]
        prec[bad] = torch.linalg.inv_ex(torch.where(torch.isinf(c), torch.zeros_like(c), c))[0]


def run(model: Model, smooth: bool) -> NativeParts | None:
    """Filter (and smooth) a laid-out model; ``None`` when a diffuse direction is never resolved
    (the caller then uses the torch path, which keeps unresolved directions)."""
    if _ext is None:
        raise RuntimeError("kalmanscan.dense._native_dense is not built; use backend='torch'")
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    z = _ready(model.z, 1)  # NaN where missing
    F, Q, H, R = (_ready(x, 2) for x in (model.F, model.Q, model.H, model.R))
    c = _ready(model.c, 1)
    m0 = model.m0.to(torch.float64).contiguous()
    P0, D0, fin = _prior(model)
    ins = [
        _spec(z, 1),
        _spec(F, 2),
        _spec(c, 1),
        _spec(Q, 2),
        _spec(H, 2),
        _spec(R, 2),
    ]
    f64 = dict(dtype=torch.float64)
    empty = _empty
    kcap = min(T, 4 * n + 8)
    while True:
        outs = [
            empty(B, T, n),
            empty(B, T, n, n),
            empty(B, T, n, n),
            empty(B, T, n),
            empty(B, T, n, n),
            empty(B),
            torch.from_numpy(np.empty((B, T), np.bool_)),
            empty(B, kcap, n, n),
            torch.zeros(B, kcap, **f64),
        ]
        if smooth:
            outs += [empty(B, T, n), empty(B, T, n, n), empty(B, T, n, n)]
        ptrs = [o.data_ptr() for o in outs] + [0] * (12 - len(outs))
        nd, npred, nbad, zinf = _ext.run(
            int(smooth), fin, B, T, n, d, kcap, m0.data_ptr(), P0.data_ptr(), D0.data_ptr(), ins,
            ptrs,
        )
        if zinf:
            raise ValueError(Z_INF_MESSAGE)
        if nd > T:
            return None
        if npred <= kcap:
            break
        kcap = T
    fmean, fcov, fprec, pmean, pcov, ll, flag = outs[:7]
    sm = outs[9:] if smooth else [None, None, None]
    if nbad:  # covariances Cholesky could not invert (singular): LU as the torch path
        _fill_precision(fprec, fcov)
        if smooth:
            _fill_precision(sm[2], sm[1])
    parts = [fmean, fcov, fprec, flag, pmean, pcov, ll, *sm]
    dtype = model.z.dtype
    if dtype != torch.float64:
        parts = [x if x is None or x.dtype == torch.bool else x.to(dtype) for x in parts]
    return NativeParts(*parts)


def loglik(model: Model) -> torch.Tensor:
    """The log-likelihood [B] alone (no per-step output is written): the objective of
    :func:`kalmanscan.dense.fit`. ``model.z`` keeps its NaNs; a direction never resolved is
    fine here (its steps add nothing, as in :func:`run`)."""
    if _ext is None:
        raise RuntimeError("kalmanscan.dense._native_dense is not built; use backend='torch'")
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    z = _ready(model.z, 1)
    F, Q, H, R = (_ready(x, 2) for x in (model.F, model.Q, model.H, model.R))
    c = _ready(model.c, 1)
    m0 = model.m0.to(torch.float64).contiguous()
    P0, D0, fin = _prior(model)
    ins = [_spec(z, 1), _spec(F, 2), _spec(c, 1), _spec(Q, 2), _spec(H, 2), _spec(R, 2)]
    ll = _empty(B)
    ptrs = [0] * 12
    ptrs[5] = ll.data_ptr()
    _, _, _, zinf = _ext.run(
        -1, fin, B, T, n, d, 0, m0.data_ptr(), P0.data_ptr(), D0.data_ptr(), ins, ptrs
    )
    if zinf:
        raise ValueError(Z_INF_MESSAGE)
    return ll
