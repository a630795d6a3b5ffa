"""Argument checks and layout for the dense filter: user arrays -> [B, T, ...] tensors and back."""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import numpy as np
import torch

from kalmanscan.core import _args as core_args
from kalmanscan.dense.scan import _sym


def _describe(x) -> str:
    if x is None:
        return "None"
    if hasattr(x, "shape"):
        return f"{type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"


class Model(NamedTuple):
    """A dense model laid out as [B, T, ...] (B flattened series; parameters may be views)."""

    z: torch.Tensor  # [B, T, d], 0 where missing (NaN until mask_missing)
    observed: torch.Tensor | None  # [B, T, d] bool (None until mask_missing)
    F: torch.Tensor  # [B, T, n, n]
    c: torch.Tensor  # [B, T, n]
    Q: torch.Tensor  # [B, T, n, n]
    H: torch.Tensor  # [B, T, d, n]
    R: torch.Tensor  # [B, T, d, d]
    m0: torch.Tensor  # [B, n]
    P0: torch.Tensor | None  # [B, n, n] proper prior covariance (covariance mode)
    L0: torch.Tensor | None  # [B, n, n] prior precision, 0 in diffuse directions (precision mode)
    # [B, n, n] prior_cov as given where some series has inf on its diagonal (L0 is then its
    # finite block's precision): the diffuse directions are its inf coordinates, exactly, and its
    # finite block is the finite part (kalmanscan.dense.parallel.prior_start); None otherwise
    P0inf: torch.Tensor | None = None


class Layout(NamedTuple):
    to_numpy: bool
    axis: int
    batch_shape: tuple
    T: int
    n: int
    d: int


_SHAPES = {  # what each argument's trailing axes are, for the messages
    "z": "at least 2 dimensions (time and the observation vector, [T, d]; one series of scalars "
    "as z[:, None])",
    "F": "shape [..., n, n] (transition)",
    "Q": "shape [..., n, n] (process-noise covariance)",
    "H": "shape [..., d, n] = [..., {d}, n] (observation matrix)",
    "R": "shape [..., d, d] = [..., {d}, {d}] (observation-noise covariance)",
    "offset": "shape [..., n] (state offset)",
    "prior_mean": "shape [..., n]",
    "prior_cov": "shape [..., n, n]",
    "prior_precision": "shape [..., n, n]",
}


def _as_tensor(name, x, dtype, device, min_ndim, d=None):
    """``x`` as a ``dtype`` tensor on ``device`` through the one argument layer
    (:func:`kalmanscan.core._args.as_real_numpy`): strings, booleans, complex numbers and datetimes
    are refused with ``ks.filter``'s messages, masked elements of ``z`` become NaN (missing
    data) and a masked element of a model parameter is refused, naming its index (a NaN there
    would be reported as NaN or inf, not as the mask it is). A float64 value that
    ``z``'s float32 would turn into another meaning (``core_args.rounded_away``) is refused as
    ``ks.filter`` refuses it: from numpy here, from a tensor by the checks, which find NaN there
    (:class:`ValueChecks`: no readback before a check fails)."""
    if isinstance(x, torch.Tensor):
        if x.dtype not in core_args._FLOAT_TORCH:
            raise TypeError(
                f"{name}: expected a floating-point tensor (float32 or float64), got {x.dtype}"
            )
        t = core_args.narrowed(name, x.resolve_neg().resolve_conj(), dtype, device)
    else:
        a = core_args.as_real_numpy(name, x, missing_ok=name == "z")
        if dtype != torch.float64 and name != "z":
            core_args.refuse_rounding(name, a, dtype, "z")
        if a.flags.writeable:
            t = torch.as_tensor(a, dtype=dtype, device=device)
        else:  # read-only arrays (pandas, np.broadcast_to): never written, torch's warning muted
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                t = torch.as_tensor(a, dtype=dtype, device=device)
    if t.ndim < min_ndim:
        want = _SHAPES[name].format(d="d" if d is None else d)
        raise ValueError(f"{name}: expected {want}, got shape {tuple(t.shape)}")
    return t


def _working(values: dict):
    """(to_numpy, dtype, device) of the call (docs/dense.md): with any tensor argument the outputs
    are tensors on the device of a tensor ``z`` (else of the first tensor), their dtype a tensor
    ``z``'s, else float64 unless ``z`` and every tensor argument are float32 (float64 data are not
    rounded to a float32 parameter, nor a float64 parameter to float32 data)."""
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
    for name, v in values.items():
        if isinstance(v, torch.Tensor) and v.is_meta:
            raise ValueError(core_args._meta_message(name))
    if tensors:
        z = values["z"]
        if isinstance(z, torch.Tensor):
            dtype = z.dtype if z.dtype in (torch.float32, torch.float64) else torch.float64
            return False, dtype, z.device
        single = core_args.as_real_numpy("z", z).dtype == np.float32 and all(
            t.dtype == torch.float32 for t in tensors
        )
        return False, torch.float32 if single else torch.float64, tensors[0].device
    z = core_args.as_real_numpy("z", values["z"])
    dtype = torch.float32 if z.dtype == np.float32 else torch.float64
    return True, dtype, torch.device("cpu")


def _check_square(name, t, k, what):
    if t.shape[-1] != k or t.shape[-2] != k:
        raise ValueError(
            f"{name}: expected trailing shape ({k}, {k}) ({what}), got {tuple(t.shape)}"
        )


def _to_layout(name, t, lead, axis, k):
    """Broadcast t [..., *trail] against lead (z.shape[:-1]), move time to -1-k, flatten batch."""
    trail = t.shape[t.ndim - k :] if k else ()
    head = t.shape[: t.ndim - k]
    try:
        full = core_args.broadcast_shapes(head, lead)
    except ValueError:
        full = None
    if full != torch.Size(lead):
        hint = ""
        if len(lead) > 1 and len(head) == 1 and head[0] == lead[axis]:
            # one value per step shared by the series: leading axes align from the right (numpy)
            per_step = tuple(lead[axis] if i == axis else 1 for i in range(len(lead)))
            hint = f"; one per step for every series is shape {per_step + tuple(trail)}"
        raise ValueError(
            f"{name}: leading shape {tuple(head)} does not broadcast against z's shape without "
            f"its last axis {tuple(lead)} (time on axis {axis}){hint}"
        )
    T = lead[axis]
    if not head and T:  # the same for every series and step: one strided view, no copy
        B = math.prod(lead) // T
        return t.as_strided((B, T, *trail), (0, 0, *t.stride()))
    if tuple(head) != tuple(lead):  # the layout's identity steps cost an ATen op each: skipped
        t = t.expand(*lead, *trail)
    if axis != len(lead) - 1:
        t = torch.movedim(t, axis, len(lead) - 1)
    return t if t.ndim == k + 2 else t.reshape(-1, T, *trail)


def _to_batch(name, t, batch_shape, k):
    head = t.shape[: t.ndim - k]
    trail = t.shape[t.ndim - k :]
    try:
        full = core_args.broadcast_shapes(head, batch_shape)
    except ValueError:
        full = None
    if full != torch.Size(batch_shape):
        raise ValueError(
            f"{name}: leading shape {tuple(head)} does not broadcast against the series shape "
            f"{tuple(batch_shape)} (z's shape without time and the last axis)"
        )
    if not head:
        return t.as_strided((math.prod(batch_shape), *trail), (0, *t.stride()))
    if tuple(head) != tuple(batch_shape):
        t = t.expand(*batch_shape, *trail)
    return t if t.ndim == k + 1 else t.reshape(-1, *trail)


def prepare(
    z, F, Q, H, R, offset, prior_mean, prior_cov, prior_precision, axis, mask=True, defer=False
):
    """Validate the public arguments and lay them out; see :func:`kalmanscan.dense.filter`.

    ``defer``: run the shape checks and the layout only and return ``(model, layout, checks)``,
    the model's ``P0`` the prior covariance as given (inf entries not yet turned into a
    precision) and ``checks`` the value checks (:class:`ValueChecks`) for the caller to run
    later, so that they cost no host synchronization on a device (the triton backend)."""
    from kalmanscan.core._args import check_dataarray_time_axis

    check_dataarray_time_axis(z, axis)
    values = dict(
        z=z,
        F=F,
        Q=Q,
        H=H,
        R=R,
        offset=offset,
        prior_mean=prior_mean,
        prior_cov=prior_cov,
        prior_precision=prior_precision,
    )
    to_numpy, dtype, device = _working(values)
    zt = _as_tensor("z", z, dtype, device, 2)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis: expected an int, got {_describe(axis)}")
    ax = int(axis) + (zt.ndim if axis < 0 else 0)
    if not 0 <= ax < zt.ndim - 1:
        raise ValueError(
            f"axis: expected a time axis of z other than the last (the observation vector), in "
            f"[{-zt.ndim}, {zt.ndim - 2}], got {axis} for z of shape {tuple(zt.shape)}"
        )
    if zt.shape[ax] == 0:
        raise ValueError(
            f"z: expected at least one time step along axis {axis}, got shape {tuple(zt.shape)}"
        )
    d = zt.shape[-1]
    if d == 0:
        raise ValueError(
            "z: expected at least one observation entry on the last axis (d >= 1), got shape "
            f"{tuple(zt.shape)}"
        )
    Ft = _as_tensor("F", F, dtype, device, 2)
    n = Ft.shape[-1]
    if not 1 <= n:
        raise ValueError(f"F: expected a state dimension n >= 1, got shape {tuple(Ft.shape)}")
    _check_square("F", Ft, n, "transition, n x n")
    Qt = _as_tensor("Q", Q, dtype, device, 2)
    _check_square(
        "Q", Qt, n, f"process-noise covariance, n x n; n from F's shape {tuple(Ft.shape[-2:])}"
    )
    Ht = _as_tensor("H", H, dtype, device, 2, d)
    if tuple(Ht.shape[-2:]) != (d, n):
        raise ValueError(
            f"H: expected trailing shape (d, n) = ({d}, {n}) (observation matrix; d from z's "
            f"last axis, n from F), got {tuple(Ht.shape)}"
        )
    Rt = _as_tensor("R", R, dtype, device, 2, d)
    _check_square("R", Rt, d, "observation-noise covariance, d x d")
    ct = (
        torch.zeros(n, dtype=dtype, device=device)
        if offset is None
        else _as_tensor("offset", offset, dtype, device, 1)
    )
    if ct.shape[-1] != n:
        raise ValueError(f"offset: expected trailing length n = {n}, got shape {tuple(ct.shape)}")
    # the inputs as given, where a float64 tensor may have been narrowed (ValueChecks' messages)
    given = values if dtype != torch.float64 else None
    checks = ValueChecks(Ft, Qt, Ht, Rt, ct, given=given)
    if not defer:
        checks.dynamics()

    lead = tuple(zt.shape[:-1])
    T = lead[ax]
    batch_shape = lead[:ax] + lead[ax + 1 :]
    zl = _to_layout("z", zt, lead, ax, 1)
    model_parts = dict(
        F=_to_layout("F", Ft, lead, ax, 2),
        c=_to_layout("offset", ct, lead, ax, 1),
        Q=_to_layout("Q", Qt, lead, ax, 2),
        H=_to_layout("H", Ht, lead, ax, 2),
        R=_to_layout("R", Rt, lead, ax, 2),
    )

    m0 = (
        torch.zeros(n, dtype=dtype, device=device)
        if prior_mean is None
        else _as_tensor("prior_mean", prior_mean, dtype, device, 1)
    )
    if m0.shape[-1] != n:
        raise ValueError(
            f"prior_mean: expected trailing length n = {n}, got shape {tuple(m0.shape)}"
        )
    checks = checks._replace(m0=m0)
    if not defer:
        checks.prior_mean()
    m0 = _to_batch("prior_mean", m0, batch_shape, 1)
    if prior_cov is not None and prior_precision is not None:
        raise ValueError("prior_cov, prior_precision: expected at most one of them, got both")
    P0 = L0 = None
    if prior_cov is not None:
        P0 = _as_tensor("prior_cov", prior_cov, dtype, device, 2)
        _check_square("prior_cov", P0, n, "prior covariance, n x n")
        checks = checks._replace(P0=P0)
        P0 = _to_batch("prior_cov", P0, batch_shape, 2)
    elif prior_precision is not None:
        L0 = _as_tensor("prior_precision", prior_precision, dtype, device, 2)
        _check_square("prior_precision", L0, n, "prior precision, n x n")
        checks = checks._replace(L0=L0)
        L0 = _to_batch("prior_precision", L0, batch_shape, 2)
    else:
        L0 = torch.zeros(zl.shape[0], n, n, dtype=dtype, device=device)
    model = Model(zl, None, **model_parts, m0=m0, P0=P0, L0=L0)
    layout = Layout(to_numpy, ax, batch_shape, T, n, d)
    if defer:
        return model, layout, checks
    model = checks.prior(model)
    if mask:  # the native path reads the NaNs itself (api.py passes mask=False)
        model = mask_missing(model)
    return model, layout


def _rounding_first(check):
    """``check`` reporting a float64 tensor value that the working dtype turned into another
    meaning (NaN after :func:`_as_tensor`) as ``ks.filter`` does, where ``check`` fails."""

    @functools.wraps(check)
    def run(self, *args):
        try:
            return check(self, *args)
        except ValueError:
            if self.given is not None:
                core_args.check_rounding(self.given, self.F.dtype, "z")
            raise

    return run


class ValueChecks(NamedTuple):
    """The checks of :func:`prepare` on the values of its arguments (as given, before the
    layout): :meth:`run` raises as ``prepare`` does; :meth:`suspect` is their sync-free
    device-side screen."""

    F: torch.Tensor
    Q: torch.Tensor
    H: torch.Tensor
    R: torch.Tensor
    offset: torch.Tensor
    m0: torch.Tensor | None = None
    P0: torch.Tensor | None = None  # prior_cov as given
    L0: torch.Tensor | None = None  # prior_precision as given
    given: dict | None = None  # the arguments as given where the working dtype is float32

    @_rounding_first
    def dynamics(self):
        """Raise for non-finite, asymmetric or indefinite dynamics (F, Q, H, R, offset)."""
        for name, t in (("F", self.F), ("Q", self.Q), ("H", self.H), ("R", self.R),
                        ("offset", self.offset)):  # fmt: skip
            if not bool(torch.isfinite(t).all()):
                raise ValueError(
                    f"{name}: expected finite values, got NaN or inf (mark missing data with NaN "
                    "in z)"
                )
        for name, t in (("Q", self.Q), ("R", self.R)):
            _check_symmetric(name, t, "covariance matrix")
        if torch.linalg.cholesky_ex(self.R.detach())[1].any() and _negative_eig(self.R):
            raise ValueError(
                "R: expected positive-semidefinite observation-noise covariances, got "
                + _lowest_eig("R", self.R)
            )
        if _negative_eig(self.Q):
            raise ValueError(
                "Q: expected positive-semidefinite process-noise covariances, got "
                + _lowest_eig("Q", self.Q)
            )

    @_rounding_first
    def prior_mean(self):
        if not bool(torch.isfinite(self.m0).all()):
            raise ValueError(
                "prior_mean: expected finite values (a diffuse direction takes any finite mean, "
                "e.g. 0)"
            )

    @_rounding_first
    def prior(self, model: Model) -> Model:
        """Raise for a bad prior covariance or precision; the model with a prior covariance that
        has inf on its diagonal (in some series) turned into the precision of its finite block,
        the covariance as given kept beside it (``P0inf``: the diffuse directions are its inf
        coordinates, exactly; a series without inf keeps its covariance as its finite part)."""
        P0, L0, P0inf = model.P0, model.L0, None
        if self.P0 is not None:
            diag = torch.diagonal(self.P0, dim1=-2, dim2=-1).detach()
            if bool(torch.isneginf(diag).any()) or bool(torch.isnan(diag).any()):
                where = _first_index(torch.isneginf(diag) | torch.isnan(diag))
                bad = float(diag[where])
                raise ValueError(
                    "prior_cov: expected finite variances, or +inf on the diagonal for diffuse "
                    f"states, got {bad} at prior_cov[{', '.join(map(str, (*where, where[-1])))}]"
                )
            diag_inf = torch.isposinf(diag)
            if bool(diag_inf.any()):  # the finite block is checked, the diffuse rows dropped
                off = diag_inf.unsqueeze(-1) | diag_inf.unsqueeze(-2)
                given = torch.where(off, torch.zeros((), dtype=P0.dtype, device=P0.device), self.P0)
            else:
                given = self.P0
            if not bool(torch.isfinite(given).all()):
                where = _first_index(~torch.isfinite(given.detach()))
                raise ValueError(
                    "prior_cov: expected finite entries, or +inf on the diagonal for diffuse "
                    f"states, got {float(given[where])} at prior_cov[{', '.join(map(str, where))}]"
                )
            _check_psd("prior_cov", given, "covariance matrix (inf on the diagonal: diffuse)")
            if bool(diag_inf.any()):
                diffuse = torch.isposinf(torch.diagonal(P0, dim1=-2, dim2=-1))
                L0 = _precision_from_partly_infinite(P0, diffuse)
                P0inf, P0 = P0, None
        elif self.L0 is not None:
            if not bool(torch.isfinite(self.L0).all()):
                raise ValueError(
                    "prior_precision: expected finite entries (0 precision marks a diffuse "
                    "direction)"
                )
            _check_psd("prior_precision", self.L0, "matrix (0 in diffuse directions)")
        return model._replace(P0=P0, L0=L0, P0inf=P0inf)

    def run(self, model: Model) -> Model:
        """Every check, raising as :func:`prepare` does (its order); the model with its prior
        resolved (:meth:`prior`)."""
        self.dynamics()
        self.prior_mean()
        return self.prior(model)

    @torch.no_grad()
    def screen(self):
        """:meth:`suspect`'s parts for :func:`any_bad`: ``(finite, symmetric, flags)``, None
        where no prior covariance is given (:meth:`run` changes the model)."""
        if self.P0 is None or self.m0 is None:
            return None
        finite = [self.F, self.H, self.offset, self.m0]
        symmetric = []
        for t in (self.Q, self.R, self.P0):
            (symmetric if t.shape[-1] > 1 else finite).append(t)
        Q = self.Q
        tol = 8 * (Q.shape[-1] + 1) ** 2 * torch.finfo(Q.dtype).eps
        eye = torch.eye(Q.shape[-1], dtype=Q.dtype, device=Q.device)
        shifted = torch.addcmul(Q, Q.abs().amax((-1, -2), keepdim=True), eye, value=-tol)
        flags = [torch.linalg.cholesky_ex(shifted)[1].any()]
        R = self.R
        if R.shape[-1] == 1:
            finite.append(torch.log(R))  # finite where R > 0
        else:
            flags.append(torch.linalg.cholesky_ex(R)[1].any())
        # a Cholesky factor of the prior covariance bounds its eigenvalues below by rounding
        # (~ n eps max|P0|), within run's check; without one (semidefinite too) run decides
        flags.append(torch.linalg.cholesky_ex(self.P0)[1].any())
        return finite, symmetric, flags

    def suspect(self) -> torch.Tensor:
        """A 0-d bool tensor on the inputs' device, False only where :meth:`run` passes and
        changes nothing (a finite prior covariance given): no host synchronization. True for
        any non-finite value, any asymmetry (``run`` allows rounding: :func:`_check_symmetric`),
        a process noise Q without a Cholesky factor after subtracting ``8 (n + 1)^2 eps max|Q|``
        from its diagonal (the rounding of a Cholesky factorization and of ``run``'s eigenvalues
        stays below that, so ``run``'s eigenvalue test passes), an R or a prior covariance
        without a Cholesky factor (``run``'s own screen; ``run`` refuses a prior with a negative
        eigenvalue), or no prior covariance."""
        parts = self.screen()
        if parts is None:
            return torch.ones((), dtype=torch.bool, device=self.F.device)
        return any_bad(*parts)


def any_bad(finite=(), symmetric=(), flags=()) -> torch.Tensor:
    """A 0-d bool tensor: some tensor of ``finite`` has a non-finite entry, some [..., k, k] of
    ``symmetric`` one or an entry that differs from its transpose's, or some 0-d tensor of
    ``flags`` is nonzero. A fixed handful of ATen ops (foreach reductions, no host
    synchronization): ``0 * x`` is 0 exactly where x is finite, ``x - x'`` where x is finite and
    symmetric, and the 1-norm of such a tensor is 0 or NaN (or positive)."""
    with torch.no_grad():
        vals = list(torch._foreach_mul(list(finite), 0.0)) if finite else []
        if symmetric:
            vals += torch._foreach_sub(list(symmetric), [t.mT for t in symmetric])
        norms = torch._foreach_norm(vals, 1) if vals else []
        return torch.stack([*norms, *flags]).any()


Z_INF_MESSAGE = "z: expected finite observations or NaN for missing ones, got inf"


def mask_missing(model: Model) -> Model:
    """Set ``observed`` and zero the missing entries of ``z`` (prepare leaves z with its NaNs, which
    the native path reads directly); raises for infinite observations."""
    if model.observed is not None:
        return model
    z = model.z
    observed = ~torch.isnan(z)
    if bool(torch.isinf(z).any()):
        raise ValueError(Z_INF_MESSAGE)
    z = torch.where(observed, z, torch.zeros((), dtype=z.dtype, device=z.device))
    return model._replace(z=z, observed=observed)


def _first_index(mask: torch.Tensor) -> tuple:
    """The index (a tuple of ints) of the first True entry of ``mask``."""
    return tuple(int(i) for i in torch.nonzero(mask)[0])


SYM_RTOL = 1e-5
"""Entrywise relative asymmetry accepted by the symmetry checks (``torch.allclose``'s)."""


def sym_atol(t: torch.Tensor) -> torch.Tensor:
    """[..., 1, 1] absolute asymmetry accepted in each matrix of ``t`` [..., k, k]: rounding
    relative to the matrix's scale, ``64 k eps`` of its largest entry (an entry that is 0
    mathematically but comes out of a product such as Van Loan's as rounding residue, 1e-17 next
    to entries of 0.1, is not an asymmetry)."""
    k = t.shape[-1]
    return (64 * k * torch.finfo(t.dtype).eps) * t.abs().amax((-1, -2), keepdim=True)


def _check_symmetric(name: str, t: torch.Tensor, what: str):
    """Raise unless every matrix of ``t`` [..., k, k] is symmetric: ``|t - t'|`` at most
    ``SYM_RTOL |t'| + sym_atol(t)`` entrywise (rounding of the matrix's scale and 1e-5 of the
    entry); the message gives the largest asymmetry relative to that tolerance, and where."""
    if t.shape[-1] < 2:
        return
    t = t.detach()
    diff = (t - t.mT).abs()
    allowed = SYM_RTOL * t.mT.abs() + sym_atol(t)
    if bool((diff <= allowed).all()):
        return
    ratio = torch.where(diff > allowed, diff / torch.where(allowed > 0, allowed, 1.0), 0.0)
    ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, float("inf")), ratio)
    where = _first_index(ratio == ratio.max())
    i, j = where[-2:]
    top = float(t[where[:-2]].abs().max())
    at = ", ".join(map(str, where))
    tr = ", ".join(map(str, (*where[:-2], j, i)))
    raise ValueError(
        f"{name}: expected a symmetric {what}, got an asymmetric one: {name}[{at}] = "
        f"{float(t[where]):.17g} but {name}[{tr}] = {float(t[where[:-2] + (j, i)]):.17g} "
        f"(difference {float(diff[where]):.3g}, {float(diff[where]) / top if top else 0.0:.3g} "
        f"of the matrix's largest entry {top:.3g}; rounding up to "
        f"{64 * t.shape[-1] * torch.finfo(t.dtype).eps:.2g} of it is accepted)"
    )


def _lowest_eig(name: str, t: torch.Tensor) -> str:
    """'a negative eigenvalue (w, relative ... at name[idx])' of the matrix of ``t`` with the
    lowest eigenvalue relative to its largest entry."""
    t = t.detach()
    w = torch.linalg.eigvalsh(_sym(t))[..., 0]
    top = t.abs().amax((-1, -2))
    rel = w / torch.where(top > 0, top, torch.ones_like(top))
    where = _first_index(rel == rel.min()) if rel.ndim else ()
    at = f" in {name}[{', '.join(map(str, where))}] (its leading index as given)" if where else ""
    return (
        f"a negative eigenvalue ({float(w[where]):.3g}, {float(rel[where]):.3g} of the "
        f"matrix's largest entry){at}"
    )


def _check_psd(name: str, t: torch.Tensor, what: str):
    """Raise unless ``t`` [..., k, k] is symmetric (:func:`_check_symmetric`) and positive
    semidefinite (no eigenvalue below -1e-8 of its largest entry, -100 eps in float32: the
    rounding of a singular float32 precision such as G G' reaches -1e-7)."""
    _check_symmetric(name, t, "matrix")
    if _negative_eig(t, max(1e-8, 100 * torch.finfo(t.dtype).eps)):
        raise ValueError(
            f"{name}: expected a positive-semidefinite {what}, got " + _lowest_eig(name, t)
        )


def _negative_eig(t: torch.Tensor, rel: float = 1e-8) -> bool:
    t = t.detach()
    return bool((torch.linalg.eigvalsh(t) < -rel * t.abs().amax((-1, -2)).unsqueeze(-1)).any())


def r_positive_definite(R: torch.Tensor) -> bool:
    """Whether every R_t admits a Cholesky factor (the torch and sequential paths need it)."""
    return not bool(torch.linalg.cholesky_ex(R.detach())[1].any())


def _precision_from_partly_infinite(P0, diffuse):
    """[B, n, n] the precision of the finite block of a prior covariance ``P0`` with +inf on its
    diagonal at ``diffuse`` [B, n] (0 across the diffuse rows and columns): its inverse, or
    where the block is singular (a direction of the finite part known exactly beside the diffuse
    states: a stationary ARMA block whose start values cancel) its Moore-Penrose inverse, the
    known directions' infinite precision left out. Every backend starts from the covariance as
    given (:func:`kalmanscan.dense.parallel.prior_start`), which needs no inverse; this matrix
    serves the scan's information form for a direction never resolved, which adds the known
    directions from the covariance (:func:`kalmanscan.dense.parallel.known_prior`)."""
    off = diffuse.unsqueeze(-1) | diffuse.unsqueeze(-2)
    zero = torch.zeros((), dtype=P0.dtype, device=P0.device)
    eye = torch.diag_embed(diffuse.to(P0.dtype))
    finite_block = torch.where(off, zero, P0) + eye
    inv, info = torch.linalg.inv_ex(finite_block)
    bad = (info != 0) | ~torch.isfinite(inv).flatten(-2).all(-1)
    if bool(bad.any()):  # singular finite blocks (PSD: the checks ran): their pseudo-inverse
        pinv = torch.linalg.pinv(_sym(finite_block), hermitian=True)
        inv = torch.where(bad[..., None, None], pinv, inv)
    return torch.where(off, zero, inv)


def output(layout: Layout, t: torch.Tensor, k: int):
    """[B, T, *trail(k dims)] -> user layout (time back on its axis); numpy if the inputs were."""
    trail = t.shape[2:]
    t = t.reshape(*layout.batch_shape, layout.T, *trail)
    t = torch.movedim(t, len(layout.batch_shape), layout.axis)
    return t.detach().cpu().numpy() if layout.to_numpy else t


def output_strides(layout: Layout, trail=()):
    """``(shape, strides)`` that show a contiguous [B, T, *trail] block in the user's layout, as
    :func:`output` makes it (time back on its axis), for one ``as_strided`` view."""
    shape = [*layout.batch_shape, layout.T, *trail]
    strides, size = [], 1
    for k in reversed(shape):
        strides.insert(0, size)
        size *= k
    nb = len(layout.batch_shape)
    shape.insert(layout.axis, shape.pop(nb))
    strides.insert(layout.axis, strides.pop(nb))
    return tuple(shape), tuple(strides)


def output_batch(layout: Layout, t: torch.Tensor):
    t = t.reshape(layout.batch_shape)
    return t.detach().cpu().numpy() if layout.to_numpy else t


LOG_2PI = math.log(2 * math.pi)
