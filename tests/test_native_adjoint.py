"""The native kernel's log-likelihood adjoint (and its Hessian) against autograd of a plain float64
torch loop of the contract's step recursion (docs/backend-contract.md), written here, and against
central finite differences."""

from __future__ import annotations

import math

import pytest
import torch

from kalmanscan.core import native
from kalmanscan.testing import tolerance

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

F64 = torch.float64
NAMES = native.INPUTS + ("u0", "e0", "v0")
LOG_2PI = math.log(2 * math.pi)
TOL = tolerance("kernel_grad", "float64")


def ref_loglik(z, R, a, p, h, c, x0):
    """Per-lane log-likelihood [N] by the contract's recursion, one step at a time (the update in
    the contract's phi, r form), differentiable by autograd. Parameters broadcast to [T, N]."""
    T, N = z.shape
    R, a, p, h, c = (x.expand(T, N) for x in (R, a, p, h, c))
    u, e, v = (x.expand(N) for x in x0)
    m = torch.maximum(u, v)
    u, e, v = u / m, e / m, v / m
    ll = torch.zeros(N, dtype=z.dtype)
    for t in range(T):
        at, pt, ct, ht = a[t], p[t], c[t], h[t]
        observed = ~torch.isnan(z[t])
        zt = torch.where(observed, z[t], 0.0)
        Rt = torch.where(observed, R[t], 1.0)
        forget = at * at == 0
        q = forget.to(z.dtype)
        d = torch.where(forget, pt, at * at)
        up, vp = u + q * v, pt * u + d * v
        ep = ct * up + at * (1 - q) * e
        m = torch.maximum(up, vp)
        up, ep, vp = up / m, ep / m, vp / m
        known = up > 0
        contrib = observed & (known | (ht == 0))
        us = torch.where(known, up, 1.0)
        S = torch.where(known, ht * ht * vp + Rt * us, Rt)
        S = torch.where(contrib, S, 1.0)
        D = zt * us - ht * torch.where(known, ep, 0.0)
        term = -0.5 * (LOG_2PI + torch.log(S) - torch.log(us) + D * D / (us * S))
        ll = ll + torch.where(contrib, term, 0.0)
        phi = torch.where(observed, ht * ht / Rt, 0.0)
        r = torch.where(observed, ht * zt / Rt, 0.0)
        u, e, v = up + phi * vp, ep + r * vp, vp
        m = torch.maximum(u, v)
        u, e, v = u / m, e / m, v / m
    return ll


def make_case(T, N, kind, *, diffuse, seed=0, missing=0.15):
    """Inputs (compact shapes by `kind`: each parameter's shape) and x0 as a dict of tensors."""
    g = torch.Generator().manual_seed(seed)
    U = lambda lo, hi, shape: lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)  # noqa: E731
    shapes = {
        "time": (T, N),
        "lane": (1, N),
        "scalar": (1, 1),
        "series": (T, 1),
    }
    sh = {k: shapes[v] for k, v in kind.items()}
    x = dict(
        obs_var=U(0.2, 1.5, sh["obs_var"]),
        decay=U(-0.98, 0.98, sh["decay"]),
        process_var=U(0.05, 0.6, sh["process_var"]),
        loading=U(0.5, 1.4, sh["loading"]),
        offset=U(-0.5, 0.5, sh["offset"]),
    )
    z = torch.randn(T, N, generator=g, dtype=F64) * 1.5 + 0.3
    z[torch.rand(T, N, generator=g) < missing] = float("nan")
    x["z"] = z
    if diffuse:
        x0 = (torch.zeros(N, dtype=F64), torch.zeros(N, dtype=F64), torch.ones(N, dtype=F64))
    else:
        var = U(0.3, 4.0, (N,))
        mean = torch.randn(N, generator=g, dtype=F64)
        big = var > 1
        x0 = (
            torch.where(big, 1 / var, 1.0),
            torch.where(big, mean / var, mean),
            torch.where(big, 1.0, var),
        )
    x["u0"], x["e0"], x["v0"] = x0
    return x


def args_of(x, T, N):
    params = tuple(x[k].expand(T, N) for k in native.INPUTS)
    return params, (x["u0"], x["e0"], x["v0"])


KINDS = {
    "time": dict(obs_var="time", decay="time", process_var="time", loading="time", offset="time"),
    "lane": dict(obs_var="lane", decay="lane", process_var="lane", loading="lane", offset="lane"),
    "scalar": dict(
        obs_var="scalar", decay="scalar", process_var="scalar", loading="scalar", offset="scalar"
    ),
    "mixed": dict(
        obs_var="series", decay="lane", process_var="scalar", loading="time", offset="series"
    ),
}
CASES = [
    (T, N, kind, diffuse)
    for T, N in [(1, 3), (63, 5), (1000, 2), (63, 300)]
    for kind in KINDS
    for diffuse in (True, False)
    if not (T == 1000 and kind == "mixed")
]


def _ids(c):
    T, N, kind, diffuse = c
    return f"T{T}-N{N}-{kind}-{'diffuse' if diffuse else 'prior'}"


def _assert_grads(g, ref, what):
    """Every gradient against the reference, errors relative to max(|ref|, 1e-3 of the largest
    reference gradient) (the diffuse prior's v0 gradient, for one, is 0 up to rounding)."""
    floor = max(1e-3 * max(float(r.abs().max()) for r in ref), 1e-300)
    for name, r in zip(NAMES, ref, strict=True):
        got = g[name]
        assert got.shape == r.shape, (what, name)
        err = float((got - r).abs().max()) / max(float(r.abs().max()), floor)
        assert err <= TOL, (what, name, err)


# T1000 (1.5 s a case: autograd of the reference loop) by default once, with per-step inputs
# (the most general broadcast) and a diffuse start; the per-lane and scalar inputs' reductions
# and the proper prior are checked at T1, T63 and T63-N300 by default, and at T1000 in the slow
# step
ADJOINT_CASES = [
    pytest.param(c, id=_ids(c),
                 marks=pytest.mark.slow if c[0] == 1000 and c[2:] != ("time", True) else ())
    for c in CASES
]  # fmt: skip


@pytest.mark.parametrize("case", ADJOINT_CASES)
def test_adjoint_matches_autograd_of_the_reference(case):
    """Every input's gradient (compact shapes, summed over broadcast dims) against torch autograd
    of ref_loglik, weighted by a random per-lane w; float64; relative error <= the tolerance table's
    float64 kernel gradients (1e-8)."""
    T, N, kind, diffuse = case
    x = make_case(T, N, KINDS[kind], diffuse=diffuse, seed=T * 7 + N)
    w = torch.randn(N, generator=torch.Generator().manual_seed(3), dtype=F64)
    params, x0 = args_of(x, T, N)
    g = native.loglik_grad(*params, x0, w)
    assert g["flags"] == 0
    leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    ll = ref_loglik(*(leaves[k] for k in native.INPUTS), (leaves["u0"], leaves["e0"], leaves["v0"]))
    ref = torch.autograd.grad((w * ll).sum(), [leaves[k] for k in NAMES], allow_unused=True)
    ref = [torch.zeros_like(x[k]) if r is None else r for k, r in zip(NAMES, ref, strict=True)]
    _assert_grads(g, ref, case)


def test_adjoint_matches_central_differences():
    """Scalar parameters and the prior's mean and variance against central differences of the
    native forward's log-likelihood (float64, step 1e-6 relative): relative error <= 1e-6."""
    T, N = 200, 4
    x = make_case(T, N, KINDS["scalar"], diffuse=False, seed=11)
    w = torch.tensor([0.5, 1.0, -0.3, 2.0], dtype=F64)

    def f(vals):
        y = dict(x)
        y.update(vals)
        params, x0 = args_of(y, T, N)
        return float((w * native.filter_lanes(*params, x0, outputs="loglik")["loglik"]).sum())

    params, x0 = args_of(x, T, N)
    g = native.loglik_grad(*params, x0, w)
    for name in ("obs_var", "decay", "process_var", "loading", "offset"):
        h = 1e-6 * max(1.0, abs(float(x[name])))
        fd = (f({name: x[name] + h}) - f({name: x[name] - h})) / (2 * h)
        assert abs(float(g[name]) - fd) <= 1e-6 * max(1.0, abs(fd)), (name, float(g[name]), fd)
    # z at a few observed points
    for t, n in [(0, 0), (57, 2), (199, 3)]:
        if torch.isnan(x["z"][t, n]):
            continue
        h = 1e-6
        zp, zm = x["z"].clone(), x["z"].clone()
        zp[t, n] += h
        zm[t, n] -= h
        fd = (f({"z": zp}) - f({"z": zm})) / (2 * h)
        assert abs(float(g["z"][t, n]) - fd) <= 1e-6 * max(1.0, abs(fd)), ((t, n), fd)


def test_nan_steps_have_zero_gradient_in_z_and_obs_var():
    T, N = 63, 5
    x = make_case(T, N, KINDS["time"], diffuse=True, missing=0.3)
    params, x0 = args_of(x, T, N)
    g = native.loglik_grad(*params, x0)
    nan = torch.isnan(x["z"])
    assert nan.any()
    assert (g["z"][nan] == 0).all() and (g["obs_var"][nan] == 0).all()
    assert (g["z"][~nan] != 0).any()


@pytest.mark.parametrize("compact", [False, True], ids=["expanded", "compact"])
def test_loglik_output_is_differentiable_by_the_adjoint(monkeypatch, compact):
    """filter_lanes(outputs="loglik")["loglik"].backward() runs the adjoint (not the torch path),
    and gives autograd's gradients of the reference, through expanded [T, N] views and through
    compact [1, N], [T, 1], [1, 1] inputs alike."""
    T, N = 63, 7
    x = make_case(T, N, KINDS["mixed"], diffuse=False, seed=5)
    leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    calls = []
    real = native.loglik_grad
    monkeypatch.setattr(native, "loglik_grad", lambda *a, **k: calls.append(1) or real(*a, **k))
    params, x0 = args_of(leaves, T, N)
    if compact:
        params = tuple(leaves[k] for k in native.INPUTS)
    out = native.filter_lanes(*params, x0, outputs="loglik")
    w = torch.linspace(-1, 1, N, dtype=F64)
    got = torch.autograd.grad((w * out["loglik"]).sum(), [leaves[k] for k in NAMES])
    assert calls == [1]
    ref_leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    ll = ref_loglik(
        *(ref_leaves[k] for k in native.INPUTS),
        (ref_leaves["u0"], ref_leaves["e0"], ref_leaves["v0"]),
    )
    ref = torch.autograd.grad((w * ll).sum(), [ref_leaves[k] for k in NAMES])
    for name, a, b in zip(NAMES, got, ref, strict=True):
        assert a.shape == b.shape, name
        assert float((a - b).abs().max() / b.abs().max().clamp_min(1e-300)) <= TOL, name


def test_float32_adjoint_is_the_float64_gradient_rounded():
    """float32 inputs: the adjoint runs in float64 on the float32 values; against the float64
    reference at those values, relative error <= 1e-6 (rounding of the result only)."""
    T, N = 300, 20
    x = make_case(T, N, KINDS["lane"], diffuse=True, seed=2)
    x32 = {k: v.float() for k, v in x.items()}
    params, x0 = args_of(x32, T, N)
    g = native.loglik_grad(*params, x0)
    back = {k: v.double() for k, v in x32.items()}
    leaves = {k: v.clone().requires_grad_(True) for k, v in back.items()}
    ll = ref_loglik(*(leaves[k] for k in native.INPUTS), (leaves["u0"], leaves["e0"], leaves["v0"]))
    ref = torch.autograd.grad(ll.sum(), [leaves[k] for k in native.INPUTS])
    for name, r in zip(native.INPUTS, ref, strict=True):
        assert g[name].dtype == torch.float32
        err = float((g[name].double() - r).abs().max() / r.abs().max())
        assert err <= 1e-6, (name, err)


@pytest.mark.parametrize("checkpoint", [1, 2, 7, 63, 64, 1000])
def test_checkpoint_interval_does_not_change_the_gradient(checkpoint):
    T, N = 63, 9
    x = make_case(T, N, KINDS["time"], diffuse=True, seed=4)
    params, x0 = args_of(x, T, N)
    ref = native.loglik_grad(*params, x0)
    got = native.loglik_grad(*params, x0, checkpoint=checkpoint)
    for name in NAMES:
        assert torch.equal(got[name], ref[name]), name


def test_threads_do_not_change_the_gradient():
    """Lanes split over threads: lane-resolved gradients are bit-identical; sums over lanes
    ([T, 1], [1, 1]) agree within rounding."""
    T, N = 50, 2000
    x = make_case(T, N, KINDS["mixed"], diffuse=True, seed=8)
    params, x0 = args_of(x, T, N)
    one = native.loglik_grad(*params, x0, threads=1)
    for threads in (2, 3):
        many = native.loglik_grad(*params, x0, threads=threads)
        for name in NAMES:
            if one[name].shape[-1] == N and one[name].dim() == 2 or name in ("u0", "e0", "v0"):
                assert torch.equal(many[name], one[name]), (threads, name)
            else:
                err = float((many[name] - one[name]).abs().max() / one[name].abs().max())
                assert err <= 1e-12, (threads, name, err)


def test_extreme_scales_give_finite_gradients():
    """obs_var 1e-300 and process_var 1e300 (float64), and process_var = 0 with |decay| < 1 over
    10^4 steps: finite gradients. Against the reference where its phi = h^2/R form keeps its
    digits, else against finite differences of the native forward (the gradients there equal the
    scaling that moderate values show: obs_var's -8.969e-9 at p = 1e10 is -8.969e-299 at 1e300)."""
    s = lambda v: torch.full((1, 1), v, dtype=F64)  # noqa: E731
    cases = [
        (1e-300, 0.5, 50, ("obs_var",)),
        (1.0, 1e300, 50, ("obs_var", "process_var", "loading", "u0", "v0")),
        (1.0, 0.0, 10_000, None),
    ]
    for R, p, T, by_fd in cases:
        N = 2
        z = torch.randn(T, N, generator=torch.Generator().manual_seed(1), dtype=F64) * 0.1
        x = dict(
            z=z,
            obs_var=s(R),
            decay=s(0.9),
            process_var=s(p),
            loading=s(1.0),
            offset=s(0.4),
            u0=torch.ones(N, dtype=F64),
            e0=torch.zeros(N, dtype=F64),
            v0=torch.ones(N, dtype=F64),
        )
        params, x0 = args_of(x, T, N)
        g = native.loglik_grad(*params, x0)
        assert g["flags"] == 0, (R, p, T)
        for name in NAMES:
            assert torch.isfinite(g[name]).all(), (R, p, T, name)
        if by_fd is None:
            continue
        leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}
        ll = ref_loglik(
            *(leaves[k] for k in native.INPUTS), (leaves["u0"], leaves["e0"], leaves["v0"])
        )
        ref = torch.autograd.grad(ll.sum(), [leaves[k] for k in NAMES])
        ref = [g[k] if k in by_fd else r for k, r in zip(NAMES, ref, strict=True)]
        _assert_grads(g, ref, (R, p))
        for name in by_fd:
            if name in ("u0", "v0"):
                continue  # the prior is (1, 0, 1): its gradient is 1e-300 small, FD cannot see it
            if name == "obs_var" and p > 1:  # d/dR ~ 1/p: no difference quotient can see it
                params, x0 = args_of(dict(x, process_var=s(p * 1e-200)), T, N)
                g_mod = native.loglik_grad(*params, x0, wrt=("obs_var",))["obs_var"]
                assert abs(float(g[name] / (g_mod * 1e-200)) - 1) <= 1e-12, (p, name)
                continue

            def f(val, name=name, x=x, T=T, N=N):
                params, x0 = args_of(dict(x, **{name: s(val)}), T, N)
                return float(native.filter_lanes(*params, x0, outputs="loglik")["loglik"].sum())

            v = float(x[name])
            if v < 1e-200:  # a step of R's own size changes nothing: one-sided, second order
                h = 1e-5
                fd = (-3 * f(v) + 4 * f(v + h) - f(v + 2 * h)) / (2 * h)
            else:
                fd = (f(v * (1 + 1e-6)) - f(v * (1 - 1e-6))) / (2e-6 * v)
            assert abs(float(g[name]) - fd) <= 1e-6 * abs(fd), (R, p, name, float(g[name]), fd)


def _local_level_build(z, per_lane):
    """theta -> inputs of an AR(1)-plus-noise model: obs_var = exp(t0), decay = tanh(t1),
    process_var = exp(t2), offset = t3, finite prior N(0, 2)."""
    T, N = z.shape

    def build(th):
        col = (lambda k: th[:, k].reshape(1, N)) if per_lane else (lambda k: th[k].reshape(1, 1))
        one = torch.ones(1, 1, dtype=F64)
        x0 = (torch.full((N,), 0.5, dtype=F64), torch.zeros(N, dtype=F64), torch.ones(N, dtype=F64))
        return z, col(0).exp(), col(1).tanh(), col(2).exp(), one, col(3), x0

    return build


@pytest.mark.parametrize("per_lane", [False, True], ids=["shared", "per-lane"])
def test_hessian_matches_double_backward_of_the_reference(per_lane):
    """loglik_hessian (central differences of the adjoint gradient) against torch's exact Hessian
    (double backward) of ref_loglik; float64; relative error <= 1e-6. 50 steps (the reference's
    double backward through its loop takes 2-6 s at 150), some of each lane's missing."""
    T, N = 50, 3
    g = torch.Generator().manual_seed(21)
    z = torch.randn(T, N, generator=g, dtype=F64)
    z[torch.rand(T, N, generator=g) < 0.1] = float("nan")
    assert z.isnan().any(0).all()
    theta = torch.tensor([-0.3, 0.9, -1.2, 0.2], dtype=F64)
    if per_lane:
        theta = theta + 0.1 * torch.randn(N, 4, generator=g, dtype=F64)
    build = _local_level_build(z, per_lane)
    H = native.loglik_hessian(build, theta, per_lane=per_lane)

    def f(th):
        *params, x0 = build(th)
        return ref_loglik(*params, x0)

    if per_lane:
        ref = torch.stack(
            [
                torch.autograd.functional.hessian(
                    lambda row, n=n: f(torch.cat([theta[:n], row[None], theta[n + 1 :]]))[n],
                    theta[n],
                )
                for n in range(N)
            ]
        )
    else:
        ref = torch.autograd.functional.hessian(lambda th: f(th).sum(), theta)
    assert H.shape == ref.shape
    err = float((H - ref).abs().max() / ref.abs().max())
    assert err <= 1e-6, err
    assert float(ref.abs().max()) > 1.0  # a Hessian that can fail the check


def test_set_num_threads_is_checked_and_does_not_change_results():
    T, N = 40, 3000
    x = make_case(T, N, KINDS["lane"], diffuse=True, seed=6)
    params, x0 = args_of(x, T, N)
    ref = native.loglik_grad(*params, x0)
    try:
        for threads in (1, 3):
            native.set_num_threads(threads)
            got = native.loglik_grad(*params, x0)
            for name in ("z", "decay", "u0"):
                assert torch.equal(got[name], ref[name]), (threads, name)
        with pytest.raises(ValueError, match="threads: expected a positive int or None, got 0"):
            native.set_num_threads(0)
    finally:
        native.set_num_threads(None)


def test_prior_given_once_for_all_lanes_gets_the_summed_gradient():
    """x0 entries of shape [1] (one prior for every lane): their gradient is the sum over lanes."""
    T, N = 30, 6
    x = make_case(T, N, KINDS["lane"], diffuse=False, seed=9)
    params, _ = args_of(x, T, N)
    one = [torch.tensor([v], dtype=F64, requires_grad=True) for v in (0.5, 0.2, 1.0)]
    ll = native.filter_lanes(*params, tuple(one), outputs="loglik")["loglik"]
    got = torch.autograd.grad(ll.sum(), one)
    per_lane = native.loglik_grad(*params, tuple(v.detach().expand(N) for v in one))
    for name, g in zip(("u0", "e0", "v0"), got, strict=True):
        assert g.shape == (1,)
        assert torch.allclose(g, per_lane[name].sum().reshape(1), rtol=1e-12), name
