"""The Kalman Linear Attention layer: parameters and projections around the KLA filter op.

Shapes: batch ``B``, time ``L``, model width ``D``, channels ``M = int(expand * D)``, state slots
``S = d_state``. The block (SPEC.md §3)::

    x [B,L,D] -> in_proj -> (z, gate) [B,L,M]
    z -> causal depthwise conv (width 4) -> SiLU                          (also the skip input)
    z -> sensor_proj -> (v, log var_v [B,L,M], k, q [B,L,S]); k, q L2-normalised per token
    Lv = 1 / (softplus(log var_v) + obs_var_min)
    (y, yvar) = kla_filter(v, Lv, k, q, decay, process_var)                (kalmanscan.core.kla_op)
    y += lambda_skip * z;  y *= act(gate);  yvar *= act(gate)**2
    out = out_proj(y);  out_var = yvar @ (W_out**2)^T                     (model-space variance)

``decay, process_var [M,S]`` come from :func:`kalmanscan.discretize_ou` with rate
``exp(lambda_log)``, diffusion ``max(process_noise, 1e-7)`` (``process_noise + 1e-12`` in the
zero-process-noise variant) and step ``softplus(delta) + 1e-7``; without autograd on the CPU
they are kept between calls until a parameter's values change (decoding does not recompute them
per token).
The parameter names and shapes are those of the authors' published implementation, so its state
dicts load with ``strict=True``. The filter math lives in the op; this module only holds
parameters and projects. Details and derivations: docs/kla.md.

Glue: on CUDA, with triton installed, a call without an incoming ``state`` runs the
elementwise work around the op (conv + SiLU, the sensor split with softplus and qk-norm, gate
and skip, and the ``[M,S]`` discretization when it needs a gradient) as fused Triton kernels
with exact backward (``kalmanscan.cuda.kla.glue``);
float64, calls with a state, :meth:`KLALayer.trace` and ``torch.compile`` (whose compiler fuses
these itself) take the eager PyTorch path, which is the reference the fused one is tested
against (``KLALayer.glue``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import threading
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from kalmanscan.core import _args
from kalmanscan.core.discretize import ou_transition
from kalmanscan.cuda import interpreting
from kalmanscan.kla.config import KLAConfig

_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}

# Floors taken from the published layer (process-noise rate and step) and qk-norm.
PROCESS_NOISE_MIN = 1e-7
ZERO_PROCESS_NOISE = 1e-12  # added (not a floor) in the zero-process-noise variant
DT_OFFSET = 1e-7
L2_EPS = 1e-12


class KLALayerState(NamedTuple):
    """Recurrent state of one layer: the conv window and the filter's information state.

    ``conv [B,M,K-1]`` holds the last ``K-1`` pre-conv inputs; ``lam, eta [B,M,S]`` are the
    posterior precision and information vector after the last token. Made by
    :meth:`KLALayer.init_state`, returned by a call with a ``state`` or ``return_state=True``.

    >>> layer = KLALayer(16, KLAConfig(d_state=4))  # M = 32 channels, K = 4
    >>> s = layer.init_state(2)
    >>> tuple(s.conv.shape), tuple(s.lam.shape), float(s.lam.min()), float(s.eta.abs().max())
    ((2, 32, 3), (2, 32, 4), 1.0, 0.0)
    """

    conv: torch.Tensor
    lam: torch.Tensor
    eta: torch.Tensor


class KLASensors(NamedTuple):
    """What the filter observes for each token (all ``[B,L,·]``, filter dtype except z/gate).

    ``z`` is the post-conv activation (skip input), ``gate`` the pre-activation gate,
    ``v`` the value, ``obs_prec`` the value precision ``Lv``, ``k``/``q`` key and query.
    """

    z: torch.Tensor
    gate: torch.Tensor
    v: torch.Tensor
    obs_prec: torch.Tensor
    k: torch.Tensor
    q: torch.Tensor


class KLATrace(NamedTuple):
    """Everything one layer computed for a chunk of tokens (see :meth:`KLALayer.trace`).

    ``out [B,L,D]``, ``out_var [B,L,D]``, ``state`` the new :class:`KLALayerState`,
    ``sensors`` the :class:`KLASensors`, ``decay, process_var [M,S]``,
    ``precision [B,L,M,S]`` the posterior precision per token, ``yvar [B,L,M]`` the readout
    variance before the gate, ``gate_act [B,L,M]`` the activated gate.

    >>> layer = KLALayer(16, KLAConfig(d_state=4))
    >>> tr = layer.trace(torch.randn(1, 5, 16))
    >>> tuple(tr.out.shape), tuple(tr.precision.shape), tuple(tr.decay.shape)
    ((1, 5, 16), (1, 5, 32, 4), (32, 4))
    """

    out: torch.Tensor
    out_var: torch.Tensor
    state: KLALayerState
    sensors: KLASensors
    decay: torch.Tensor
    process_var: torch.Tensor
    precision: torch.Tensor
    yvar: torch.Tensor
    gate_act: torch.Tensor


_SKIP_INIT = threading.local()  # .depth > 0 inside _skip_init() on this thread


def _init_skipped() -> bool:
    """Whether modules built now (on this thread) leave out their random init: see
    :func:`_skip_init`."""
    return getattr(_SKIP_INIT, "depth", 0) > 0


class _NoTorchInit(TorchFunctionMode):
    """Each ``torch.nn.init`` call (those of ``nn.Linear`` and ``nn.Embedding``) returns its
    tensor untouched; every other call runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _skip_init():
    """Build modules without their random init: inside, on this thread, the KLA modules do not
    call ``reset_parameters`` and ``torch.nn.init`` calls do nothing, so every parameter keeps
    the values it was allocated with (none on the meta device, uninitialised memory elsewhere).
    For a model whose every tensor is read from a checkpoint next: on the meta device torch's
    random fills (``normal_``, ``torch.rand``) run through ``torch._refs``, whose first call in
    a process imports ``torch._dynamo`` and sympy (about 1.5 s of CPU); the init would also
    draw from torch's global generator.

    >>> with torch.device("meta"), _skip_init():
    ...     layer = KLALayer(16, KLAConfig(d_state=2))
    >>> layer.delta.device.type
    'meta'
    """
    _SKIP_INIT.depth = getattr(_SKIP_INIT, "depth", 0) + 1
    try:
        with _NoTorchInit():
            yield
    finally:
        _SKIP_INIT.depth -= 1


class CausalConv1d(nn.Module):
    """Depthwise causal convolution over time, ``[B,L,M] -> [B,L,M]``, with a carried window.

    Parameters ``weight [M,1,K]`` and ``bias [M]`` (the layout of ``nn.Conv1d(groups=M)``).

    >>> conv = CausalConv1d(8, 4)
    >>> y, window = conv(torch.randn(2, 5, 8))
    >>> tuple(y.shape), tuple(window.shape)
    ((2, 5, 8), (2, 8, 3))
    """

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.channels = channels
        self.kernel = kernel
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))
        self.bias = nn.Parameter(torch.empty(channels))
        if not _init_skipped():
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # nn.Conv1d's default: uniform in +-1/sqrt(fan_in); zero bias.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, window: torch.Tensor | None = None):
        """``x [B,L,M]``, optional ``window [B,M,K-1]`` -> ``(conv(x) [B,L,M], new window)``."""
        xt = x.transpose(1, 2)
        if window is None:
            window = xt.new_zeros(xt.shape[0], self.channels, self.kernel - 1)
        padded = torch.cat((window.to(xt.dtype), xt), dim=-1)
        # y[t] = bias + sum_j w[j] x[t - K + 1 + j]. F.conv1d(groups=M) beat K shifted
        # multiply-adds on the 2-core CPU at M = 512 (1 thread: 0.08 vs 0.28 ms at L = 1,
        # 5.2 vs 13.4 ms at L = 1024), and needs no temporaries.
        y = F.conv1d(padded, self.weight.to(xt.dtype), self.bias.to(xt.dtype), groups=self.channels)
        return y.transpose(1, 2), padded[..., padded.shape[-1] - (self.kernel - 1) :]


def _filter_dtype(dtype: torch.dtype) -> torch.dtype:
    # The filter runs in float32 for half-precision activations and passes float64 through.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(L2_EPS)


# the modes of the layers' fused-kernel switches (KLALayer.glue, RMSNorm.fused, SwiGLU.fused)
_FUSE_MODES = ("auto", "fused", "eager")
_TRITON = []  # [bool] once looked up


def _triton_available() -> bool:
    if not _TRITON:
        _TRITON.append(importlib.util.find_spec("triton") is not None)
    return _TRITON[0]


def _check_fused_device(x: torch.Tensor, setting: str) -> None:
    """A ValueError naming ``setting`` where the fused Triton kernels cannot run ``x``: triton
    missing, or ``x`` off CUDA without ``TRITON_INTERPRET=1`` (the message of
    ``kalmanscan.cuda.rmsnorm`` / ``swiglu``'s own check)."""
    if not _triton_available():
        raise ValueError(
            f"{setting}: expected triton installed for the fused kernels, found none "
            "('auto' or 'eager' runs the PyTorch path)"
        )
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"x: expected a CUDA tensor (or TRITON_INTERPRET=1 for the CPU) with {setting}, "
            f"got device {x.device} ('auto' or 'eager' runs the PyTorch path there)"
        )


class KLALayer(nn.Module):
    """Kalman Linear Attention sequence mixer, ``[B,L,D] -> [B,L,D]``.

    Args:
        d_model: model width ``D``.
        config: a :class:`KLAConfig` (defaults: ``d_state=16, expand=2``).

    ``forward(x, state=None, *, return_variance=False, return_state=False)`` returns ``out``,
    ``(out, out_var)`` with ``return_variance``, and the new :class:`KLALayerState` as a last
    element when ``return_state`` or a ``state`` is given. A one-token call with a state costs
    O(1) (it calls ``kla_step``); processing a sequence at once or token by token gives the same
    results.

    >>> _ = torch.manual_seed(0)
    >>> layer = KLALayer(32, KLAConfig(d_state=4))
    >>> out, out_var = layer(torch.randn(2, 7, 32), return_variance=True)
    >>> tuple(out.shape), bool((out_var >= 0).all())
    ((2, 7, 32), True)

    ``glue`` (a class attribute, settable per instance): ``"auto"`` runs the fused Triton glue
    (``kalmanscan.cuda.kla.glue``) on CUDA when triton is installed, for calls without a
    ``state`` in float16/bfloat16/float32 outside ``torch.compile``; ``"fused"`` the same on
    CUDA, and on the CPU when ``TRITON_INTERPRET=1`` is set before triton is imported (Triton's
    interpreter; without it a CPU call is refused with a ValueError saying so); ``"eager"``
    always the PyTorch reference path. Both give the same results to float32 rounding.
    """

    glue = "auto"

    def __init__(self, d_model: int, config: KLAConfig | None = None):
        super().__init__()
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0:
            raise ValueError(f"d_model: expected a positive int, got {d_model!r}")
        config = KLAConfig() if config is None else config
        if not isinstance(config, KLAConfig):
            raise TypeError(f"config: expected a KLAConfig, got {type(config).__name__}")
        self.config = config
        self.d_model = d_model
        self.d_inner = M = config.d_inner(d_model)
        if M < 1:
            raise ValueError(
                f"config.expand: expected int(expand * d_model) >= 1 channels, got expand="
                f"{config.expand} with d_model={d_model} (M = {M})"
            )
        self.d_state = S = config.d_state
        self.in_proj = nn.Linear(d_model, 2 * M, bias=False)  # rows: z, then gate
        self.conv = CausalConv1d(M, config.conv_kernel)
        self.sensor_proj = nn.Linear(M, 2 * M + 2 * S, bias=False)  # rows: v, log var_v, k, q
        self.delta = nn.Parameter(torch.empty(M, S))
        self.lambda_log = nn.Parameter(torch.empty(M, S))
        if config.process_noise_param == "log":
            self.process_noise_log = nn.Parameter(torch.empty(M, S))
        elif config.process_noise_mode == "learned":
            self.process_noise = nn.Parameter(torch.empty(M, S))
        else:  # the authors' fixed / zero variants: a buffer, in the state dict, no gradient
            self.register_buffer("process_noise", torch.empty(M, S))
        self.lambda_skip = nn.Parameter(torch.empty(()))
        self.out_proj = nn.Linear(M, d_model, bias=False)
        self._act = _ACTIVATIONS[config.gate_activation]
        self._dynamics_cache = None  # (key, parameter copies, (decay, process_var)), see _dynamics
        self._recorder = None  # set by kalmanscan.kla.inspect_record.record: receives each KLATrace
        if not _init_skipped():
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Linear weights N(0, 0.02); ``delta`` so that ``softplus(delta)`` is log-uniform in
        ``[dt_min, dt_max]``; ``lambda_log = 0``; ``process_noise = process_noise_init``;
        ``lambda_skip = lambda_skip_init``; conv as ``nn.Conv1d``."""
        cfg = self.config
        for lin in (self.in_proj, self.sensor_proj, self.out_proj):
            nn.init.normal_(lin.weight, std=0.02)
        self.conv.reset_parameters()
        lo, hi = math.log(cfg.dt_min), math.log(cfg.dt_max)
        dt = torch.exp(torch.rand(self.delta.shape) * (hi - lo) + lo).clamp_min(cfg.dt_init_floor)
        self.delta.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.lambda_log.zero_()
        if cfg.process_noise_param == "log":
            self.process_noise_log.fill_(math.log(cfg.process_noise_init))
        else:
            zero = cfg.process_noise_mode == "zero"
            self.process_noise.fill_(0.0 if zero else cfg.process_noise_init)
        self.lambda_skip.fill_(cfg.lambda_skip_init)

    # ------------------------------------------------------------------ state and dynamics

    def init_state(self, batch: int, device=None, dtype=None) -> KLALayerState:
        """Fresh state for ``batch`` sequences: zero conv window, unit precision ``lam = 1``, zero
        information ``eta`` (on the layer's device and dtype unless given).

        >>> layer = KLALayer(16, KLAConfig(d_state=4))
        >>> s = layer.init_state(3)
        >>> tuple(s.lam.shape), s.lam.dtype
        ((3, 32, 4), torch.float32)
        """
        device = (
            self.out_proj.weight.device if device is None else _args.check_device("device", device)
        )
        dtype = self.out_proj.weight.dtype if dtype is None else dtype
        fdtype = _filter_dtype(dtype)
        M, S = self.d_inner, self.d_state
        return KLALayerState(
            conv=torch.zeros(batch, M, self.config.conv_kernel - 1, device=device, dtype=dtype),
            lam=torch.ones(batch, M, S, device=device, dtype=fdtype),
            eta=torch.zeros(batch, M, S, device=device, dtype=fdtype),
        )

    def dynamics(self, dtype: torch.dtype = torch.float32):
        """Discrete ``(decay, process_var)``, each ``[M,S]``, from the continuous parameters."""
        theta = torch.exp(self.lambda_log.to(dtype))
        sigma2 = self.process_noise_rate(dtype)
        dt = F.softplus(self.delta.to(dtype)) + DT_OFFSET
        if self.config.discretization == "ou":
            # discretize_ou's math without its argument checks: the inputs are valid by
            # construction, and a check would synchronize the GPU on every forward
            return ou_transition(theta, sigma2, dt)
        return torch.exp(-theta * dt), sigma2 * dt

    def _process_noise_param(self) -> torch.Tensor:
        if self.config.process_noise_param == "log":
            return self.process_noise_log
        return self.process_noise

    def process_noise_rate(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The diffusion rate ``p [M,S]`` the dynamics use: ``max(process_noise, 1e-7)``,
        ``process_noise + 1e-12`` (zero variant) or ``exp(process_noise_log)``."""
        if self.config.process_noise_param == "log":
            return self.process_noise_log.to(dtype).exp()
        if self.config.process_noise_mode == "zero":
            return self.process_noise.to(dtype) + ZERO_PROCESS_NOISE
        return self.process_noise.to(dtype).clamp_min(PROCESS_NOISE_MIN)

    def process_noise_at_floor(self) -> torch.Tensor:
        """``[M,S]`` bool: lanes whose process noise sits on its floor (no gradient reaches
        it there); all True in the zero variant, none with the log parameterisation."""
        if self.config.process_noise_param == "log":
            return torch.zeros_like(self.process_noise_log, dtype=torch.bool)
        if self.config.process_noise_mode == "zero":
            return torch.ones_like(self.process_noise, dtype=torch.bool)
        return self.process_noise.detach() <= PROCESS_NOISE_MIN

    def _dynamics(self, dtype: torch.dtype):
        """:meth:`dynamics`, kept between calls while nothing needs its gradient.

        Without autograd (decoding, inspection) and with the parameters on the CPU, the
        ``[M,S]`` discretization is computed once and reused while the parameters it reads hold
        the same values: the cache keeps a copy of them and compares it on each call (about a
        tenth of the cost of recomputing), so every in-place edit counts, also one through
        ``.data``, which moves no version counter. Elsewhere it is computed afresh: under
        autograd or ``torch.compile`` the graph needs it, and on an accelerator the comparison
        would wait for the device on every call, where recomputing is a few asynchronous
        kernels."""
        params = (self.lambda_log, self._process_noise_param(), self.delta)
        if (
            torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or params[0].device.type != "cpu"
        ):
            return self.dynamics(dtype)
        key = (
            dtype,
            self.config.discretization,
            self.config.process_noise_mode,
            self.config.process_noise_param,
        )
        cache = self._dynamics_cache
        if (
            cache is not None
            and cache[0] == key
            and all(
                p.dtype == c.dtype and torch.equal(p, c)
                for p, c in zip(params, cache[1], strict=True)
            )
        ):
            return cache[2]
        value = self.dynamics(dtype)
        self._dynamics_cache = (key, tuple(p.detach().clone() for p in params), value)
        return value

    # ------------------------------------------------------------------ projections

    def sensors(self, x: torch.Tensor, conv_window: torch.Tensor | None = None):
        """``x [B,L,D]`` -> ``(KLASensors, new conv window [B,M,K-1])``."""
        M, S = self.d_inner, self.d_state
        z, gate = self.in_proj(x).split(M, dim=-1)
        z, window = self.conv(z, conv_window)
        z = F.silu(z)
        v, log_var, k, q = self.sensor_proj(z).split([M, M, S, S], dim=-1)
        if self.config.qk_norm:
            k, q = _l2_normalize(k), _l2_normalize(q)
        fdtype = _filter_dtype(x.dtype)
        obs_prec = 1.0 / (F.softplus(log_var.to(fdtype)) + self.config.obs_var_min)
        sensors = KLASensors(z, gate, v.to(fdtype), obs_prec, k.to(fdtype), q.to(fdtype))
        return sensors, window

    # ------------------------------------------------------------------ compute

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor [B,L,D], got {type(x).__name__}")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape [B, L, {self.d_model}], got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x: expected a floating dtype, got {x.dtype}")
        want = self.in_proj.weight.dtype
        if x.dtype != want and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"x: expected dtype {want} (that of the layer's parameters; cast the layer with "
                f".to({x.dtype}) or call it under torch.autocast), "
                f"got {x.dtype}"
            )
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"x: expected non-empty B and L in [B, L, D], got {tuple(x.shape)}")

    def _check_state(self, state, B: int) -> None:
        """Shapes always (static: free under torch.compile); values (precision >= 0 and finite,
        information finite) in one readback, skipped while compiling."""
        if not isinstance(state, KLALayerState):
            raise TypeError(f"state: expected a KLALayerState, got {type(state).__name__}")
        M, S, K = self.d_inner, self.d_state, self.conv.kernel
        want = {"conv": (B, M, K - 1), "lam": (B, M, S), "eta": (B, M, S)}
        for name, shape in want.items():
            got = getattr(state, name)
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
                desc = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise ValueError(f"state.{name}: expected shape {shape}, got {desc}")
        if torch.compiler.is_compiling():
            return
        lam, eta = state.lam.detach(), state.eta.detach()
        lam_ok, eta_ok = (torch.isfinite(lam) & (lam >= 0)).all(), torch.isfinite(eta).all()
        if not bool(lam_ok & eta_ok):
            if not bool(lam_ok):
                got = "NaN or inf" if not bool(torch.isfinite(lam).all()) else "negative values"
                raise ValueError(f"state.lam: expected precisions >= 0 and finite, got {got}")
            raise ValueError("state.eta: expected finite values, got NaN or inf")

    def _use_fused(self, x: torch.Tensor, state, return_precision: bool) -> bool:
        """Whether this call takes the fused glue (see the class docstring's ``glue``)."""
        mode = self.glue
        if mode not in _FUSE_MODES:
            raise ValueError(f"glue: expected one of {_FUSE_MODES}, got {mode!r}")
        if (
            mode == "eager"
            or state is not None
            or return_precision
            or x.dtype == torch.float64
            or torch.compiler.is_compiling()
        ):
            return False
        if mode == "fused":
            _check_fused_device(x, "KLALayer.glue = 'fused'")
            return True
        return x.is_cuda and _triton_available()

    def _dynamics_fused(self):
        """:meth:`_dynamics` in float32 for the fused path: where a parameter it reads needs a
        gradient, one kernel each way (``glue.dynamics``) instead of the ops of
        :meth:`dynamics`, which stay the reference and serve calls without autograd (kept)."""
        params = (self.lambda_log, self._process_noise_param(), self.delta)
        if not (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return self._dynamics(torch.float32)
        from kalmanscan.cuda.kla import glue

        cfg = self.config
        kind = (
            "log"
            if cfg.process_noise_param == "log"
            else "zero"
            if cfg.process_noise_mode == "zero"
            else "floor"
        )
        return glue.dynamics(*params, kind, cfg.discretization == "ou")

    def _forward_fused(self, x, need_var):
        """:meth:`_forward` through the fused glue: no incoming state, no precisions."""
        from kalmanscan.core.kla_op import kla_filter
        from kalmanscan.cuda.kla import glue

        M, S, K = self.d_inner, self.d_state, self.conv.kernel
        B, L, _ = x.shape
        zg = self.in_proj(x).contiguous()
        buf = glue.new_grad_buffer()
        zc = glue.conv_silu(zg, self.conv.weight, self.conv.bias, buf)
        s = self.sensor_proj(zc).contiguous()
        v, Lv, k, q = glue.sensors(s, M, S, self.config.obs_var_min, self.config.qk_norm)
        decay, process_var = self._dynamics_fused()
        with torch.autocast(device_type=x.device.type, enabled=False):
            res = kla_filter(
                v, Lv, k, q, decay, process_var, return_variance=need_var,
                backend=self.config.backend, check=False,
            )  # fmt: skip
        act = self.config.gate_activation
        if need_var:
            y, yvar_gated = glue.gate_skip(
                res.y, res.yvar, zg, zc, self.lambda_skip, act, buf, var_dtype=x.dtype
            )
        else:
            y, yvar_gated = (
                glue.gate_skip(res.y, res.yvar, zg, zc, self.lambda_skip, act, buf),
                None,
            )
        out = self.out_proj(y)
        # the conv window after the last token: the last K-1 pre-conv inputs (zero-padded)
        if L >= K - 1:
            window = zg[:, L - (K - 1) :, :M].transpose(1, 2)
        else:
            zt = zg[..., :M].transpose(1, 2)
            window = torch.cat((zt.new_zeros(B, M, K - 1 - L), zt), dim=-1)
        new_state = KLALayerState(window, res.final.lam, res.final.eta)
        return out, yvar_gated, new_state, None, decay, process_var, None, res.yvar, None

    def _forward(self, x, state, return_precision, need_var=True):
        from kalmanscan.core.kla_op import kla_filter, kla_step

        self._check_input(x)
        B, L, _ = x.shape
        if state is not None:
            self._check_state(state, B)
        if self._use_fused(x, state, return_precision):
            return self._forward_fused(x, need_var)
        sens, window = self.sensors(x, None if state is None else state.conv)
        fdtype = sens.v.dtype
        decay, process_var = self._dynamics(fdtype)
        precision = None
        with torch.autocast(device_type=x.device.type, enabled=False):
            if state is not None and L == 1 and not return_precision:
                y, yvar, final = kla_step(
                    sens.v[:, 0],
                    sens.obs_prec[:, 0],
                    sens.k[:, 0],
                    sens.q[:, 0],
                    decay,
                    process_var,
                    state.lam.to(fdtype),
                    state.eta.to(fdtype),
                    check=False,
                )
                y, yvar = y[:, None], yvar[:, None]
            else:
                res = kla_filter(
                    sens.v,
                    sens.obs_prec,
                    sens.k,
                    sens.q,
                    decay,
                    process_var,
                    None if state is None else state.lam.to(fdtype),
                    None if state is None else state.eta.to(fdtype),
                    return_precision=return_precision,
                    backend=self.config.backend,
                    check=False,  # inputs valid by construction; a check syncs the GPU
                )
                y, yvar, final, precision = res.y, res.yvar, res.final, res.precision
        g = self._act(sens.gate)
        y = (y.to(x.dtype) + self.lambda_skip.to(x.dtype) * sens.z) * g
        yvar_gated = yvar.to(x.dtype) * g.square()
        out = self.out_proj(y)
        new_state = KLALayerState(window, final.lam, final.eta)
        return out, yvar_gated, new_state, sens, decay, process_var, precision, yvar, g

    def output_variance(self, yvar_gated: torch.Tensor) -> torch.Tensor:
        """Model-space output variance ``yvar_gated @ (W_out**2)^T`` (channels independent)."""
        return F.linear(yvar_gated, self.out_proj.weight.square())

    def forward(
        self,
        x: torch.Tensor,
        state: KLALayerState | None = None,
        *,
        return_variance: bool = False,
        return_state: bool = False,
    ):
        """``x [B,L,D]`` -> ``out [B,L,D]``; ``(out, out_var)`` with ``return_variance``, and the
        new :class:`KLALayerState` as a last element when ``return_state`` or a ``state`` is
        given (a one-token call with a state is one O(1) decoding step).

        >>> _ = torch.manual_seed(0)
        >>> layer = KLALayer(16, KLAConfig(d_state=4))
        >>> x = torch.randn(1, 6, 16)
        >>> full = layer(x)
        >>> out, state = layer(x[:, :5], return_state=True)  # prefill five tokens
        >>> last, state = layer(x[:, 5:], state)  # then decode one
        >>> bool(torch.allclose(last, full[:, 5:], atol=1e-5))
        True
        """
        recorder = self._recorder
        if recorder is not None:
            tr = self.trace(x, state)
            recorder(self, tr)
            out, new_state = tr.out, tr.state
            result = (out, tr.out_var) if return_variance else (out,)
        else:
            out, yvar_gated, new_state, *_ = self._forward(
                x, state, return_precision=False, need_var=return_variance
            )
            result = (out, self.output_variance(yvar_gated)) if return_variance else (out,)
        if return_state or state is not None:
            result = result + (new_state,)
        return result[0] if len(result) == 1 else result

    def trace(self, x: torch.Tensor, state: KLALayerState | None = None) -> KLATrace:
        """Run the layer and return every intermediate, including the per-token posterior
        precision ``[B,L,M,S]``. ``trace(x).out`` equals ``forward(x)``.

        >>> layer = KLALayer(16, KLAConfig(d_state=4))
        >>> tr = layer.trace(torch.randn(1, 5, 16))
        >>> tuple(tr.precision.shape)
        (1, 5, 32, 4)
        """
        out, yvar_gated, new_state, sens, decay, pvar, precision, yvar, g = self._forward(
            x, state, return_precision=True
        )
        return KLATrace(
            out, self.output_variance(yvar_gated), new_state, sens, decay, pvar, precision, yvar, g
        )
