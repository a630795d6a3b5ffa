"""Models for the expressivity experiments: KLA language models and the two ablated mixers.

- ``"kla"``: :class:`kalmanscan.kla.KLALanguageModel` unchanged (precision-dependent gain).
- ``"kla_p0"``: the same layer with the process noise removed (``process_var = 0``): the prior
  precision only grows, ``lam_pred = lam / a**2`` (the ablation of the paper's App. E.1).
- ``"linear"``: the same block (projections, conv, gate, skip, output) with the filter replaced
  by a linear recurrence with a learned, input-independent decay per lane:
  ``h_t = a * h_{t-1} + k_t v_t``, ``y_t = sum_s q_t[s] h_t[:, s]`` (a gated linear attention
  with a data-independent forget gate). The decay ``a`` is KLA's own ``exp(-theta * dt)``, so the
  only change is that the gain no longer depends on the accumulated precision.
- ``"attention"``: causal softmax attention with rotary positions (the repo's baseline mixer).

``build_model(mixer, vocab_size, ...)`` returns a ``KLALanguageModel`` whose blocks carry the
chosen mixer; the tools of ``kalmanscan.kla`` (``inspect``, plots) work on every KLA variant.
"""

from __future__ import annotations

from typing import NamedTuple

import linear_kernel  # examples/expressivity/ is on sys.path wherever models is imported
import torch

from kalmanscan.kla import KLAConfig, KLALanguageModel, KLALayer, ModelConfig
from kalmanscan.kla.config import AttentionConfig

MIXERS = ("kla", "kla_p0", "linear", "attention")


class KLATraining(KLALayer):
    """:class:`~kalmanscan.kla.KLALayer` as the experiments train it. It once overrode
    ``dynamics`` to skip ``discretize_ou``'s argument checks (each reads a flag back from the
    GPU, which dominated the step time with many processes sharing one GPU); the layer itself now
    calls the unchecked :func:`kalmanscan.core.discretize.ou_transition`, so the class only keeps
    the experiments' model names stable."""


class KLANoProcessNoise(KLATraining):
    """KLA layer with ``process_var = 0`` (the ``process_noise`` parameter is frozen, unused)."""

    def __init__(self, d_model: int, config: KLAConfig | None = None):
        super().__init__(d_model, config)
        self.process_noise.requires_grad_(False)

    def dynamics(self, dtype: torch.dtype = torch.float32):
        decay, process_var = super().dynamics(dtype)
        return decay, torch.zeros_like(process_var)


class LinearState(NamedTuple):
    """State of :class:`LinearRecurrenceLayer`: conv window ``[B,M,K-1]``, ``h [B,M,S]``."""

    conv: torch.Tensor
    h: torch.Tensor


def decayed_cumsum(
    b: torch.Tensor, decay: torch.Tensor, h0: torch.Tensor | None = None
) -> torch.Tensor:
    """``h_t = decay * h_{t-1} + b_t`` along axis 1 by log-depth doubling.

    ``b [B,L,M,S]``, ``decay [M,S]`` (time-invariant), ``h0 [B,M,S]`` or None -> ``h [B,L,M,S]``.

    >>> b = torch.ones(1, 4, 1, 1)
    >>> decayed_cumsum(b, torch.full((1, 1), 0.5))[0, :, 0, 0].tolist()
    [1.0, 1.5, 1.75, 1.875]
    """
    L = b.shape[1]
    h = b
    if h0 is not None:
        h = torch.cat((h0[:, None], h), dim=1)
    power, d = decay, 1
    while d < h.shape[1]:
        h = torch.cat((h[:, :d], h[:, d:] + power * h[:, :-d]), dim=1)
        power, d = power * power, 2 * d
    return h[:, -L:]


class LinearRecurrenceLayer(KLATraining):
    """KLA's block with the filter replaced by ``h_t = a h_{t-1} + k_t v_t``, ``y = q . h``.

    Same parameters as :class:`~kalmanscan.kla.KLALayer` (``log var_v`` and ``process_noise``
    are computed/kept but unused), so widths and state sizes match exactly.
    """

    def __init__(self, d_model: int, config: KLAConfig | None = None):
        super().__init__(d_model, config)
        self.process_noise.requires_grad_(False)

    def init_state(self, batch: int, device=None, dtype=None) -> LinearState:
        base = super().init_state(batch, device=device, dtype=dtype)
        return LinearState(base.conv, torch.zeros_like(base.eta))

    def forward(self, x, state=None, *, return_variance=False, return_state=False):
        if return_variance:
            raise ValueError("return_variance: the linear recurrence has no output variance")
        self._check_input(x)
        sens, window = self.sensors(x, None if state is None else state.conv)
        decay, _ = self.dynamics(sens.v.dtype)
        h0 = None if state is None else state.h
        if linear_kernel.available(sens.v):  # one pass over time per lane (linear_kernel.py)
            y, h_last = linear_kernel.linear_recurrence(sens.v, sens.k, sens.q, decay, h0)
        else:
            b = sens.v[..., :, None] * sens.k[..., None, :]
            h = decayed_cumsum(b, decay, h0)
            y, h_last = (sens.q[:, :, None, :] * h).sum(-1), h[:, -1]
        g = self._act(sens.gate)
        out = self.out_proj((y.to(x.dtype) + self.lambda_skip.to(x.dtype) * sens.z) * g)
        if return_state or state is not None:
            return out, LinearState(window, h_last)
        return out


_LAYERS = {"kla": KLATraining, "kla_p0": KLANoProcessNoise, "linear": LinearRecurrenceLayer}


def build_model(
    mixer: str,
    vocab_size: int,
    *,
    n_layers: int,
    d_model: int,
    d_state: int = 16,
    expand: float = 1.0,
    n_heads: int = 4,
    backend: str = "auto",
) -> KLALanguageModel:
    """A ``KLALanguageModel`` with ``n_layers`` blocks of ``mixer`` (one of :data:`MIXERS`).

    >>> m = build_model("linear", 10, n_layers=1, d_model=16, d_state=4)
    >>> tuple(m(torch.zeros(2, 5, dtype=torch.long)).shape)
    (2, 5, 10)
    """
    if mixer not in MIXERS:
        raise ValueError(f"mixer: expected one of {MIXERS}, got {mixer!r}")
    kla_cfg = KLAConfig(d_state=d_state, expand=expand, backend=backend)
    cfg = ModelConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        mixers="attention" if mixer == "attention" else "kla",
        kla=kla_cfg,
        attention=AttentionConfig(n_heads=n_heads),
    )
    torch_state = torch.random.get_rng_state()
    model = KLALanguageModel(cfg)
    if mixer in _LAYERS:
        torch.random.set_rng_state(torch_state)  # same draws as the plain KLA model
        model = KLALanguageModel(cfg)
        for blk in model.blocks:
            new = _LAYERS[mixer](d_model, kla_cfg)
            new.load_state_dict(blk.mixer.state_dict())
            blk.mixer = new
    return model
