"""A decoder-only language model whose blocks mix with KLA or causal softmax attention.

Layout (the authors' ``SequenceModel`` state-dict names)::

    embedding.weight                      [V, D]
    blocks.{i}.mixer_norm.weight          [D]        RMSNorm, eps 1e-5
    blocks.{i}.mixer.*                    KLALayer or CausalSelfAttention
    blocks.{i}.mlp_norm.weight            [D]
    blocks.{i}.mlp.w12.weight             [2H, D]    SwiGLU gate rows, then up rows; H = int(8*D/3)
    blocks.{i}.mlp.w3.weight              [D, H]
    norm_f.weight                         [D]
    lm_head.weight                        [V, D]

Each block is ``x += mixer(mixer_norm(x)); x += mlp(mlp_norm(x))``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kalmanscan.core import _args
from kalmanscan.kla.config import AttentionConfig, ModelConfig
from kalmanscan.kla.layer import _FUSE_MODES, KLALayer, _init_skipped, _triton_available

_FUSABLE = (torch.float32, torch.bfloat16, torch.float16)


# The rows (tokens) a call from which ``fused = "auto"`` takes the shared layers' Triton kernels.
# Each fused call costs host time (an autograd Function in Python: on the H200 machines' hosts
# RMSNorm's forward + backward 317 against 138 us for torch's, 713 against 336 on a slower one)
# and saves device time in proportion to its rows (RMSNorm about 6 ns an element, SwiGLU 5 ns an
# element of its input projection). In the d_model 512 LM's training step
# (benchmarks/results/lm-step-shared-fused-ab-h200.json) at 16,384 tokens a call both models'
# steps waited on their host and lost 7-16 ms of wall time with the fused layers; at 32,768 the
# attention step gained about 3.5 ms and the KLA step was even; their kernels fell 2.1 ms a step
# at 16,384 tokens and 3.4-4.1 ms at 32,768.
FUSED_MIN_ROWS = 32768


def _fused_call(mode: str, x: torch.Tensor, min_rows: int) -> bool:
    """Whether a module whose ``fused`` and ``fused_min_rows`` attributes are ``mode`` and
    ``min_rows`` runs its Triton kernels on ``x`` (``[..., D]``: its rows are its elements over
    ``D``): ``"fused"`` always, ``"auto"`` on CUDA with triton installed for at least
    ``min_rows`` rows, ``"eager"`` never; never for other dtypes than float32/bfloat16/float16
    or under ``torch.compile`` / ``torch.jit`` tracing. Either attribute out of its range: a
    ValueError."""
    if mode not in _FUSE_MODES:
        raise ValueError(f"fused: expected one of {_FUSE_MODES}, got {mode!r}")
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 0:
        raise ValueError(f"fused_min_rows: expected an int >= 0, got {min_rows!r}")
    if (
        mode == "eager"
        or x.dtype not in _FUSABLE
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
    ):
        return False
    if mode == "fused":
        return True
    return x.is_cuda and x.numel() >= min_rows * x.shape[-1] and _triton_available()


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis (computed in float32), ``weight [D]``.

    >>> RMSNorm(4)(torch.ones(2, 4)).tolist()[0]  # doctest: +ELLIPSIS
    [0.99999..., 0.99999..., 0.99999..., 0.99999...]

    ``fused`` (a class attribute, settable per instance): ``"auto"`` (the default) runs the
    fused Triton kernels (``kalmanscan.cuda.rmsnorm``: one kernel forward, one backward that
    reads ``x`` and the output's gradient once for both gradients) on CUDA when triton is
    installed, for calls of at least ``fused_min_rows`` rows (tokens; :data:`FUSED_MIN_ROWS`,
    32,768), float32, bfloat16 and float16 inputs and weights, outside ``torch.compile`` and
    ``torch.jit`` tracing; ``"fused"`` the same on any device and at any size (the CPU through
    ``TRITON_INTERPRET=1``); ``"eager"`` always PyTorch (``F.rms_norm`` where the input's
    dtype is the weight's, else its ops in float32). float64 always takes PyTorch. Both give
    the same results to float32 rounding. The fused pair takes half torch's device time but
    about twice its host time a call (figures: :data:`FUSED_MIN_ROWS`): below the row count
    a step that waits on its host loses more than the GPU saves. Set ``fused_min_rows = 0``
    where the GPU is the bound at every size (wide models, a fast host).
    """

    fused = "auto"
    fused_min_rows = FUSED_MIN_ROWS

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _use_fused(self, x: torch.Tensor) -> bool:
        """Whether this call takes the fused kernels (see the class docstring's ``fused``)."""
        return _fused_call(self.fused, x, self.fused_min_rows) and self.weight.dtype in _FUSABLE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._use_fused(x):
            from kalmanscan.cuda.rmsnorm import rms_norm

            return rms_norm(x, self.weight, self.eps)
        if x.dtype == self.weight.dtype and x.dtype in (torch.float32, torch.float64):
            # the same formula in one kernel a direction on CUDA (torch's fused RMSNorm; the
            # ops below are 7 kernels forward and 14 backward over [B, L, D]: 0.76 against 0.21
            # ms at 8 x 2048 x 512 on the H200); on the CPU bit-identical to them
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(wide)
        xf = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + self.eps)
        return (xf * self.weight.to(wide)).to(x.dtype)


GEMM_ALIGN = 8  # elements: 16 bytes of bfloat16/float16, what cuBLAS's fast GEMM kernels need


class SwiGLU(nn.Module):
    """SwiGLU channel mixer ``w3(silu(gate) * up)`` with ``(gate, up) = w12(x)``.

    Hidden width ``H = int(2 * int(ratio * D) / 3)`` (``int(2*4*D/3)`` at the default ratio 4).

    ``pad`` (a class attribute, settable per instance): where ``H`` is not a multiple of
    :data:`GEMM_ALIGN` (1365 at ``D = 512``), ``"auto"`` pads it with zeros to one on CUDA,
    ``"always"`` on any device, ``"never"`` not at all. The weights are padded inside the call
    (gate and up rows of ``w12``, columns of ``w3``; the parameters and state dict keep the
    authors' shapes) and the padded channels are exactly 0, so the results are the same to
    float32 rounding (the GEMMs' sums get zero terms) and the padding's gradient is dropped.
    Unpadded, every activation ``[N, H]`` and ``[N, 2H]`` has a leading dimension that is not
    a multiple of 8 and the ``up`` half starts 2 bytes off a 16-byte boundary, so cuBLAS runs
    the MLP's six GEMMs of a training step with its 1- and 2-element-aligned kernels: about 7 ms
    of a 6-layer d_model 512 model's step on 8 x 2048 tokens (H200). Padding costs two
    weight-sized copies a call.

    ``fused`` (a class attribute, settable per instance): ``"auto"`` (the default) computes
    ``silu(gate) * up`` and its gradient with the fused Triton kernels
    (:func:`kalmanscan.cuda.swiglu.swiglu`: one kernel forward, one backward that writes both
    halves' gradients in place of autograd's ``silu``, product, ``silu_backward`` and
    concatenation) on CUDA when triton is installed, for calls of at least ``fused_min_rows``
    rows (tokens; :data:`FUSED_MIN_ROWS`, 32,768), float32, bfloat16 and float16 activations,
    outside ``torch.compile`` and ``torch.jit`` tracing; ``"fused"`` the same on any device and
    at any size (the CPU through ``TRITON_INTERPRET=1``); ``"eager"`` always the PyTorch ops.
    float64 always takes PyTorch. The kernels round where torch's ops do: in bfloat16 and
    float16 the two paths agree bit for bit but where the exponential rounds differently (a
    unit in the last place of ``silu(gate)``), in float32 to its rounding. The fused pair takes
    a third of the eager ops' device time but more host time a call: below the row count a
    step that waits on its host loses more than the GPU saves (:data:`FUSED_MIN_ROWS`). Set
    ``fused_min_rows = 0`` where the GPU is the bound at every size.

    >>> mlp = SwiGLU(16)
    >>> mlp.fused = "eager"
    >>> tuple(mlp(torch.randn(2, 5, 16)).shape)
    (2, 5, 16)
    """

    pad = "auto"
    fused = "auto"
    fused_min_rows = FUSED_MIN_ROWS

    def __init__(self, dim: int, ratio: float = 4.0):
        super().__init__()
        hidden = int(2 * int(dim * ratio) / 3)
        self.hidden = hidden
        self.w12 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w3 = nn.Linear(hidden, dim, bias=False)

    def _padded_width(self, x: torch.Tensor) -> int:
        """The hidden width the call computes with: ``H`` or ``H`` rounded up to GEMM_ALIGN."""
        mode = self.pad
        if mode not in ("auto", "always", "never"):
            raise ValueError(f"pad: expected 'auto', 'always' or 'never', got {mode!r}")
        H = self.hidden
        if H % GEMM_ALIGN == 0 or mode == "never" or (mode == "auto" and not x.is_cuda):
            return H
        return -(-H // GEMM_ALIGN) * GEMM_ALIGN

    def _use_fused(self, h: torch.Tensor) -> bool:
        """Whether this call's activation takes the fused kernels (see the class docstring's
        ``fused``); ``h`` is the input projection."""
        return _fused_call(self.fused, h, self.fused_min_rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, Hp = self.hidden, self._padded_width(x)
        w12, w3 = self.w12.weight, self.w3.weight
        if Hp != H:  # zero gate and up rows (silu(0) * 0 = 0), zero columns of w3
            w12 = F.pad(w12.reshape(2, H, -1), (0, 0, 0, Hp - H)).reshape(2 * Hp, -1)
            w3 = F.pad(w3, (0, Hp - H))
        h = F.linear(x, w12)
        if self._use_fused(h):
            from kalmanscan.cuda.swiglu import swiglu

            return F.linear(swiglu(h), w3)
        gate, up = h.chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w3)


class AttentionState(NamedTuple):
    """Key/value cache of one attention layer, each ``[B, heads, T, head_dim]``."""

    k: torch.Tensor
    v: torch.Tensor


def _rotate(x: torch.Tensor, offset: int, base: float) -> torch.Tensor:
    # Rotary position embedding (half-split convention) for positions offset .. offset+L-1.
    L, hd = x.shape[-2], x.shape[-1]
    half = hd // 2
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = base ** (-torch.arange(half, device=x.device, dtype=wide) / half)
    pos = torch.arange(offset, offset + L, device=x.device, dtype=wide)
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rot = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rot, x[..., 2 * half :]), dim=-1)


class CausalSelfAttention(nn.Module):
    """Causal multi-head softmax attention with rotary positions, ``[B,L,D] -> [B,L,D]``.

    Parameters ``qkv.weight [3D, D]`` and ``out_proj.weight [D, D]``. Same calling convention as
    :class:`KLALayer` (``state`` is a key/value cache that grows with the sequence).

    >>> attn = CausalSelfAttention(16, AttentionConfig(n_heads=2))
    >>> tuple(attn(torch.randn(1, 5, 16)).shape)
    (1, 5, 16)
    """

    def __init__(self, d_model: int, config: AttentionConfig | None = None):
        super().__init__()
        config = AttentionConfig() if config is None else config
        if d_model % config.n_heads:
            raise ValueError(
                f"config.n_heads: expected a divisor of d_model={d_model}, got {config.n_heads}"
            )
        self.config = config
        self.d_model = d_model
        self.n_heads = config.n_heads
        self.head_dim = d_model // config.n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        if not _init_skipped():
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.normal_(self.qkv.weight, std=0.02)
        nn.init.normal_(self.out_proj.weight, std=0.02)

    def init_state(self, batch: int, device=None, dtype=None) -> AttentionState:
        device = self.qkv.weight.device if device is None else _args.check_device("device", device)
        dtype = self.qkv.weight.dtype if dtype is None else dtype
        empty = torch.zeros(batch, self.n_heads, 0, self.head_dim, device=device, dtype=dtype)
        return AttentionState(empty, empty.clone())

    def forward(self, x, state=None, *, return_variance=False, return_state=False):
        if return_variance:
            raise ValueError(
                "return_variance: softmax attention has no output variance; use a KLA mixer"
            )
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        offset = 0 if state is None else state.k.shape[2]
        q = _rotate(q, offset, self.config.rope_base)
        k = _rotate(k, offset, self.config.rope_base)
        if state is not None:
            k = torch.cat((state.k.to(k.dtype), k), dim=2)
            v = torch.cat((state.v.to(v.dtype), v), dim=2)
        if offset == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            qpos = torch.arange(offset, offset + L, device=x.device)
            mask = torch.arange(offset + L, device=x.device)[None, :] <= qpos[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = self.out_proj(y.transpose(1, 2).reshape(B, L, D))
        if return_state or state is not None:
            return out, AttentionState(k, v)
        return out


class Block(nn.Module):
    """Pre-norm residual block: ``x += mixer(mixer_norm(x)); x += mlp(mlp_norm(x))``."""

    def __init__(self, d_model: int, mixer: str, config: ModelConfig):
        super().__init__()
        self.mixer_kind = mixer
        self.mixer_norm = RMSNorm(d_model, config.norm_eps)
        if mixer == "kla":
            self.mixer = KLALayer(d_model, config.kla)
        else:
            self.mixer = CausalSelfAttention(d_model, config.attention)
        self.mlp_norm = RMSNorm(d_model, config.norm_eps)
        self.mlp = SwiGLU(d_model, config.mlp_ratio)

    def forward(self, x, state=None, trace: list | None = None):
        """``x [B,L,D]`` -> ``(x, new_state)``; with ``trace`` (a list) a KLA mixer appends its
        :class:`~kalmanscan.kla.layer.KLATrace` and its output is taken from the trace."""
        h = self.mixer_norm(x)
        if trace is not None and self.mixer_kind == "kla":
            tr = self.mixer.trace(h, state)
            trace.append(tr)
            mixed, new_state = tr.out, tr.state
        else:
            mixed, new_state = self.mixer(h, state, return_state=True)
        x = x + mixed
        return x + self.mlp(self.mlp_norm(x)), new_state


class KLALanguageModel(nn.Module):
    """Decoder-only LM over token ids: embedding, pre-norm blocks (KLA or attention), LM head.

    ``forward(tokens [B,L]) -> logits [B,L,V]``; with ``state`` (from :meth:`init_state`) or
    ``return_state=True`` it also returns the per-block states, so a prompt can be processed in
    chunks and then decoded one token at a time (O(1) per token in KLA blocks).

    >>> from kalmanscan.kla import KLAConfig, ModelConfig
    >>> _ = torch.manual_seed(0)
    >>> cfg = ModelConfig(d_model=32, n_layers=2, kla=KLAConfig(d_state=4))
    >>> model = KLALanguageModel(cfg)
    >>> tuple(model(torch.randint(0, 256, (2, 9))).shape)
    (2, 9, 256)
    """

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = ModelConfig() if config is None else config
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config: expected a ModelConfig, got {type(config).__name__}")
        self.config = config
        D = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, D)
        self.blocks = nn.ModuleList(Block(D, m, config) for m in config.mixer_list())
        self.norm_f = RMSNorm(D, config.norm_eps)
        self.lm_head = nn.Linear(D, config.vocab_size, bias=False)
        if not _init_skipped():  # see kalmanscan.kla.layer._skip_init
            with torch.no_grad():
                nn.init.normal_(self.embedding.weight, std=0.02)
                nn.init.normal_(self.lm_head.weight, std=0.02)
                for blk in self.blocks:
                    nn.init.normal_(blk.mlp.w12.weight, std=0.02)
                    nn.init.normal_(blk.mlp.w3.weight, std=0.02)

    @property
    def kla_blocks(self) -> list[int]:
        """Indices of the blocks whose mixer is KLA."""
        return [i for i, m in enumerate(self.config.mixer_list()) if m == "kla"]

    def init_state(self, batch: int, device=None, dtype=None) -> list:
        """Fresh per-block states for ``batch`` sequences (a list, one per block: a
        :class:`~kalmanscan.kla.KLALayerState` for a KLA block, a key/value cache for attention).

        >>> from kalmanscan.kla import KLAConfig, ModelConfig
        >>> model = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=2)))
        >>> [type(s).__name__ for s in model.init_state(1)]
        ['KLALayerState', 'KLALayerState']
        """
        return [blk.mixer.init_state(batch, device=device, dtype=dtype) for blk in self.blocks]

    def _check_tokens(self, tokens) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                "tokens: expected an integer torch.Tensor [B, L], got "
                f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')}"
            )
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(
                f"tokens: expected shape [B, L] with B >= 1 and L >= 1, got {tuple(tokens.shape)}"
            )
        # ids on the CPU are checked here (no device to wait for); on an accelerator the
        # embedding's own bounds check fails the call, and a check here would synchronize it
        if tokens.device.type == "cpu" and tokens.numel() and not torch.compiler.is_compiling():
            lo, hi = torch.aminmax(tokens)
            V = self.config.vocab_size
            if int(lo) < 0 or int(hi) >= V:
                raise ValueError(
                    f"tokens: expected ids in [0, {V}) (vocab_size), got range [{int(lo)}, "
                    f"{int(hi)}]"
                )

    def forward(self, tokens, state=None, *, return_state=False, trace: dict | None = None):
        """``tokens [B,L]`` -> ``logits [B,L,V]`` (and new states with ``state``/``return_state``).

        ``trace``: an optional dict ``{block index: list}``; the KLA blocks named there append
        their :class:`~kalmanscan.kla.layer.KLATrace` (used by :func:`kalmanscan.kla.inspect`).

        >>> from kalmanscan.kla import KLAConfig, ModelConfig
        >>> _ = torch.manual_seed(0)
        >>> model = KLALanguageModel(ModelConfig(d_model=16, n_layers=2, kla=KLAConfig(d_state=2)))
        >>> tokens = torch.tensor([[104, 105, 33]])
        >>> logits, state = model(tokens[:, :2], return_state=True)  # prefill
        >>> last, state = model(tokens[:, 2:], state)  # one decoding step
        >>> tuple(logits.shape), bool(torch.allclose(last, model(tokens)[:, 2:], atol=1e-5))
        ((1, 2, 256), True)
        """
        self._check_tokens(tokens)
        if state is not None and len(state) != len(self.blocks):
            raise ValueError(
                f"state: expected {len(self.blocks)} per-block states, got {len(state)}"
            )
        x = self.embedding(tokens)
        new_states = []
        for i, blk in enumerate(self.blocks):
            x, s = blk(
                x, None if state is None else state[i], None if trace is None else trace.get(i)
            )
            new_states.append(s)
        logits = self.lm_head(self.norm_f(x))
        if return_state or state is not None:
            return logits, new_states
        return logits

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``tokens [B,L]`` by ``max_new_tokens``; returns ``[B, L + max_new_tokens]``.

        The prompt is processed at once, then each new token costs one O(1) step per KLA block
        (attention blocks use their key/value cache). ``temperature=0`` is greedy; a temperature
        so small that ``logits / temperature`` overflows (1e-45 in float32) samples from the
        same softmax computed stably, which is greedy up to ties.

        >>> from kalmanscan.kla import KLAConfig, ModelConfig
        >>> model = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
        >>> tuple(model.generate(torch.tensor([[1, 2, 3]]), 4, temperature=0).shape)
        (1, 7)
        """
        self._check_tokens(tokens)
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, int)
            or max_new_tokens < 0
        ):
            raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not 0 <= temperature < math.inf
        ):
            raise ValueError(f"temperature: expected a finite number >= 0, got {temperature!r}")
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise ValueError(f"top_k: expected None or an int >= 1, got {top_k!r}")
        out = [tokens]
        if max_new_tokens == 0:
            return tokens
        logits, state = self(tokens, return_state=True)
        for step in range(max_new_tokens):
            nxt = self._sample(logits[:, -1].float(), temperature, top_k, generator)
            out.append(nxt)
            if step + 1 < max_new_tokens:
                logits, state = self(nxt, state)
        return torch.cat(out, dim=1)

    @staticmethod
    def _sample(logits, temperature, top_k, generator):
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        scaled = logits / temperature
        if not bool(torch.isfinite(scaled).all()):
            # a tiny temperature overflows logits / temperature (or rounds it to zero in
            # float32): scale the differences to each row's maximum in float64 instead,
            # 0 at the maximum and <= 0 elsewhere, so the softmax is defined and tends to the
            # greedy choice (ties sampled evenly) as the temperature goes to 0
            shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)
            scaled = (shifted / float(temperature)).nan_to_num(nan=float("-inf"))
        if top_k is not None:
            kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)

    def num_parameters(self) -> int:
        """Number of parameters."""
        return sum(p.numel() for p in self.parameters())
