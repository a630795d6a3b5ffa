"""The parallel torch backend: beliefs by one projective scan (docs/backend-contract.md).

Step t's leaf is the predict map followed by adding the observation's information, as a linear map
of homogeneous beliefs ``(u, v | e)``:

    A = [[1 + phi p, q + phi d], [p, d]],   b = (c + r p, q c + r d),   alpha = a (1 - q)

computed times ``R = obs_var`` (``R + h^2 p``, ..., the same beliefs) so that no ``1/R`` enters
and gradients in ``obs_var`` stay exact however small it is.
(``q, d`` from :func:`kalmanscan.core.steps.predict_coeffs`; ``[[1 + p phi, a^2 phi], [p, a^2]]``
whenever ``a^2 > 0``). The smoother's backward information filter is the same scan in reverse time
with leaves ``A = [[k d, k d phi], [g, g phi + 1]]``, ``b = (-alpha c, alpha (r - c phi))``,
``k = 1 - q``, ``g = k p + q``. Outputs come from the filtered triples and the predicted ones
(one predict step from the previous filtered triple, elementwise), exactly as in the sequential
reference, so the two differ only by how the filtered triples are computed.

Two kinds of step are not left to the scan's products (docs/reliability.md, "Underflow
regimes"): a diffuse start's steps up to its first informative one (:func:`_diffuse_prefix`;
their parameters get no gradient, :func:`_diffuse_inputs`), and a step whose ``a^2`` is below the
normal range meeting a known state with ``p u`` below it too, whose leaf has lost ``a^2 v``
(:func:`_tiny_decay_steps`: the scan is cut there and the step taken elementwise). The backward
scan is cut likewise where such a decay (or one whose square passes the range) gives a precision
its leaf loses (:func:`_odd_decay_steps_back`).

Units: the scans run on ``(k_t u, k_t e, v)``. A lane takes one unit, ``max(1, max p)``
(:func:`_lane_scale`), where it serves every step (:func:`_lane_unit_fails`) and its leaves stay
in range (:func:`_leaves_overflow`); elsewhere each step takes a power of two near the variance
the state carries there (:func:`_carried_units`, :func:`_carried_units_back`: a scan of clamps
on logs), and every leaf is formed in its units from its factors' mantissas and exponents and
divided by its largest entry (:func:`_exact_leaf`), so that nothing passes the range where the
beliefs do not; a lane whose leaves overflow in its own unit takes that path with the unit as a
power of two.

Modules, by role: this one holds the entry points (:func:`filter_lanes`, :func:`smooth_lanes`,
the backward information filter included), the forward pass (:func:`_forward`) and the means'
Newton step (:func:`_consistent_means`); ``parallel_units`` chooses the scans' units,
``parallel_scan`` runs the scan in them and takes the steps its products lose, ``parallel_grad``
holds the pieces that keep derivatives exact. Their names are importable from here as well.
"""

from __future__ import annotations

import torch

from kalmanscan.core import sequential
from kalmanscan.core.parallel_grad import (  # noqa: F401 - also this module's names before the split
    _diffuse_inputs,
    _forget_slope,
    _ForgetSlope,
    _Over,
    _over_max,
    _over_max_test,
)
from kalmanscan.core.parallel_scan import (  # noqa: F401 - as above
    _at,
    _diffuse_prefix,
    _far,
    _hold,
    _in_unit,
    _no_information_prefix,
    _odd_decay_steps_back,
    _scan,
    _scan_exact,
    _Scanned,
    _seg_units,
    _tiny_decay_steps,
)
from kalmanscan.core.parallel_units import (  # noqa: F401 - as above
    _FORGET,
    _INF,
    _STEP_UNIT_FLOOR,
    _STEP_UNIT_SPREAD,
    _carried_units,
    _carried_units_back,
    _exact_leaf,
    _lane_scale,
    _lane_unit_fails,
    _lane_units,
    _leaves_overflow,
    _log2,
    _unit_shifts,
    _unit_tests,
    _units,
    _units_from_logs,
)
from kalmanscan.core.scan import affine_scan, clamp_scan, projective_scan  # noqa: F401
from kalmanscan.core.sequential import backward_leaves, observation_terms, results
from kalmanscan.core.steps import (  # noqa: F401 - as above
    _LOW,
    _REPEATED_ROUNDING,
    _exponent,
    _ScaledProduct,
    _split_product,
    _times_pow2,
    beyond,
    combine_two_filter,
    compact,
    held,
    held_mask,
    hold_exponent,
    kept_mean,
    near_hold,
    normalize_max,
    predict,
    predict_coeffs,
    quotient,
    read_tests,
    start,
    update,
)


def _forward(z, obs_var, decay, process_var, loading, offset, x0):
    """Filtered and predicted triples, the filtered ``u`` entering each step, the lane's unit
    ``k`` and whether a triple is held (False where none is; None: not known). An ordinary
    call reads the host twice, each time every test at once (steps.read_tests): the inputs'
    (a held prior, units, the diffuse prefix, tiny decays), then the scan's and the
    predictions' (held triples, states far above their units, steps.near_hold), after which
    only a call that meets one takes the steps after the scan again with them."""
    R, h, hz = observation_terms(z, obs_var, loading)
    a, p, c = compact(decay), compact(process_var), compact(offset)
    q, d = predict_coeffs(a * a, p, a)
    x_in, x0 = x0, start(*x0, checked=False)
    diffuse = x0[0] == 0
    T, N = z.shape
    tiny = torch.finfo(a.dtype).tiny
    products = _over_max_test(R, h, hz)
    with torch.no_grad():
        n1 = torch.maximum(R[:1], h[:1] * h[:1])  # (the first step's h2s, as _over_max's)
        tests = read_tests(
            held_mask(x_in[0], x_in[2]).any(),
            diffuse.any(),
            products,
            *_unit_tests(_lane_scale(p), d),
            # the diffuse prefix: where a diffuse start is not informed at once (leading gaps,
            # tiny decays: one whose square may underflow a diffuse start's first leaf; the
            # prefix's own test, below half the range, is stricter)
            ((q[:1] == 0) & (h[:1] * h[:1] * (1 / n1) == 0) & diffuse).any()
            | (a * a < tiny**0.25).any(),
            ((q == 0) & (d < tiny)).any(),  # decays whose square leaves the normal range
        )
    start_held, any_diffuse, products, *unit_tests, prefix, tiny_decays = tests
    if start_held:
        x0 = start(*x_in)
    if (
        any_diffuse
        and torch.is_grad_enabled()
        and any(x.requires_grad for x in (R, h, hz, a, p, c, d))
    ):
        R, h, hz, a, p, c, d = _diffuse_inputs(x0, q, R, h, hz, a, p, c, d)
    # the leaf times R (the update's R-scaled form), divided by s = max(R, h^2): no 1/R, and
    # nothing overflows (h^2 p / s <= p)
    Rs, h2s, hzs = _over_max(R, h, hz, products)
    al = Rs * a * (1 - q)
    box = None
    if torch.is_grad_enabled() and a.requires_grad:
        box = {}
        al = _ForgetSlope.apply(al, a, box, "slope")
    leaves = (Rs + h2s * p, Rs * q + h2s * d, Rs * p, Rs * d, Rs * c + hzs * p,
              Rs * q * c + hzs * d, al)  # fmt: skip
    k = _lane_scale(p)
    plain, carried = leaves, []

    def carried_units():
        carried.append(True)
        return _carried_units(a, p, R, h, x0, T, N)

    def build(units):
        """The leaves in ``units`` (formed exactly where they are exponents), with the diffuse
        prefix; and whether they are exponents."""
        leaves = plain
        exact = isinstance(units, tuple)
        if exact:
            shifts = _unit_shifts(*units)
            w = a * (1 - q)  # (its slope where it forgets: _forget_slope without Rs)
            if box is not None:  # (per step: a time-invariant decay's gradient arrives summed)
                w = _ForgetSlope.apply(w.expand(R.shape), a, box, "slope")
            # (the unscaled leaf: its scale 1/max(R, h^2) is the exact scaling's; through it
            # the derivatives in R passed the range, R = 1e-100 in a log-likelihood of -5e196:
            # NaN)
            terms = ([(R,), (h, h, p)], [(R, q), (h, h, d)], [(R, p)], [(R, d)],
                     [(R, c), (hz, p)], [(R, q, c), (hz, d)], [(R, w)])  # fmt: skip
            leaves = _exact_leaf(terms, shifts, z)
        if any_diffuse and prefix:
            forget = q != 0
            if exact:
                big = torch.log((Rs + h2s * p).clamp(min=1.0))
                log_d = torch.where(forget, 0.0, torch.log(Rs) + torch.log(d) - big)
                g = torch.where(forget, p, 1.0)
                const = _exact_leaf(([], [(R, q), (h, h, g)], [], [(R, g)], [],
                                     [(R, c, q), (hz, g)], []), shifts, z)  # fmt: skip
            else:
                log_d = torch.log(torch.where(forget, 1.0, leaves[3] / leaves[0].clamp(min=1.0)))
                zero = torch.zeros_like(leaves[0])
                const = (zero, torch.where(forget, Rs + h2s * p, h2s), zero,
                         torch.where(forget, Rs * p, Rs), zero,
                         torch.where(forget, Rs * c + hzs * p, hzs), zero)  # fmt: skip
            leaves = _diffuse_prefix(leaves, q, h2s, x0[0], log_d, const)
        return leaves, exact

    def finish(filt, checked):
        """The steps after the scan: tiny decays', the means' Newton step, the forget slope,
        the predictions (``checked=False``: none held, steps.predict)."""
        if tiny_decays:
            filt = _tiny_decay_steps(leaves, x0, units, filt, (a, p, c, q, d, R, h, hz))
        if _REPEATED_ROUNDING(z.dtype) and any(x.requires_grad for x in (*filt, *leaves)):
            filt = _consistent_means(filt, x0, (a, p, c, q, d, R, h, hz))
        if box is not None:
            box["slope"] = _forget_slope(x0, filt, q, torch.ones_like(Rs) if exact else Rs)
        prev = tuple(torch.cat([s.expand(1, N), x[:-1]]) for s, x in zip(x0, filt, strict=True))
        pred = predict(*prev, a, p, c, q, d, carried=False, checked=checked)
        return filt, pred, prev[0].detach()

    # per-step units and leaves formed exactly in them cost several passes over [T, N]: taken
    # only where the lane's unit would not hold (steps whose own variance is far below the
    # lane's largest process variance), its leaves pass the range, or a state's variance is
    # far above its unit (_far)
    units = _units(k, plain, x0, carried_units, unit_tests)
    leaves, exact = build(units)
    scan = _scan(leaves, x0, units, unit_tests[0])
    far = scan.far if not carried else torch.zeros_like(scan.far)
    if not tiny_decays:  # (after _tiny_decay_steps a triple may be held: its own reads)
        filt, pred, u_in = finish(scan.plain, checked=False)
        some, far, unusual = read_tests(scan.some, far, near_hold(pred[0], pred[2]))
        if not (some or far or unusual):
            return filt, pred, u_in, _lane_scale(p), False
    else:
        some, far = read_tests(scan.some, far)
    if far:
        units = carried_units()
        leaves, exact = build(units)
        filt = _scan(leaves, x0, units).resolved()
    else:
        filt = scan.held() if some else scan.plain
    filt, pred, u_in = finish(filt, checked=True)
    return filt, pred, u_in, _lane_scale(p), None


def _consistent_means(filt, x0, params):
    """The filtered means after one Newton step on the recursion ``m_t = A_t m_{t-1} + b_t``
    (values only; the derivatives stay the scan's). The scan's products repeat a settled lane's
    roundings as the sequential steps did (steps._REPEATED_ROUNDING): its float32 means
    tracked a decay ``a (1 - d)``, and a shared decay's gradient on a random walk of 10^5 steps
    was 1.4e-2 off. The residual of each step taken from the scan's previous mean with weights
    that sum to 1 (steps._robust_mean's forms), ``r_t``, and ``delta_t = A_t delta_{t-1} + r_t``
    (one affine scan; ``A_t = a (u / U) (1 - g)``, the step's ``d m_t / d m_{t-1}``) give the
    means ``m + delta``; where a step is not an ordinary one (a diffuse or held state, a value
    out of range) ``A_t = r_t = 0``."""
    a, p, c, q, d, R, h, hz = params
    u, e, v = filt
    T, N = u.shape
    with torch.no_grad():
        up, ep, vp = (torch.cat([s.detach().expand(1, N), x.detach()[:-1]])
                      for s, x in zip(x0, filt, strict=True))  # fmt: skip
        U = up + q * vp
        m = e.detach() / u.detach()
        keep = (a * (1 - q)) * (up / U)
        mp = c + keep * (ep / up)
        var_p = (p * up + d * vp) / U
        h2 = h * h
        g = h2 * var_p / (R + h2 * var_p)
        zh = hz / torch.where(h != 0, h2, 1.0)
        m1 = torch.where(g > 0.5, zh + (1 - g) * (mp - zh), mp + g * (zh - mp))
        A = keep * (1 - g)
        r = m1 - m
        ok = (up > 0) & (u > 0) & (vp <= 1) & torch.isfinite(r) & torch.isfinite(A)
        delta = affine_scan(torch.where(ok, A, 0.0), torch.where(ok, r, 0.0),
                            torch.zeros_like(m[0]))  # fmt: skip
    return u, kept_mean(u, e, m + delta, ok), v


def filter_lanes(z, obs_var, decay, process_var, loading, offset, x0, outputs="all"):
    sequential._check_outputs(outputs)
    filt, pred, u_in, _, any_held = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    return results(z, obs_var, loading, filt, pred, u_in, outputs, any_held)


def smooth_lanes(z, obs_var, decay, process_var, loading, offset, x0):
    filt, pred, u_in, k, any_held = _forward(z, obs_var, decay, process_var, loading, offset, x0)
    out = results(z, obs_var, loading, filt, pred, u_in, any_held=any_held)
    T, N = z.shape
    if T == 1:
        out["smooth_mean"], out["smooth_var"] = out["mean"], out["var"]
        return out
    R, h, hz, a, p, c, q, d = backward_leaves(z, obs_var, decay, process_var, loading, offset)
    keep = 1 - q
    # (selects where a step forgets, not products with keep = 0: the exact leaves' derivatives
    # there, g 2**shift in the unit of a state that knows nothing, pass the range, and 0 times
    # them gave a NaN gradient in that step's process_var)
    kd = torch.where(q != 0, 0.0, d)
    g = torch.where(q != 0, 1.0, p)
    al = a * keep
    tiny = torch.finfo(z.dtype).tiny
    odd = (q == 0) & ((d < tiny) | (d > 1 / tiny))  # decays whose square leaves the normal range
    # (the first row back is the last step: flip(h)[:1])
    products = _over_max_test(R, h, hz)
    with torch.no_grad():
        products, informed, any_odd, *unit_tests = read_tests(
            products, (h[-1:] != 0).all(), odd.any(), *_unit_tests(k, d)
        )
    # the R-scaled leaf over max(R, h^2), as in _forward
    Rs, h2s, hzs = _over_max(R, h, hz, products)
    b1, b2, ab = -al * c * Rs, al * (hzs - c * h2s), al * Rs
    box = None
    if torch.is_grad_enabled() and a.requires_grad:  # (a step that forgets: _ForgetSlope)
        box = {}
        b1, b2, ab = (_ForgetSlope.apply(x, a, box, key)
                      for x, key in ((b1, "b1"), (b2, "b2"), (ab, "alpha")))  # fmt: skip
    leaves = (kd * Rs, kd * h2s, g * Rs, g * h2s + Rs, b1, b2, ab)
    flip = lambda x: x.expand(T - 1, N).flip(0) if x.shape[0] > 1 else x  # noqa: E731
    one, zero = torch.ones(N, dtype=z.dtype, device=z.device), z.new_zeros(N)
    leaves = tuple(flip(x) for x in leaves)

    # the lane's unit where it serves every step back (as _forward's), else per-step units
    plain, taken = leaves, []

    def carried():  # (flipped only where they are needed)
        taken.append(True)
        return _carried_units_back(*(flip(x) for x in (a, p, R, h)), T - 1, N)

    def build(units):
        leaves = plain
        if isinstance(units, tuple):
            w = al
            if box is not None:  # (its slope where it forgets: "a", below; per step)
                w = _ForgetSlope.apply(al.expand(R.shape), a, box, "a")
            kd_, R_, h_, hz_, g_, c_, al_ = (flip(x) for x in (kd, R, h, hz, g, c, w))
            leaves = _exact_leaf(([(kd_, R_)], [(kd_, h_, h_)], [(g_, R_)],
                                  [(g_, h_, h_), (R_,)], [(al_, -c_, R_)],
                                  [(al_, hz_), (al_, -c_, h_, h_)], [(al_, R_)]),
                                 _unit_shifts(*units), z[1:])  # fmt: skip
        if not informed:  # (a lane whose last step is not informative)
            leaves = _no_information_prefix(leaves, flip(h) != 0)
        return leaves

    end = (zero, zero, one)
    units = _units(k, plain, (zero, zero), carried, unit_tests)
    leaves = build(units)
    scan = _scan(leaves, end, units, unit_tests[0])
    some, far = read_tests(scan.some, scan.far)  # (the scan's tests: one host read)
    if far and not taken:  # (a state's variance far above its unit: _far)
        units = carried()
        leaves = build(units)
        back = _scan(leaves, end, units).resolved()
    else:
        back = scan.held() if some else scan.plain
    if any_odd:
        steps = tuple(flip(x) for x in (R, h, hz, a, p, c, q, d))
        back = _odd_decay_steps_back(leaves, units, back, steps, flip(odd))
    back = tuple(
        torch.cat([x.flip(0), end[None]]) for x, end in zip(back, (zero, zero, one), strict=True)
    )
    if box is not None:  # the state each step back enters: the one after it
        U, V = back[0][1:].detach(), back[2][1:].detach()
        n = torch.maximum(U, V)  # (1 but where held: V up to 2**(emax - G), steps.normalize)
        U, V = U / n, V / n
        U1 = Rs * U + h2s * V
        den = p * U1 + Rs * V
        kappa = torch.where(q != 0, (U1 + Rs * V) / torch.where(den > 0, den, 1.0), 0.0)
        box.update(b1=(-c * Rs * kappa).detach(), b2=((hzs - c * h2s) * kappa).detach(),
                   alpha=(Rs * kappa).detach(), a=kappa.detach())  # fmt: skip
    known = any_held is False and not (some or (far and not taken) or any_odd)
    out["smooth_mean"], out["smooth_var"] = combine_two_filter(
        *filt, *back, any_held=False if known else None
    )
    return out
