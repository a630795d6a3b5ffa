"""KLALayer: shapes, dtypes, decode == full pass, gradients, output variance vs Monte Carlo,
discretization vs the published formula, initialization, parameter layout, argument checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kalmanscan.kla import KLAConfig, KLALayer, KLALayerState
from kalmanscan.testing import assert_close, tolerance

# Decode (token by token) vs the full pass: the 1e-5 in float32; float64 agrees to
# rounding (kalmanscan/testing.py's ("decode", dtype)).
DECODE_TOL = {dt: tolerance("decode", dt) for dt in (torch.float32, torch.float64)}

# float(parameter) in assertions is intended
pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")

DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]


def make_layer(D=16, S=4, dtype=torch.float64, seed=0, perturb=True, **cfg):
    """A layer whose dynamics are spread out (not just the init values), so tests see variety."""
    torch.manual_seed(seed)
    layer = KLALayer(D, KLAConfig(d_state=S, **cfg)).to(dtype)
    if perturb:
        with torch.no_grad():
            layer.lambda_log.normal_(0.0, 1.0)
            layer.process_noise.uniform_(0.005, 0.5)
            layer.delta.normal_(-1.0, 1.0)
            layer.lambda_skip.fill_(-0.7)
            layer.sensor_proj.weight.normal_(0.0, 0.3)
            layer.in_proj.weight.normal_(0.0, 0.3)
            layer.out_proj.weight.normal_(0.0, 0.3)
    return layer


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "B,L,D,S",
    [(2, 1, 16, 4), (1, 63, 16, 4), (2, 1000, 4, 2)],
    ids=["B2-L1-D16-S4", "B1-L63-D16-S4", "B2-L1000-D4-S2"],
)
def test_shapes_and_dtypes(B, L, D, S, dtype):
    layer = make_layer(D, S, dtype)
    M = layer.d_inner
    x = torch.randn(B, L, D, dtype=dtype)
    out, out_var, state = layer(x, return_variance=True, return_state=True)
    assert out.shape == (B, L, D) and out.dtype == dtype
    assert out_var.shape == (B, L, D) and out_var.dtype == dtype
    assert bool((out_var > 0).all()) and bool(torch.isfinite(out).all())
    assert isinstance(state, KLALayerState)
    assert state.conv.shape == (B, M, 3) and state.lam.shape == (B, M, S) == state.eta.shape
    assert state.lam.dtype == dtype
    assert torch.equal(layer(x), out)  # plain call returns the same output alone


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "L,prefill",
    [(1, 0), (63, 0), (63, 40), (200, 199)],
    ids=["L1-tokenwise", "L63-tokenwise", "L63-prefill40", "L200-prefill199"],
)
def test_decode_equals_full_pass(L, prefill, dtype):
    layer = make_layer(16, 4, dtype, seed=1)
    x = torch.randn(2, L, 16, dtype=dtype)
    full, full_var, full_state = layer(x, return_variance=True, return_state=True)
    state = layer.init_state(2)
    outs, vars_ = [], []
    if prefill:
        o, v, state = layer(x[:, :prefill], state, return_variance=True)
        outs.append(o)
        vars_.append(v)
    for t in range(prefill, L):
        o, v, state = layer(x[:, t : t + 1], state, return_variance=True)
        outs.append(o)
        vars_.append(v)
    tol = DECODE_TOL[dtype]
    assert rel(torch.cat(outs, 1), full) <= tol
    assert rel(torch.cat(vars_, 1), full_var) <= tol
    assert rel(state.lam, full_state.lam) <= tol
    assert rel(state.eta, full_state.eta) <= tol
    assert rel(state.conv, full_state.conv) <= tol  # in_proj rounds per call shape


def test_trace_matches_forward():
    layer = make_layer(16, 4, torch.float64, seed=2)
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    out, out_var = layer(x, return_variance=True)
    tr = layer.trace(x)
    assert_close(tr.out, out, "identical", torch.float64, what="trace out")
    assert_close(tr.out_var, out_var, "identical", torch.float64, what="trace out_var")
    assert tr.precision.shape == (2, 30, layer.d_inner, 4)
    # the readout variance is sum_s q^2 / lam
    assert_close(
        tr.yvar,
        (tr.sensors.q[:, :, None, :] ** 2 / tr.precision).sum(-1),
        "parallel",
        torch.float64,
        what="yvar",
    )


def test_gradients_reach_every_parameter():
    layer = make_layer(16, 4, torch.float64, seed=3)
    x = torch.randn(2, 20, 16, dtype=torch.float64, requires_grad=True)
    out, out_var = layer(x, return_variance=True)
    (out.square().sum() + out_var.sum()).backward()
    names = [n for n, _ in layer.named_parameters()]
    assert set(names) == {
        "in_proj.weight",
        "conv.weight",
        "conv.bias",
        "sensor_proj.weight",
        "delta",
        "lambda_log",
        "process_noise",
        "lambda_skip",
        "out_proj.weight",
    }
    for name, p in layer.named_parameters():
        assert p.grad is not None, name
        assert bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().max()) > 0, name
    assert float(x.grad.abs().max()) > 0


def test_gradcheck_small():
    layer = make_layer(4, 2, torch.float64, seed=4, expand=1.0)
    x = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: layer(x, return_variance=True), (x,), atol=tolerance("gradcheck", "float64")
    )


@pytest.mark.parametrize("t", [0, 17], ids=["t0", "t17"])
@torch.no_grad()
def test_return_variance_matches_monte_carlo(t):
    """Sample the posterior of every (channel, slot) lane after token t, push the samples through
    the linear readout (q, skip, gate, out_proj) and compare the sample variance of the output
    with ``out_var``. Relative standard error of a variance from N samples is sqrt(2/N)."""
    layer = make_layer(8, 4, torch.float64, seed=5)
    x = torch.randn(1, 18, 8, dtype=torch.float64)
    _, out_var = layer(x, return_variance=True)
    _, _, state = layer(x[:, : t + 1], return_variance=True, return_state=True)
    sens, _ = layer.sensors(x[:, : t + 1])
    mean, sd = state.eta / state.lam, state.lam.rsqrt()  # [1, M, S]
    n = 40_000
    gen = torch.Generator().manual_seed(6)
    samples = mean + sd * torch.randn(n, *mean.shape[1:], generator=gen, dtype=torch.float64)
    q, z, gate = sens.q[0, -1], sens.z[0, -1], sens.gate[0, -1]
    y = (samples * q).sum(-1) + layer.lambda_skip.detach() * z
    out_samples = F.linear(y * F.silu(gate), layer.out_proj.weight.detach())  # [n, D]
    mc_var = out_samples.var(dim=0)
    expected = out_var[0, t]
    se = math.sqrt(2.0 / n)
    assert float(((mc_var - expected) / expected).abs().max()) < 5 * se
    # and the sample mean is the layer's output
    out = layer(x)[0, t]
    assert float(((out_samples.mean(0) - out).abs() / expected.sqrt()).max()) < 5 / math.sqrt(n)


def test_output_variance_is_zero_without_gate_signal():
    # yvar is scaled by act(gate)^2: a zero gate input (silu(0) = 0) removes all variance
    layer = make_layer(8, 2, torch.float64, seed=7)
    with torch.no_grad():
        layer.in_proj.weight[layer.d_inner :].zero_()
    with torch.no_grad():
        _, out_var = layer(torch.randn(1, 5, 8, dtype=torch.float64), return_variance=True)
    assert float(out_var.abs().max()) == 0.0


@pytest.mark.parametrize("discretization", ["ou", "zoh"])
def test_dynamics_match_published_formula(discretization):
    """The published layer: kappa = max(exp(lambda_log), 1e-8), dt = softplus(delta) + 1e-7,
    p = max(process_noise, 1e-7); a = exp(-kappa dt); OU: p/(2 kappa) (-expm1(-2 kappa dt)),
    ZOH: p dt. Equal wherever kappa >= 1e-8; below, the published clamp changes a and p by a
    relative 1e-8 * dt at most (under float32 resolution), where discretize_ou is exact."""
    layer = make_layer(8, 3, torch.float64, seed=8, discretization=discretization)
    with torch.no_grad():
        layer.lambda_log.copy_(
            torch.linspace(-30.0, 4.0, layer.lambda_log.numel()).view_as(layer.lambda_log)
        )
        layer.process_noise.view(-1)[:3] = torch.tensor([-1.0, 0.0, 1e-9])  # clamped at 1e-7
    with torch.no_grad():
        a, p = layer.dynamics(torch.float64)
    kappa = layer.lambda_log.detach().exp().clamp_min(1e-8)
    dt = F.softplus(layer.delta.detach()) + 1e-7
    pn = layer.process_noise.detach().clamp_min(1e-7)
    a_ref = torch.exp(-kappa * dt)
    p_ref = (
        pn / (2 * kappa) * (-torch.expm1(-2 * kappa * dt)) if discretization == "ou" else pn * dt
    )
    big = layer.lambda_log.detach().exp() >= 1e-8
    assert 0 < int(big.sum()) < big.numel()
    assert_close(a[big], a_ref[big], "truth", torch.float64, what="decay")
    assert_close(p[big], p_ref[big], "truth", torch.float64, what="process_var")
    bound = float((1e-8 * dt[~big]).max()) * 1.01
    assert float(((a - a_ref) / a_ref)[~big].abs().max()) <= bound
    assert float(((p - p_ref) / p_ref)[~big].abs().max()) <= bound
    # float32 cannot tell the two apart
    assert torch.equal(a[~big].float(), a_ref[~big].float())


def test_initialization():
    torch.manual_seed(9)
    layer = KLALayer(64, KLAConfig())
    M, S = 128, 16
    assert layer.d_inner == M and layer.d_state == S
    dt = F.softplus(layer.delta.detach())
    ulps = tolerance("identical", torch.float32)  # the range's ends, rounded to float32
    assert float(dt.min()) >= 1e-3 * (1 - ulps) and float(dt.max()) <= 0.1 * (1 + ulps)
    # log-uniform: the median of log dt sits mid-way between log 1e-3 and log 0.1
    assert abs(float(dt.log().median()) - math.log(1e-2)) < 0.2
    assert float(layer.lambda_log.abs().max()) == 0.0
    assert torch.all(layer.process_noise == 0.01)
    assert float(layer.lambda_skip) == -1.0
    for lin in (layer.in_proj, layer.sensor_proj, layer.out_proj):
        assert abs(float(lin.weight.std()) - 0.02) < 0.002
    assert float(layer.conv.bias.abs().max()) == 0.0


def test_parameter_layout():
    layer = KLALayer(24, KLAConfig(d_state=8))
    M, S, D = 48, 8, 24
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        "in_proj.weight": (2 * M, D),
        "conv.weight": (M, 1, 4),
        "conv.bias": (M,),
        "sensor_proj.weight": (2 * M + 2 * S, M),
        "delta": (M, S),
        "lambda_log": (M, S),
        "process_noise": (M, S),
        "lambda_skip": (),
        "out_proj.weight": (D, M),
    }


def test_sensor_row_order():
    """in_proj rows are (z, gate); sensor_proj rows are (v, log var_v, k, q)."""
    layer = make_layer(8, 2, torch.float64, seed=10)
    M, S = layer.d_inner, layer.d_state
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    sens, _ = layer.sensors(x)
    W = layer.in_proj.weight.detach()
    zpre = x @ W[:M].T
    assert torch.allclose(sens.gate, x @ W[M:].T)
    conv = F.conv1d(
        F.pad(zpre.transpose(1, 2), (3, 0)), layer.conv.weight, layer.conv.bias, groups=M
    )
    z = F.silu(conv.transpose(1, 2))
    assert torch.allclose(sens.z, z)
    raw = z @ layer.sensor_proj.weight.detach().T
    assert torch.allclose(sens.v, raw[..., :M])
    assert torch.allclose(sens.obs_prec, 1 / (F.softplus(raw[..., M : 2 * M]) + 1e-4))
    assert torch.allclose(
        sens.k, raw[..., 2 * M : 2 * M + S] / raw[..., 2 * M : 2 * M + S].norm(dim=-1, keepdim=True)
    )
    assert torch.allclose(
        sens.q, raw[..., 2 * M + S :] / raw[..., 2 * M + S :].norm(dim=-1, keepdim=True)
    )


def test_bfloat16_autocast_runs_filter_in_float32():
    layer = make_layer(16, 4, torch.float32, seed=11)
    x = torch.randn(2, 9, 16)
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, out_var, state = layer(x, return_variance=True, return_state=True)
    assert state.lam.dtype == torch.float32
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(out_var).all())
    assert rel(out.float(), ref) < 0.1


def test_bad_arguments():
    layer = KLALayer(8, KLAConfig(d_state=2))
    with pytest.raises(ValueError, match="x: expected shape"):
        layer(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="x: expected shape"):
        layer(torch.randn(5, 8))
    with pytest.raises(TypeError, match="x: expected a floating dtype"):
        layer(torch.ones(1, 2, 8, dtype=torch.int64))
    with pytest.raises(TypeError, match="state: expected a KLALayerState"):
        layer(torch.randn(1, 1, 8), state=(1, 2, 3))
    with pytest.raises(ValueError, match="d_model"):
        KLALayer(0)
    with pytest.raises(TypeError, match="config"):
        KLALayer(8, {"d_state": 4})
    for bad in (
        dict(d_state=0),
        dict(expand=-1.0),
        dict(discretization="euler"),
        dict(gate_activation="tanh"),
        dict(dt_min=0.2, dt_max=0.1),
        dict(obs_var_min=0.0),
    ):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
            KLAConfig(**bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    layer = make_layer(16, 4, torch.float32, seed=12)
    x = torch.randn(2, 63, 16)
    out, out_var = layer(x, return_variance=True)
    gout, gvar = layer.cuda()(x.cuda(), return_variance=True)
    tol = tolerance("kernel", "float32")
    assert rel(gout.cpu(), out) <= tol and rel(gvar.cpu(), out_var) <= tol


def test_docstring_examples_run():
    import doctest

    import kalmanscan.kla._inspect
    import kalmanscan.kla.config
    import kalmanscan.kla.inspect_record
    import kalmanscan.kla.io
    import kalmanscan.kla.layer
    import kalmanscan.kla.model
    import kalmanscan.kla.plot

    mods = (
        kalmanscan.kla,
        kalmanscan.kla.config,
        kalmanscan.kla.io,
        kalmanscan.kla.layer,
        kalmanscan.kla.model,
        kalmanscan.kla._inspect,
        kalmanscan.kla.inspect_record,
        kalmanscan.kla.plot,
    )
    import matplotlib

    matplotlib.use("Agg")
    for mod in mods:
        res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
        assert res.failed == 0 and res.attempted > 0, mod.__name__


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("L", [1, 63, 1000], ids=["L1", "L63", "L1000"])
def test_cuda_decode_equals_full_pass(L):
    layer = make_layer(16, 4, torch.float32, seed=13).cuda()
    x = torch.randn(2, L, 16, device="cuda")
    with torch.no_grad():
        full, full_var = layer(x, return_variance=True)  # "auto": the fused kernel on CUDA
        state = layer.init_state(2)
        outs, vars_ = [], []
        for t in range(L):
            o, v, state = layer(x[:, t : t + 1], state, return_variance=True)
            outs.append(o)
            vars_.append(v)
    assert rel(torch.cat(outs, 1), full) <= DECODE_TOL[torch.float32]
    assert rel(torch.cat(vars_, 1), full_var) <= DECODE_TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_gradients_match_torch_backend():
    grads = {}
    for backend in ("auto", "torch"):
        layer = make_layer(16, 4, torch.float32, seed=14, backend=backend).cuda()
        x = torch.randn(2, 63, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        out, out_var = layer(x, return_variance=True)
        (out.square().sum() + out_var.sum()).backward()
        grads[backend] = {n: p.grad.clone() for n, p in layer.named_parameters()}
    for name, g in grads["torch"].items():
        assert rel(grads["auto"][name], g) <= tolerance("kernel_grad", "float32"), name
