"""The sequential reference: the filter and smoother one step at a time.

It knows nothing about Möbius matrices, chunks or kernels, so every fast path is tested against it.
Beliefs are homogeneous triples ``(u, e, v)`` (precision ``u/v``, mean ``e/u``), so a state known
exactly and a diffuse one are ordinary values. Backend contract: docs/backend-contract.md::

    filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all") -> dict
    smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0) -> dict

``[T, N]`` inputs (``z`` NaN where not observed; ``obs_var`` ignored there), ``x0 = (u0, e0, v0)``
three ``[N]`` tensors.

A call takes its steps without the tests of held triples (steps.normalize) and of the update's
scaled products (steps.observe), each a host read a step, and asks once, from every step's
triples, whether a step would have taken one of those branches (``checked=False``:
steps.near_hold, steps.observe_unusual); only then is the pass run again with the tests
(``checked=True``). Elsewhere the two give the same values and gradients, bit for bit.
"""

from __future__ import annotations

import math

import torch

from kalmanscan.core.steps import (
    _max_exponent,
    combine_two_filter,
    compact,
    held_mask,
    hold_exponent,
    loglik_terms,
    lost_steps,
    moments,
    near_hold,
    normalize,
    normalize_max,
    observe,
    observe_unusual,
    predict,
    predict_coeffs,
    quotient,
    read_tests,
    start,
    update,
)

OUTPUTS = ("all", "loglik")
NOT_FINITE = 1  # a value that must be finite is not: data no float can hold
Z_INF = 2  # z holds +-inf
LL_LOST = 8  # a lane's log-likelihood is NaN: a predicted precision below the range (lost_steps)


def observation_information(z, obs_var, loading):
    """``phi = h^2 / obs_var`` and ``r = h z / obs_var``; both 0 where not observed."""
    missing = torch.isnan(z)
    rho = compact(obs_var).reciprocal()
    rho_h = rho * compact(loading)
    phi = (rho_h * compact(loading)).expand_as(z).masked_fill(missing, 0.0)
    return phi, rho_h * z.masked_fill(missing, 0.0)


def observation_terms(z, obs_var, loading):
    """``(R, h, hz)`` of the update in its ``R``-scaled form ``(R u + h^2 v, R e + h z v, R v)``
    (the update ``(u + phi v, e + r v, v)`` times ``R``: the same belief, without ``1/R``, so
    gradients with respect to ``obs_var`` stay exact however small it is); ``(1, 0, 0)``, the
    identity, where not observed."""
    missing = torch.isnan(z)
    R = torch.where(missing, 1.0, compact(obs_var))
    h = torch.where(missing, 0.0, compact(loading))
    return R, h, h * z.masked_fill(missing, 0.0)


def _steps(x, T):
    """``x``'s ``T`` per-step rows (one row, broadcast, repeated). ``unbind`` rather than
    ``x[t]`` in the loop: its backward stacks the rows' gradients once, where each ``x[t]``'s
    would add a full ``[T, N]`` zero-filled gradient, ``O(T^2 N)`` over the loop."""
    if x.shape[0] > 1:
        return x.unbind(0)
    return (x[0],) * T if T else ()


def _check_outputs(outputs):
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs: expected one of {OUTPUTS}, got {outputs!r}")


def _forward(z, obs_var, decay, process_var, loading, offset, x0, checked=True):
    """Filtered and predicted triples, each a tuple of three ``[T, N]`` tensors, the
    normalized filtered ``u`` entering each step (``[T, N]``), and with ``checked=False``
    (steps with no host read) a 0-d bool tensor: whether a step would have held a triple or
    scaled its update's products (run it again checked), else None."""
    T = z.shape[0]
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p, a)
    u, e, v = start(*x0, checked=checked)
    u0 = u
    pred, filt = [], []
    steps = zip(*(_steps(x, T) for x in (a, p, c, q, d, R, h, hz)), strict=True)
    for at, pt, ct, qt, dt, Rt, ht, hzt in steps:
        up, ep, vp = predict(u, e, v, at, pt, ct, qt, dt, checked=checked)
        u, e, v = update(up, ep, vp, Rt, ht, hzt, checked=checked)
        pred.append((up, ep, vp))
        filt.append((u, e, v))
    stack = lambda xs: tuple(torch.stack(k) for k in zip(*xs, strict=True))  # noqa: E731
    u_in = torch.stack([u0.expand_as(pred[0][0])] + [f[0] for f in filt[:-1]]) if T else z
    filt, pred = stack(filt), stack(pred)
    unusual = None
    if not checked:  # (start's test on its input, the predictions', the updates' from them)
        unusual = held_mask(x0[0], x0[2]).any()
        if T:
            unusual = unusual | near_hold(pred[0], pred[2]) | observe_unusual(*pred, R, h, hz)
    return filt, pred, u_in.detach(), unusual


def results(z, obs_var, loading, filt, pred, u_in, outputs="all", any_held=None):
    """The contract's output dict from filtered and predicted triples (both torch paths);
    ``u_in``: the normalized filtered ``u`` entering each step (the start's, then ``filt``'s);
    ``any_held``: whether a triple is held (steps.normalize), where the caller knows (False:
    no host read), else None."""
    # (contiguous: the sum's order, and so its last bit, does not depend on z's memory layout)
    ll = loglik_terms(z, compact(obs_var), compact(loading), *pred, any_held=any_held)
    ll = ll.contiguous()
    lost = lost_steps(pred[0], u_in).any(0)
    # NaN by design where a step is lost: a product, not a select, so the lane's gradients are
    # NaN too (not an overflow: left out of NOT_FINITE)
    loglik = ll.sum(0, dtype=torch.float64).to(z.dtype) * torch.where(lost, float("nan"), 1.0)
    final = tuple(x[-1] for x in filt)
    if bool((final[2] > 1).any()) if any_held is None else any_held:
        final = normalize_max(*final)  # (a held triple, steps.normalize: the contract's max = 1)
    ok = torch.isfinite(torch.stack(final)).all() & (torch.isfinite(loglik) | lost).all()
    flags = (torch.where(torch.isinf(z).any(), Z_INF, 0) + torch.where(ok, 0, NOT_FINITE)
             + torch.where(lost.any(), LL_LOST, 0))  # fmt: skip
    out = {"loglik": loglik, "final": final, "flags": flags}
    if outputs == "loglik":
        return out
    mean, var, precision, info = moments(*filt)
    pmean, pvar, pprecision, _ = moments(*pred)
    out.update(
        mean=mean,
        var=var,
        precision=precision,
        info=info,
        pred_mean=pmean,
        pred_var=pvar,
        pred_precision=pprecision,
    )
    return out


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    _check_outputs(outputs)
    ins = (z, obs_var, decay, process_var, loading, offset, x0)
    filt, pred, u_in, unusual = _forward(*ins, checked=False)
    out = results(z, obs_var, loading, filt, pred, u_in, outputs, any_held=False)
    if read_tests(unusual)[0]:  # (the call's one host read)
        filt, pred, u_in, _ = _forward(*ins)
        out = results(z, obs_var, loading, filt, pred, u_in, outputs)
    return out


def backward_leaves(z, obs_var, decay, process_var, loading, offset):
    """Per-step inputs of the backward information filter for steps 1..T-1: ``(R, h, hz, a, p,
    c, q, d)`` (:func:`observation_terms`), each ``[T-1, N]`` or broadcastable."""
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p, a)
    nxt = lambda x: x[1:] if x.shape[0] > 1 else x  # noqa: E731
    return tuple(nxt(x) for x in (R, h, hz, a, p, c, q, d))


def backward_step(U, E, V, R, h, hz, a, p, c, q, d, after=None, checked=True):
    """Information about ``x_t`` from the observations after t, given that about ``x_{t+1}``
    (``after``: ``obs_var / loading^2`` of step t's observation, which the result meets next,
    inf where none; or None).

    Add step t+1's observation (``R``-scaled, :func:`~kalmanscan.core.steps.observe`), normalize,
    then step back through its dynamics (``forget``: nothing is left; the derivative in ``a``
    there is the limit's), and normalize.
    The step back ``(a^2 U, a (E - c U), V + p U)`` is formed divided by ``|a|``,
    ``(|a| U, sign(a) (E - c U), (V + p U) / |a|)`` (:func:`back_through`): ``a^2`` never
    appears, so a decay whose square is below the normal range keeps the precision it gives
    where that is a number of the dtype (``a = 1e-170``, ``obs_var = 1e-100``: ``3.4e-240``, not
    0), and a huge one (``1e200``) gives the earlier state known exactly, not NaN.
    ``checked=False``: without the tests of held triples and scaled products (no host read;
    :func:`_backward_unusual`).
    """
    norm = normalize if checked else normalize_max
    U, E, V = norm(*observe(U, E, V, R, h, hz, checked))
    keep = 1 - q
    held = (V > 1) & (U > 0) if checked else None  # (steps.normalize: U the constant 2**-G)
    u, e, v = back_through(U, E - c * U, (p * keep + q) * U + V, a, q, held)
    if torch.is_grad_enabled() and a.requires_grad:
        # forget (a = 0): d/da of the limit's information a (E - c U) over its normalizer
        # V + p U, against the forgetting step's U + V (its value unchanged)
        den = torch.where(V + p * U > 0, V + p * U, 1.0)
        # (a held triple, steps.normalize: (E - c U) (U + V) overflowed)
        if checked and bool((V > 1).any()):
            slope = (E - c * U) * torch.where(V > 1, (U + V) / den, 1.0)
            slope = torch.where(V > 1, slope, (E - c * U) * (U + V) / den)
        else:
            slope = (E - c * U) * (U + V) / den
        slope = torch.where(q != 0, slope, 0.0)
        e = e + (a - a.detach()) * slope.detach()
    out = norm(u, e, v)
    if after is not None and checked:
        # nothing known (u = 0) before an observation of variance obs_var/loading^2 = s above
        # 2**G: (0, 0, W), W a power of two near s, not (0, 0, 1). The derivative in e of the
        # smoothed means through that observation is about s times theirs in its mean over W:
        # with W = 1 it passed the range where the derivatives through e do not (obs_var 1e200
        # after a gap or a step that forgets, means of 1e150: NaN gradients)
        none = (u == 0) & (after > 2.0 ** hold_exponent(v.dtype)) & torch.isfinite(after)
        if bool(none.any()):
            k = torch.clamp(torch.frexp(after.detach())[1], max=_max_exponent(v.dtype) - 4)
            W = torch.ldexp(torch.ones_like(v), k)
            out = (out[0], torch.where(none, e * (W / v).detach(), out[1]),
                   torch.where(none, W, out[2]))  # fmt: skip
    return out


def back_through(x, y, w, a, q, held=None):
    """The triple ``(a^2 x, a y, w)`` of a step back through the dynamics (``(0, 0, w)`` where
    the step forgets, ``q = 1``) divided by ``|a|``: ``(|a| x, sign(a) y, w / |a|)``, the same
    belief, with no ``a^2`` to under- or overflow. Where ``w / |a|`` would pass the range (a
    decay below ``w / finfo.max``: the precision is below the range) it is held at
    ``finfo.max / 4``, which keeps the mean ``y / (a x)``; the division's derivative in ``|a|``
    is formed as products (:func:`~kalmanscan.core.steps.quotient`).

    ``held``: where ``(x, y, w)`` is a held triple (``x`` the constant ``2**-G``,
    :func:`~kalmanscan.core.steps.hold_gauge`), or None. There the triple is divided by ``a^2``,
    ``(x, y / a, w / a^2)``, where ``w / a^2`` is in range: ``x`` stays the constant. In
    ``|a| x`` the adjoint of ``u``, ``-var / u``, passed the range at a variance of 1e300 and
    ``a``'s derivative was -inf (truth -2e300)."""
    kept = q == 0
    s = torch.where(kept, a.abs(), 1.0)
    top = torch.finfo(w.dtype).max / 4
    (v,) = quotient(s, torch.minimum(w, s * top))
    u = torch.where(kept, s * x, 0.0)
    e = torch.where(kept, torch.sign(a).detach() * y, 0.0)
    if held is not None:
        with torch.no_grad():
            gauge = held & kept & (w / s / s <= top)
        if bool(gauge.any()):
            s_g = torch.where(gauge, s, 1.0)
            y_g, w_g = quotient(s_g, y, w)
            (w_g,) = quotient(s_g, w_g)
            u = torch.where(gauge, x, u)
            e = torch.where(gauge, torch.sign(a).detach() * y_g, e)
            v = torch.where(gauge, w_g, v)
    return u, e, v


def backward_information(z, obs_var, decay, process_var, loading, offset):
    """The backward information filter, step by step: ``(U, E, V)`` each ``[T, N]``, the
    information about ``x_t`` from the observations after step ``t`` (precision ``U/V``,
    information ``E/V``; ``(0, 0, 1)`` at the last step)."""
    return _backward(z, obs_var, decay, process_var, loading, offset)[0]


def _backward(z, obs_var, decay, process_var, loading, offset, checked=True):
    """:func:`backward_information` and, with ``checked=False`` (steps with no host read), a
    0-d bool tensor: whether a step would have taken a branch of the tests (run it again
    checked; :func:`_backward_unusual`), else None."""
    T, N = z.shape
    leaves = backward_leaves(z, obs_var, decay, process_var, loading, offset)
    one, zero = torch.ones(N, dtype=z.dtype, device=z.device), z.new_zeros(N)
    U, E, V = zero, zero, one
    back = [(U, E, V)]
    rows = [_steps(x, T - 1) for x in leaves]
    R, h, _ = observation_terms(z, obs_var, loading)
    with torch.no_grad():  # (obs_var / loading^2 of each step's observation, inf where none)
        after = torch.where(h != 0, R / torch.where(h != 0, h * h, 1.0), math.inf)
    steps_after = _steps(after, T)
    for t in range(T - 2, -1, -1):
        U, E, V = backward_step(U, E, V, *(r[t] for r in rows),
                                after=steps_after[t] if t else None, checked=checked)  # fmt: skip
        back.append((U, E, V))
    back = tuple(torch.stack(k).flip(0) for k in zip(*back, strict=True))
    return back, None if checked else _backward_unusual(back, leaves[:3], after)


def _backward_unusual(back, obs, after):
    """Whether a step of :func:`_backward` taken ``checked=False`` would have taken a branch
    of the tests (a 0-d bool tensor, no host read): the update's scaled products or a held
    result (steps.observe_unusual, from the state each step enters), a held triple after the
    step back (steps.near_hold), or nothing known before an observation of variance above
    ``2**G`` (``after``; the state's ``u`` 0 after its normalization, a superset)."""
    U, E, V = back
    T = U.shape[0]
    if T < 2:
        return torch.zeros((), dtype=torch.bool, device=U.device)
    unusual = observe_unusual(U[1:], E[1:], V[1:], *obs) | near_hold(U[:-1], V[:-1])
    if T > 2:
        G = hold_exponent(U.dtype)
        s = after[1 : T - 1] if after.shape[0] > 1 else after
        none = (U[1 : T - 1] == 0) & (s > 2.0**G) & torch.isfinite(s)
        unusual = unusual | none.any()
    return unusual


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    ins = (z, obs_var, decay, process_var, loading, offset, x0)
    for checked in (False, True):  # (checked: a second pass where the first's tests say so)
        filt, pred, u_in, f_unusual = _forward(*ins, checked=checked)
        known = None if checked else False
        out = results(z, obs_var, loading, filt, pred, u_in, any_held=known)
        back, b_unusual = _backward(*ins[:6], checked=checked)
        out["smooth_mean"], out["smooth_var"] = combine_two_filter(*filt, *back, any_held=known)
        if checked or not read_tests(f_unusual | b_unusual)[0]:  # (the call's one host read)
            return out
