"""Native CPU path of the dense filter and smoother (``kalmanscan/dense/_native_dense.c``).

One compiled pass over time per series (series one after another, GIL released): the exact
sequential filter with Durbin & Koopman's exact initial update for diffuse priors (the diffuse
part kept as an exact rank-k factor, reduced by Householder reflections and made an orthonormal
basis of its range after a prediction that leaves its columns of sizes far apart, at their
rounding or dependent (``F = diag(1e-100, 0.9)``, a singular ``F``); a large proper prior,
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

import math
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.dense._args import Z_INF_MESSAGE, Model
from kalmanscan.dense.parallel import _range_projector, _sym, prior_start, rank_tol

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
    """Finite part P0 [B, n, n], factor D0 [B, n, n] and ``fin`` [B] uint8 (None: all 0): per
    series, whether D0 factors a large proper prior (1) or spans diffuse directions (0; zero
    columns where proper). The diffuse directions are those of
    :func:`~kalmanscan.dense.parallel.prior_start` (exactly prior_cov's inf coordinates; a user's
    prior precision by its rule), so a series gets what it gets alone, whatever the batch
    holds."""
    B, n = model.m0.shape
    f64 = dict(dtype=torch.float64, device="cpu")
    if model.P0 is not None:
        P0 = model.P0.to(torch.float64).expand(B, n, n)
        D0 = None
    elif model.P0inf is None and not bool(model.L0.any()):  # fully diffuse
        return (
            torch.zeros(B, n, n, **f64),
            torch.eye(n, **f64).expand(B, n, n).contiguous(),
            None,
        )
    else:
        P0, D0 = (x.to(torch.float64).expand(B, n, n) for x in prior_start(model))
    proper = None if D0 is None else ~(D0 != 0).any(-1).any(-1)
    big = _large(P0, model.Q[:, 0].to(torch.float64).expand(B, n, n))
    if proper is not None:
        big = big & proper
    if D0 is None:
        D0 = torch.zeros(B, n, n, **f64)
    if not bool(big.any()):
        return P0.contiguous(), D0.contiguous(), None
    L, info = torch.linalg.cholesky_ex(P0)
    big = big & (info == 0)
    D0 = torch.where(big[:, None, None], L, D0).contiguous()
    P0 = torch.where(big[:, None, None], torch.zeros_like(P0), P0).contiguous()
    return P0, D0, big.to(torch.uint8).contiguous()


SCALE_LOG2 = 64
"""A series whose largest process or observation variance lies outside ``2**-64 .. 2**64``
(about 5e-20 .. 2e19) runs scaled by a power of two, ``4**e`` its variances (:func:`_exponents`):
the kernel forms products of two variances (``M M' / f`` in an update), which under- or
overflow beyond about 1e-154 .. 1e154 (filtered means 0.3 .. 6 relative off at variances 1e-200,
inf at 1e300). The scaling is exact: means times ``2**e``, covariances times ``4**e``, the
log-likelihood minus ``e log 2`` per proper term (the kernel counts them, ``O_NTERM``)."""


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its broadcast (stride-0) axes cut to length 1: a view holding each value once."""
    st = t.stride()
    return t.as_strided([1 if k == 0 else n for n, k in zip(t.shape, st, strict=True)], st)


def _series_max(t: torch.Tensor):
    """max |t| per series of a [B, ...] tensor, reading each stored value once: a float where
    one small block serves every series, else ``[B]`` or ``[1]``."""
    c = _compact(t).detach()
    if c.shape[0] == 1 and c.numel() <= 64:  # (no numpy call: this runs on every call)
        return max(map(abs, c.reshape(-1).tolist()))
    c = c.numpy()
    return np.abs(c).reshape(c.shape[0], -1).max(1)


def _exponents(model: Model) -> np.ndarray | None:
    """Per-series ``e`` [B] (int) with ``4**e`` about the largest variance of the series (of
    ``Q`` and ``R``; of the prior where both are 0), or None where every series is within
    :data:`SCALE_LOG2` (nothing to scale)."""
    q, r = _series_max(model.Q), _series_max(model.R)
    if isinstance(q, float) and isinstance(r, float) and (q > 0 or r > 0):
        if abs(math.frexp(max(q, r))[1]) <= SCALE_LOG2:  # the common case, in Python floats
            return None
    v = np.maximum(q, r).astype(np.float64)
    if model.P0 is not None:
        v = np.where(v > 0, v, _series_max(model.P0))
    _, x = np.frexp(v)  # v = m 2**x, 1/2 <= m < 1 (x = 0 for v = 0)
    if not (np.abs(x) > SCALE_LOG2).any():
        return None
    return np.broadcast_to(x // 2, (model.z.shape[0],))


def _ldexp(t: torch.Tensor | None, e: np.ndarray) -> torch.Tensor | None:
    """``t * 2**e`` exactly, ``e`` [B] per series of the [B, ...] tensor ``t``; axes of ``t``
    broadcast in time stay broadcast (and in the series where ``e`` is one value)."""
    if t is None:
        return None
    c = _compact(t)
    f = torch.from_numpy(np.ldexp(1.0, e[:1] if (e == e[0]).all() else e))  # powers of two
    return (c * f.to(c.dtype).reshape(-1, *([1] * (c.ndim - 1)))).expand(t.shape)


def _scaled_model(model: Model, e: np.ndarray) -> Model:
    """The model with z, offset and prior mean times ``2**-e`` and its variances times ``4**-e``
    per series (``prior_precision`` times ``4**e``): the same model in other units."""
    down = lambda t: _ldexp(t, -e)  # noqa: E731
    down2 = lambda t: _ldexp(_ldexp(t, -e), -e)  # noqa: E731  (2**-2e may be subnormal)
    return model._replace(
        z=down(model.z), c=down(model.c), m0=down(model.m0), Q=down2(model.Q), R=down2(model.R),
        P0=down2(model.P0), P0inf=down2(model.P0inf),
        L0=None if model.L0 is None else _ldexp(_ldexp(model.L0, e), e),
    )  # fmt: skip


def _unscale(parts: list, e: np.ndarray, nterm: torch.Tensor) -> list:
    """Outputs of the scaled model in the model's units: [fmean, fcov, fprec, flag, pmean, pcov,
    ll, smean, scov, sprec] (None where not computed)."""
    up = lambda t: _ldexp(t, e)  # noqa: E731
    up2 = lambda t: _ldexp(_ldexp(t, e), e)  # noqa: E731
    down2 = lambda t: _ldexp(_ldexp(t, -e), -e)  # noqa: E731
    fmean, fcov, fprec, flag, pmean, pcov, ll, smean, scov, sprec = parts
    ll = ll - nterm * torch.from_numpy(e * math.log(2.0))
    out = [up(fmean), up2(fcov), down2(fprec), flag, up(pmean), up2(pcov), ll]
    out += [None if x is None else f(x) for x, f in ((smean, up), (scov, up2), (sprec, down2))]
    return [x if x is None or x.dtype == torch.bool else x.contiguous() for x in out]


def _negative_variance(cov) -> torch.Tensor:
    """[B, T] bool: the covariances [B, T, n, n] with a negative diagonal entry."""
    return (torch.diagonal(cov, dim1=-2, dim2=-1) < 0).any(-1)


def _known_rows(model: Model, fcov, fprec, flag, pcov, sm):
    """The rule of :mod:`kalmanscan.dense.singular` at the rows the kernel flagged (NaN
    precision: a singular covariance, or a near-singular one where the kernel's gate is on), in
    place on float64 outputs, in the series :func:`~kalmanscan.dense.singular.gate` lets
    through (elsewhere those rows take the inverse); the smoothed rows also where the filter
    knows a direction exactly, resolved to the rounding of the prediction they start from
    (``pcov``: the smoothed covariance is the predicted one less a product, and below
    ``eps |P_t|t-1|`` it has no digit). A flagged diffuse step takes its diffuse projector from
    the reference's exact initial filter over the head (the same decisions,
    :func:`kalmanscan.dense.sequential.filter_moments`)."""
    from kalmanscan.dense import _args, sequential, singular
    from kalmanscan.dense.parallel import _steps

    tol = rank_tol(torch.float64)
    blocks = singular.state_blocks(model)
    on = singular.gate(model, tol)  # the kernel's own; where this one is off: the inverse
    # the kernel's flags (NaN precision), and a negative variance (a covariance all rounding,
    # which its screen's bound misses at a diffuse step)
    rows = torch.isnan(fprec[..., 0, 0]) | _negative_variance(fcov)
    P, Pd = fcov, None
    dif = rows & flag
    if bool(dif.any()):  # the finite part there is not in fcov (+-inf entries): the head's
        L = int(torch.nonzero(dif.any(0)).max()) + 1
        head = _steps(_args.mask_missing(model), slice(0, L))
        head = head._replace(
            **{k: v.to(torch.float64) for k, v in head._asdict().items()
               if isinstance(v, torch.Tensor) and v.is_floating_point()}
        )  # fmt: skip
        hf = sequential.filter_moments(head)[0]
        Pd = torch.zeros_like(fcov)
        Pd[:, :L] = _range_projector(hf.diffuse, torch.linalg.matrix_norm(hf.diffuse), tol)[0]
        P = fcov.clone()
        P[:, :L] = torch.where(dif[:, :L, None, None], hf.cov, fcov[:, :L])
    cov, prec, known = singular.apply(fcov, fprec, rows, P, Pd, blocks, tol, allow=on)
    fcov.copy_(cov)
    fprec.copy_(prec)
    if sm[0] is None:
        return
    scov, sprec = sm[1], sm[2]
    rows = torch.isnan(sprec[..., 0, 0]) | (known != 0).any((-1, -2)) | _negative_variance(scov)
    cov, prec, _ = singular.apply(scov, sprec, rows, scov, None, blocks, tol, known, on, pcov)
    scov.copy_(cov)
    sprec.copy_(prec)


def run(model: Model, smooth: bool) -> NativeParts | None:
    """Filter (and smooth) a laid-out model; ``None`` when a diffuse direction is never resolved
    (left at the end, or, when smoothing, one a singular F forgets first: Durbin & Koopman's
    smoother would give it a finite variance; the caller then uses the torch path, which keeps
    unresolved directions) or has faded (two diffuse directions that a power of ``F`` aligns
    below ``2^-16`` of each other: the kernel's factor cannot hold the second one's scale, the
    torch path's diffuse head carries it graded, :mod:`kalmanscan.dense.graded`)."""
    if _ext is None:
        raise RuntimeError("kalmanscan.dense._native_dense is not built; use backend='torch'")
    e = _exponents(model)
    model0 = model
    if e is not None:  # variances far from 1: run the same model in units where they are O(1)
        model = _scaled_model(model, e)
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
        outs += [empty(B, T, n), empty(B, T, n, n), empty(B, T, n, n)] if smooth else [None] * 3
        outs.append(torch.zeros(B, **f64))  # O_NTERM
        ptrs = [0 if o is None else o.data_ptr() for o in outs]
        nd, npred, nbad, zinf, nfaded = _ext.run(
            int(smooth), 0, B, T, n, d, kcap, m0.data_ptr(), P0.data_ptr(), D0.data_ptr(), ins,
            ptrs, 0 if fin is None else fin.data_ptr(),
        )  # fmt: skip
        if zinf:
            raise ValueError(Z_INF_MESSAGE)
        if nd > T or nfaded:
            return None
        if npred <= kcap:
            break
        kcap = T
    fmean, fcov, fprec, pmean, pcov, ll, flag = outs[:7]
    sm = outs[9:12]
    parts = [fmean, fcov, fprec, flag, pmean, pcov, ll, *sm]
    if e is not None:
        parts = _unscale(parts, e, outs[12])
    neg = any(bool(_negative_variance(x).any()) for x in (parts[1], parts[8]) if x is not None)
    if nbad or neg:  # singular or near-singular covariances: kalmanscan/dense/singular.py's rule
        _known_rows(model0, *(parts[i] for i in (1, 2, 3, 5)), parts[7:10])
    dtype = model.z.dtype
    if dtype != torch.float64:
        parts = [x if x is None or x.dtype == torch.bool else x.to(dtype) for x in parts]
    return NativeParts(*parts)


def loglik(model: Model) -> torch.Tensor:
    """The log-likelihood [B] alone (no per-step output is written): the objective of
    :func:`kalmanscan.dense.fit`. ``model.z`` keeps its NaNs; a direction never resolved is
    fine here (its steps add nothing, as in :func:`run`); where one has faded (:func:`run`) the
    torch path's log-likelihood."""
    if _ext is None:
        raise RuntimeError("kalmanscan.dense._native_dense is not built; use backend='torch'")
    e = _exponents(model)
    model0 = model
    if e is not None:  # as in run
        model = _scaled_model(model, e)
    B, T, d = model.z.shape
    n = model.F.shape[-1]
    z = _ready(model.z, 1)
    F, Q, H, R = (_ready(x, 2) for x in (model.F, model.Q, model.H, model.R))
    c = _ready(model.c, 1)
    m0 = model.m0.to(torch.float64).contiguous()
    P0, D0, fin = _prior(model)
    ins = [_spec(z, 1), _spec(F, 2), _spec(c, 1), _spec(Q, 2), _spec(H, 2), _spec(R, 2)]
    ll, nterm = _empty(B), torch.zeros(B, dtype=torch.float64)
    ptrs = [0] * 13
    ptrs[5], ptrs[12] = ll.data_ptr(), nterm.data_ptr()
    _, _, _, zinf, nfaded = _ext.run(
        -1, 0, B, T, n, d, 0, m0.data_ptr(), P0.data_ptr(), D0.data_ptr(), ins, ptrs,
        0 if fin is None else fin.data_ptr(),
    )  # fmt: skip
    if zinf:
        raise ValueError(Z_INF_MESSAGE)
    if nfaded:
        from kalmanscan.dense._args import mask_missing
        from kalmanscan.dense.parallel import filter_parts

        with torch.no_grad():
            return filter_parts(mask_missing(model0)).loglik_steps.sum(1)
    return ll if e is None else ll - nterm * torch.from_numpy(e * math.log(2.0))
