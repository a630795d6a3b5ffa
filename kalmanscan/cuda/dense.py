"""Fused Triton filter and smoother for small dense states (the ``"triton"`` backend of
``kalmanscan.dense``).

Notation as :mod:`kalmanscan.dense.scan` (B series, T steps, n state padded to NP = 2, 4 or 8,
d observation components; R diagonal after whitening, ``r_k`` its entries). An element over the
steps of a chunk says ``p(x_j | x_{i-1}, z_{i:j}) = N(A x_{i-1} + b, C)`` and
``p(z_{i:j} | x_{i-1}) ∝ exp(eta' x_{i-1} - x_{i-1}' J x_{i-1} / 2)``.

Reduce-then-scan over chunks of ``L`` steps:

1. ``chunk_elements``: one program per (chunk, series) composes its steps' elements from the
   identity, one step at a time (predict ``A <- F A``, ``b <- F b + c``, ``C <- F C F' + Q``; then
   one rank-1 update per observed component with ``g = A' h``, ``s = h' C h + r``): no solves.
   A step with ``n`` or more observed entries each 1e4 times more precise than its prediction
   (``r < 1e-4 s``) shrinks ``C`` in every direction, which the rank-1 updates form as a
   difference of prediction-sized terms, ``eps s`` off; where the next predictions grow that
   past Q (an explosive F: ``|F|_F^2 s > 1e4 tr Q``) such a chunk sets :data:`SHRUNK`, and the
   call is launched again with an accurate pass that takes those steps' ``(b, C)`` in
   information form (F = 1000 I over a gap: the carried start 1.8e-2 off before in float32,
   1.7e-7 with it).
2. ``carry``: the filtered state before each chunk, from the one before the previous chunk and
   that chunk's element (the posterior of ``x_{i-1}`` given the chunk's information,
   ``(I + P J)^-1`` by Gauss-Jordan with partial pivoting, pushed through ``A, b, C``: the "prior
   at the end" step of :func:`kalmanscan.dense.parallel.filter_parts`). Many chunks take two
   levels: ``group_elements`` composes groups of ``G`` chunk elements (the combine of
   :func:`kalmanscan.dense.scan.combine`), one ``carry`` walks the groups, a second walks the
   chunks inside every group from its start.
3. ``chunk_filter``: one program per (chunk, series) runs the covariance-form filter from its
   carried start and writes every output once: predictions, filtered means, covariances and
   precisions (Gauss-Jordan inverse of the SPD covariance), and the chunk's log-likelihood. A
   step with two or more near noise-free entries (``|h|^2 tr P > 1e4 r``), or whose scalar
   updates leave a covariance trace below 1e-4 of the prediction's (entries observing the whole
   state: R = 1e-12 I on two states), takes its mean and covariance from the square-root update
   ``_factor_update`` (Givens rotations, as the sequential reference's near noise-free steps):
   the scalar updates form that posterior as a difference of prediction-sized terms. The
   carry's composed elements keep those roundings, but a step's update contracts its starting
   state's error by the same factor, and the smoother starts each chunk end from the filter's
   outputs.

Before them, ``gate`` (one program per series) tests whether a direction of the state may be
known exactly (:func:`kalmanscan.dense.singular.gate` for this class: ``F F' + Q`` or the prior
covariance flagged by the screen), where these inversions have no finite answer; its bit shares
the screen's word, read back once, and such a model goes to the torch scan (:class:`Unserved`).

The smoother (``kd.smooth``) runs the filter, its chunk elements computed for every chunk and
group, then:

4. ``carries``: the information ``(J, eta)`` that the data after each chunk carry about the
   state at its last step, walked backwards over groups and then inside every group with the
   information half of the same combine (``(I + J C)^-1`` by pivoted Gauss-Jordan), in the same
   launches as the filter's forward carries (independent walks, one program each).
5. ``chunk_smooth``: one program per (chunk, series) computes the smoothed state at its chunk's
   last step, the filtered one there (the filter's output at that step) given that information,
   ``(I + P J)^-1 [P, P (eta - J m)]`` (as the torch scan's smoother does at every step,
   :func:`kalmanscan.dense.parallel.smooth_moments`), then runs the RTS recursion backwards from
   that state (the affine elements ``x_s(t) = E_t x_s(t+1) + g_t``, ``P_s(t) = E_t P_s(t+1) E_t' +
   L_t`` applied one step at a time, E_t from a Gauss-Jordan solve with the SPD prediction) over
   the filtered moments the filter wrote, and writes every smoothed mean, covariance and
   precision once. The carry needs no per-step composition pass: the chunk elements the filter
   already composes carry the suffix information, O(chunks) work.

Every step updates one observation component at a time (exact for diagonal R; a full R is
whitened on the host, which the missing-data pattern then must not break). Float32 errors stay at
a few ulp: the carried start states come from the accurate "prior at the end" step and the
filter inside a chunk contracts its rounding errors, as does the RTS recursion from the smoothed
chunk ends (measured in tests/test_cuda_dense.py, tests/test_cuda_dense_f32_accuracy.py and
benchmarks/dense_gpu.py). Not where the smoothed covariance lies orders below the filtered one
inside a chunk (an explosive F: the next observation pins the state): the RTS step ``P + E (P_s'
- F P F' - Q) E'`` is then a difference of filtered-sized terms, ``eps |P|`` off (F = 1000 I over
a gap: 6e4 relative in float32, 1e-4 in float64, where the torch scan is within 5e-7 and
5e-16; tests/test_cuda_dense_f32_accuracy.py).

The kernels and their device helpers are in :mod:`kalmanscan.cuda.dense_kernels`; this module
holds the host side: the backend's entry (:func:`dense_triton`), the chunk sizes, the input
checks, the launches and the lost-step rule.
"""

from __future__ import annotations

import math

import torch

from kalmanscan.cuda._common import cdiv, empty, interpreting, launch, next_pow2
from kalmanscan.cuda.dense_kernels import (  # noqa: F401
    # the kernels launched here, and re-exported the names this module held before they moved
    LOG_2PI,
    LOST,
    LOST_BIT,
    NEAR_STEP,
    SHRUNK_BIT,
    WHOLE_RATIO,
    _back_walk,
    _carry_walk,
    _chol,
    _factor_update,
    _gj,
    _inv_spd,
    _load_element,
    _mm,
    _mmt,
    _mtm,
    _mtv,
    _mv,
    _program_model,
    _row,
    _screened,
    _series_dynamics,
    _solve_spd,
    _sym,
    _sym_halved,
    carries,
    carry,
    chunk_elements,
    chunk_filter,
    chunk_smooth,
    gate,
    group_elements,
)
from kalmanscan.cuda.filter import _flags_reader
from kalmanscan.dense.parallel import rank_tol

MAX_N = 8

# chunks of L = T / programs steps (a power of 2 in [min_chunk, max_chunk]) fill the GPU with
# one-warp programs; the carry over chunks is one level up to one_level chunks, else two
TUNING = {"programs": 4096, "min_chunk": 32, "max_chunk": 1024, "one_level": 16, "num_warps": 1}


def chunk_length(T: int) -> int:
    """Steps per chunk: about T / programs, a power of 2 in [min_chunk, max_chunk]."""
    if interpreting():
        return max(2, min(16, next_pow2(cdiv(T, 4))))
    L = next_pow2(cdiv(T, TUNING["programs"]))
    return max(TUNING["min_chunk"], min(TUNING["max_chunk"], L))


def group_size(NC: int) -> int:
    """Chunks per group of the two-level carry: about sqrt(NC), a power of 2 (NC itself when the
    one-level carry is short)."""
    if NC <= (4 if interpreting() else TUNING["one_level"]):
        return NC
    return next_pow2(math.isqrt(NC - 1) + 1)


def unsupported(model, layout) -> str | None:
    """Why the triton backend cannot serve this laid-out model (None when it can)."""
    n, T = layout.n, layout.T
    if n > MAX_N:
        return f"state dimension n <= {MAX_N}, got n = {n}"
    if model.P0 is None:
        return "a proper prior (prior_cov finite); the diffuse start is not supported"
    for name, t in (("F", model.F), ("offset", model.c), ("Q", model.Q), ("H", model.H),
                    ("R", model.R)):  # fmt: skip
        if T > 1 and t.stride(1) != 0 and not bool((t == t[:, :1]).all()):
            return f"time-invariant matrices, got a time-varying {name}"
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in model):
        return "inputs that do not require grad (it has no backward)"
    return None


def run(model, layout, checks=None):
    """Filter of a laid-out model (z with NaN where missing): ``(parts, flagged, gated)``, parts
    (mean, cov, precision, pred_mean, pred_cov, loglik) in the user's layout (time on its axis;
    views of one buffer), or None where nothing was launched; see :func:`_launch`. The caller
    has checked :func:`unsupported`."""
    return _launch(model, layout, False, checks)


def run_smooth(model, layout, checks=None):
    """Filter and smoother of a laid-out model: as :func:`run`, parts followed by the smoothed
    (mean, cov, precision)."""
    return _launch(model, layout, True, checks)


KNOWN_MESSAGE = (
    "backend: 'triton' (dense) serves models in which no direction of the state is known "
    "exactly; here F F' + Q or the prior covariance is singular or nearly so (condition number "
    "above 1/(64 eps n^2)), where the precision follows the rule of docs/dense.md 'Known "
    "directions': use backend='torch'"
)


class Unserved(ValueError):
    """A valid model outside the ``"triton"`` backend's class, found by its launch's one
    read-back or by :func:`check_inputs`: a direction of the state may be known exactly
    (``F F' + Q`` or the prior covariance singular, or nearly: :func:`gate`; the precision and
    the smoother then follow the rule of :mod:`kalmanscan.dense.singular`, which the torch scan
    applies, where the fused kernels invert covariances and predictions), an R that is not
    positive definite, or a full R with missing observations. ``model``: the checked model,
    which ``backend="auto"`` hands to the torch scan."""

    def __init__(self, message, model=None):
        super().__init__(message)
        self.model = model


R_SINGULAR_MESSAGE = (
    "R: backend 'triton' needs positive-definite observation-noise covariances; for a singular "
    "R use backend='torch' (where H Q H' + R is positive definite) or 'native' (CPU)"
)
R_MISSING_MESSAGE = (
    "R: backend 'triton' needs a diagonal R when observations are missing (a full R is whitened, "
    "which mixes the components); use backend='torch'"
)


def _full_r(R) -> torch.Tensor:
    """Whether some R [B, d, d] has a nonzero off-diagonal entry (0-d bool, on its device)."""
    return (R != torch.diag_embed(torch.diagonal(R, dim1=-2, dim2=-1))).any()


def check_inputs(model, layout):
    """Raise for what the kernels cannot take: infinite observations, a full R with missing
    observations, an R without a Cholesky factor (host synchronizations; :func:`_launch` screens
    for the same on the device)."""
    from kalmanscan.dense._args import Z_INF_MESSAGE

    z, R = model.z, model.R[:, 0]
    if bool(torch.isinf(z).any()):
        raise ValueError(Z_INF_MESSAGE)
    if layout.d > 1 and bool(_full_r(R)):
        if bool(torch.isnan(z).any()):
            raise Unserved(R_MISSING_MESSAGE)
        if bool(torch.linalg.cholesky_ex(R)[1].any()):
            raise Unserved(R_SINGULAR_MESSAGE)
    elif not bool((torch.diagonal(R, dim1=-2, dim2=-1) > 0).all()):
        raise Unserved(R_SINGULAR_MESSAGE)


def _series(t):
    """A time-invariant laid-out parameter [B, T, *trail] as the kernels read it, [B, *trail]
    contiguous from its first step: the tensor itself where its memory already is (no ATen op;
    the kernels take the pointer only)."""
    size = 1
    for k, st in zip(reversed(t.shape[2:]), reversed(t.stride()[2:]), strict=True):
        if k != 1 and st != size:
            return t[:, 0].contiguous()
        size *= k
    if t.shape[0] == 1 or t.stride(0) == size:
        return t
    return t[:, 0].contiguous()


def _launch(model, layout, smooth: bool, checks=None, accurate: bool = False):
    """Launch the kernels: ``(parts, flagged, gated)``. Their inputs are screened on the device
    (:func:`kalmanscan.dense._args.any_bad`) for what :func:`check_inputs` refuses (an infinite
    observation; an R without a Cholesky factor, a full one with missing observations) and, with
    ``checks`` (:class:`kalmanscan.dense._args.ValueChecks`), for what its exact checks could
    refuse or change (:meth:`~kalmanscan.dense._args.ValueChecks.screen`), and read back after
    the filter's launch, waiting for it (on a GPU through :func:`_flags_reader`, not for the
    smoother's), with :func:`chunk_filter`'s :data:`LOST` bit: the call's one host
    synchronization with d = 1; with d > 1 the word is read before the launches too, for whether
    R is full (whitened). ``flagged``: the screen was set, the caller must run the exact checks;
    ``gated``: the :func:`gate` kernel (launched first, its bit in the same word) found that a
    direction of the state may be known exactly, the caller must not use the parts; parts None:
    nothing was launched or nothing is to be used (flagged or gated, and a prediction past the
    range). With :data:`LOST` alone the parts follow the CPU backends' rule (:func:`_lost_rule`,
    warning). With :data:`SHRUNK` (a step shrinks a chunk element's covariance 1e4-fold, whose
    scalar updates lose it) the call is launched again with :func:`chunk_elements`' accurate
    pass (``accurate``), after the caller's checks where the screen was set. Scratch and
    outputs share one buffer; the outputs are views of it in the user's layout."""
    from kalmanscan.dense import _args

    B, T, d = model.z.shape
    n = layout.n
    dtype, dev = model.z.dtype, model.z.device
    z = model.z
    parts = ([], [], []) if checks is None else checks.screen()
    if parts is None:  # no prior covariance: the exact checks decide
        return None, True, False
    finite, symmetric, flags = parts
    finite.append(torch.nan_to_num(z, nan=0.0, posinf=math.nan, neginf=math.nan))  # inf: NaN
    full = False
    if d == 1:
        r = _series(model.R)
        if checks is None:
            finite.append(torch.log(r))  # finite where R > 0
    else:
        R = model.R[:, 0]
        Lr, info = torch.linalg.cholesky_ex(R)
        full_t = _full_r(R)
        flags += [info.any(), full_t & torch.isnan(z).any()]
    F, c, Q = _series(model.F), _series(model.c), _series(model.Q)
    NP = max(2, next_pow2(n))
    nw = 1 if interpreting() else TUNING["num_warps"]
    # one word read back: bit 0 the screen, bit 1 a full R (d > 1), the last bit the gate (a
    # direction may be known exactly: the torch scan applies kalmanscan/dense/singular.py's rule)
    bad = _args.any_bad(finite, symmetric, flags)
    pre = torch.stack([bad, full_t]) if d > 1 else bad.reshape(1)
    word = torch.zeros((1,), dtype=torch.int32, device=dev)
    P0 = model.P0
    bound = 1.0 / (rank_tol(dtype) * n * n)
    launch(gate, (B,), F, Q, P0, *P0.stride(), pre, word, n, bound, K=pre.numel(), NP=NP,
           num_warps=nw)  # fmt: skip
    gated_bit = 1 << pre.numel()
    if d > 1:  # whether R is full decides what the kernels take (whitened z, H): read it first
        bits = word.tolist()[0]
        full = bool(bits & 2)
        if bits & (1 | gated_bit):
            return None, bool(bits & 1), bool(bits & gated_bit)
    ll_shift = None
    if full:
        H = model.H[:, 0]
        z = torch.linalg.solve_triangular(Lr.unsqueeze(1), z.unsqueeze(-1), upper=False)[..., 0]
        H = torch.linalg.solve_triangular(Lr, H, upper=False).contiguous()
        r = torch.ones(B, d, dtype=dtype, device=dev)
        ll_shift = torch.log(torch.diagonal(Lr, dim1=-2, dim2=-1)).sum(-1)
    else:
        H = _series(model.H)
        if d > 1:
            r = torch.diagonal(R, dim1=-2, dim2=-1).contiguous()
    z = z.contiguous()
    L = chunk_length(T)
    NC = cdiv(T, L)
    G = group_size(NC)
    NG = cdiv(NC, G)
    # one buffer: scratch (chunk and group elements, carried states) and outputs, each piece
    # at a multiple of 32 elements (aligned pointers)
    el, blk = (3 * NP + 2) * NP, (NP + 1) * NP
    ll_shape = (*layout.batch_shape, NC)
    ll_strides = tuple(math.prod(ll_shape[i + 1 :]) for i in range(len(ll_shape)))
    pieces = [((B * NC * el,), (1,)), ((B * NC * blk,), (1,))]  # E, S
    if smooth:
        pieces.append(((B * NC * blk,), (1,)))  # after
    if NG > 1:
        pieces += [((B * NG * el,), (1,)), ((B * NG * blk,), (1,))]  # GE, SG
        if smooth:
            pieces.append(((B * NG * blk,), (1,)))  # BG
    outs = [(n,), (n, n), (n, n), (n,), (n, n)] + ([(n,), (n, n), (n, n)] if smooth else [])
    pieces += [_args.output_strides(layout, trail) for trail in outs]
    pieces.append((ll_shape, ll_strides))
    offsets, total = [], 0
    for shape, _ in pieces:
        offsets.append(total)
        total += -(-math.prod(shape) // 32) * 32
    flat = empty((total,), dtype=dtype, device=dev)
    views = [flat.as_strided(sh, st, o) for (sh, st), o in zip(pieces, offsets, strict=True)]
    E, S = views[:2]
    after = views[2] if smooth else None
    k = 2 + smooth
    if NG > 1:
        GE, SG = views[k : k + 2]
        BG = views[k + 2] if smooth else None
        k += 2 + smooth
    mean, cov, prec, pm, pP = views[k : k + 5]
    ll = views[-1]
    # the filter's carry uses the elements of chunks [0, NC - 1), the smoother's [1, NC)
    if NC > 1:
        launch(chunk_elements, (NC if smooth else NC - 1, B), z, F, c, Q, H, r, E, word, T, n,
               L, NC, NP=NP, D=d, ACCURATE=accurate, num_warps=nw)  # fmt: skip
    # the prior as a carried start [B, 1, NP + 1, NP] (rows P, m; zero padding) and, for the
    # smoother, the information after the end (none, zero)
    if n == NP:
        prior = torch.cat([model.P0, model.m0.unsqueeze(-2)], -2)
        if smooth:
            none = torch.zeros(B, 1, NP + 1, NP, dtype=dtype, device=dev)
    else:
        starts = torch.zeros(1 + smooth, B, 1, NP + 1, NP, dtype=dtype, device=dev)
        prior = starts[0]
        prior[:, 0, :n, :n] = model.P0
        prior[:, 0, NP, :n] = model.m0
        if smooth:
            none = starts[1]
    if NG == 1 and smooth:
        launch(carries, (2, B), E, prior, S, none, after, NC, NC, 1, NP=NP, num_warps=nw)
    elif NG == 1:
        launch(carry, (1, B), E, prior, S, NC, NC, 1, NP=NP, num_warps=nw)
    else:  # two levels: compose groups of G chunk elements, carry over groups, then within them
        launch(group_elements, (NG if smooth else NG - 1, B), E, GE, NC, G, NG, NP=NP,
               num_warps=nw)  # fmt: skip
        if smooth:
            launch(carries, (2, B), GE, prior, SG, none, BG, NG, NG, 1, NP=NP, num_warps=nw)
            launch(carries, (2 * NG, B), E, SG, S, BG, after, NC, G, NG, NP=NP, num_warps=nw)
        else:
            launch(carry, (1, B), GE, prior, SG, NG, NG, 1, NP=NP, num_warps=nw)
            launch(carry, (NG, B), E, SG, S, NC, G, NG, NP=NP, num_warps=nw)
    launch(chunk_filter, (NC, B), z, F, c, Q, H, r, S, mean, cov, prec, pm, pP, ll, word, T, n,
           L, NC, NP=NP, D=d, num_warps=nw)  # fmt: skip
    # the word (with d > 1 once more) after the filter, for its LOST bit: on CUDA waiting for
    # the launches so far only
    read = _flags_reader(word) if z.is_cuda else lambda: word.tolist()[0]
    loglik = ll.sum(-1)
    if ll_shift is not None:
        loglik = loglik - (ll_shift * T).reshape(layout.batch_shape)
    parts = (mean, cov, prec, pm, pP, loglik)
    if smooth:
        # in every chunk its last step's smoothed state and the RTS pass over its steps
        smean, scov, sprec = views[k + 5 : k + 8]
        launch(chunk_smooth, (NC, B), F, c, Q, mean, cov, after, smean, scov, sprec, T, n, L, NC,
               NP=NP, num_warps=nw)  # fmt: skip
        parts += (smean, scov, sprec)
    bits = read()
    flagged, gated = bool(bits & 1), bool(bits & gated_bit)
    if bits & SHRUNK_BIT and not accurate:  # rare
        if flagged or gated:  # the caller's checks first (they may refuse the call), then again
            return None, flagged, gated
        return _launch(model, layout, smooth, None, accurate=True)
    if bits & LOST_BIT:
        if flagged or gated:  # the caller's checks first (they may refuse the call), then again
            return None, flagged, gated
        parts = _lost_rule(layout, parts)
    return parts, flagged, gated


# each of :func:`_launch`'s parts in order: (trailing dims, which mask of
# kalmanscan.dense.api._lost_steps: filtered 0, predicted 1, smoothed 2; None: the loglik)
_LOST_PARTS = ((1, 0), (2, 0), (2, 0), (1, 1), (2, 1), (0, None), (1, 2), (2, 2), (2, 2))


def _lost_rule(layout, parts):
    """``parts`` under the CPU backends' rule for a predicted covariance past the range
    (:func:`kalmanscan.dense.api._lost_steps`, decided on the predictions the filter wrote): the
    lost series' moments NaN from that step on (smoothed: all), written into the outputs, its
    log-likelihood NaN with the ``RuntimeWarning`` naming it; the other series untouched."""
    from kalmanscan.dense import api

    nb = len(layout.batch_shape)

    def steps(t, k):  # an output in the user's layout as its [B, T, *trail] view
        return torch.movedim(t, layout.axis, nb).view(-1, layout.T, *t.shape[t.ndim - k :])

    lost = api._lost_steps(steps(parts[4], 2))
    if lost is None:  # finite entries whose trace passed the range
        return parts
    for t, (k, which) in zip(parts, _LOST_PARTS, strict=False):
        if which is not None:
            steps(t, k).masked_fill_(lost[which].view(*lost[which].shape, *(1,) * k), math.nan)
    loglik = api._lost_loglik(layout, lost, parts[5].reshape(-1)).view(parts[5].shape)
    return (*parts[:5], loglik, *parts[6:])


def dense_triton(model, layout, smooth: bool, chunk: int, checks=None):
    """The ``"triton"`` backend of ``kalmanscan.dense.filter`` and ``smooth`` (TABLES["dense"]):
    proper prior, time-invariant F, offset, Q, H, R, n <= 8, no grad; raises naming ``'torch'``
    otherwise. ``chunk`` (the torch scan's block length) is not used: see :func:`chunk_length`.

    ``checks``: the value checks that ``kalmanscan.dense._args.prepare(defer=True)`` left to run
    (:class:`kalmanscan.dense._args.ValueChecks`), screened on the device with the launch's own
    and read back once (:func:`_launch`); where the screen is set they run exactly, raising as
    ``prepare`` does, then :func:`check_inputs`. Returns the checked model (a
    :class:`kalmanscan.dense._args.Model`, not results) where they find a prior covariance with
    inf on its diagonal (diffuse: outside this backend's class); the caller dispatches it.
    Raises :class:`Unserved` (a ``ValueError``) where a direction of the state may be known
    exactly (:func:`gate`). A series whose predicted covariance passes the range follows the
    CPU backends' rule (:func:`_lost_rule`: its log-likelihood NaN with a ``RuntimeWarning``,
    its moments NaN from that step on)."""
    from kalmanscan.dense import _args
    from kalmanscan.dense.api import DenseFilterResult, DenseSmoothResult

    why = unsupported(model, layout)
    if why is not None:
        raise ValueError(f"backend: 'triton' (dense) serves {why}; use backend='torch'")
    go = run_smooth if smooth else run
    parts, flagged, gated = go(model, layout, checks)
    checked = None
    if flagged:  # the exact checks, raising naming the input
        if checks is not None:
            checked = checks.run(model)
            if checked.P0 is None:
                return checked
        try:
            check_inputs(model, layout)
        except Unserved as e:
            e.model = model if checked is None else checked
            raise
        if parts is None and not gated:  # nothing launched
            parts, flagged, gated = go(model, layout)
            if flagged:
                raise RuntimeError("triton dense: the input screen and check_inputs disagree")
    if gated:  # a direction may be known exactly: the rule is the torch scan's
        if checked is None and checks is not None:
            checked = checks.run(model)
        raise Unserved(KNOWN_MESSAGE, model if checked is None else checked)
    diffuse = torch.zeros(_args.output_strides(layout)[0], dtype=torch.bool, device=parts[0].device)
    if layout.to_numpy:
        parts = [t.detach().cpu().numpy() for t in parts]
        diffuse = diffuse.cpu().numpy()
    mean, cov, prec, pm, pP, loglik = parts[:6]
    filtered = DenseFilterResult(mean, cov, prec, pm, pP, loglik, diffuse)
    if not smooth:
        return filtered
    return DenseSmoothResult(*parts[6:], filtered)
