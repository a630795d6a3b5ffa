"""Configuration dataclasses of the KLA layer, the attention baseline and the language model.

The field names and defaults follow the authors' published implementation, so that a config
written for it reads naturally here (see ``docs/kla.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

_DISCRETIZATIONS = ("ou", "zoh")
_GATE_ACTIVATIONS = ("silu", "gelu", "relu")
_MIXERS = ("kla", "attention")


def _check_positive(name: str, value, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        expected = "a positive int" if integer else "a positive number"
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


@dataclass
class KLAConfig:
    """Hyper-parameters of one :class:`~kalmanscan.kla.KLALayer`.

    ``M = int(expand * d_model)`` channels, each filtering ``d_state`` slots.

    >>> from kalmanscan.kla import KLAConfig
    >>> KLAConfig().d_inner(64)
    128
    """

    d_state: int = 16
    expand: float = 2.0
    conv_kernel: int = 4
    qk_norm: bool = True
    discretization: str = "ou"  # "ou" (exact Ornstein-Uhlenbeck) or "zoh" (p_bar = p * dt)
    process_noise_init: float = 0.01
    obs_var_min: float = 1e-4
    lambda_skip_init: float = -1.0
    gate_activation: str = "silu"
    dt_min: float = 1e-3
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    backend: str = "auto"  # passed to kalmanscan.core.kla_op.kla_filter

    def __post_init__(self) -> None:
        _check_positive("d_state", self.d_state, integer=True)
        _check_positive("expand", self.expand)
        _check_positive("conv_kernel", self.conv_kernel, integer=True)
        _check_positive("process_noise_init", self.process_noise_init)
        _check_positive("obs_var_min", self.obs_var_min)
        _check_positive("dt_min", self.dt_min)
        _check_positive("dt_max", self.dt_max)
        _check_positive("dt_init_floor", self.dt_init_floor)
        if self.dt_min > self.dt_max:
            raise ValueError(
                f"dt_min, dt_max: expected dt_min <= dt_max, got {self.dt_min} > {self.dt_max}"
            )
        from kalmanscan.core.kla_op import KLA_BACKENDS

        if not isinstance(self.backend, str) or (
            self.backend != "auto" and self.backend not in KLA_BACKENDS
        ):
            raise ValueError(
                f"backend: expected 'auto' or one of {sorted(KLA_BACKENDS)}, got {self.backend!r}"
            )
        if self.discretization not in _DISCRETIZATIONS:
            raise ValueError(
                f"discretization: expected one of {_DISCRETIZATIONS}, got {self.discretization!r}"
            )
        if self.gate_activation not in _GATE_ACTIVATIONS:
            raise ValueError(
                f"gate_activation: expected one of {_GATE_ACTIVATIONS}, "
                f"got {self.gate_activation!r}"
            )

    def d_inner(self, d_model: int) -> int:
        """Number of channels ``M`` for a layer of width ``d_model``."""
        return int(self.expand * d_model)


@dataclass
class AttentionConfig:
    """Causal multi-head softmax attention with rotary positions (the baseline mixer).

    >>> from kalmanscan.kla import AttentionConfig
    >>> AttentionConfig(n_heads=4).n_heads
    4
    """

    n_heads: int = 4
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        _check_positive("n_heads", self.n_heads, integer=True)
        _check_positive("rope_base", self.rope_base)


@dataclass
class ModelConfig:
    """A decoder-only language model: embedding, ``n_layers`` pre-norm blocks, norm, LM head.

    ``mixers`` names each block's sequence mixer (``"kla"`` or ``"attention"``); a single string
    applies to every block. ``ModelConfig.hybrid(n)`` is attention everywhere except a KLA last
    block.

    >>> from kalmanscan.kla import ModelConfig
    >>> ModelConfig.hybrid(3, d_model=32).mixer_list()
    ['attention', 'attention', 'kla']
    """

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    mixers: str | list[str] = "kla"
    mlp_ratio: float = 4.0
    norm_eps: float = 1e-5
    kla: KLAConfig = field(default_factory=KLAConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        if isinstance(self.kla, dict):
            self.kla = KLAConfig(**self.kla)
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        _check_positive("vocab_size", self.vocab_size, integer=True)
        _check_positive("d_model", self.d_model, integer=True)
        _check_positive("n_layers", self.n_layers, integer=True)
        _check_positive("mlp_ratio", self.mlp_ratio)
        _check_positive("norm_eps", self.norm_eps)
        mixers = self.mixer_list()
        bad = [m for m in mixers if m not in _MIXERS]
        if bad:
            raise ValueError(f"mixers: expected entries from {_MIXERS}, got {bad}")
        if len(mixers) != self.n_layers:
            raise ValueError(
                f"mixers: expected {self.n_layers} entries (n_layers), got {len(mixers)}"
            )
        if "attention" in mixers and self.d_model % self.attention.n_heads:
            raise ValueError(
                f"attention.n_heads: expected a divisor of d_model={self.d_model}, "
                f"got {self.attention.n_heads}"
            )

    @classmethod
    def hybrid(cls, n_layers: int, **kwargs) -> ModelConfig:
        """Attention in every block except a KLA last block."""
        return cls(n_layers=n_layers, mixers=["attention"] * (n_layers - 1) + ["kla"], **kwargs)

    def mixer_list(self) -> list[str]:
        """One mixer name per block."""
        if isinstance(self.mixers, str):
            return [self.mixers] * self.n_layers
        return list(self.mixers)

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (inverse: ``ModelConfig.from_dict``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """Build from ``to_dict()`` output; unknown keys raise ValueError naming them."""
        if not isinstance(data, dict):
            raise TypeError(f"config: expected a dict, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"config: unknown model keys {unknown}; expected a subset of {sorted(known)}"
            )
        data = dict(data)
        for key, sub in (("kla", KLAConfig), ("attention", AttentionConfig)):
            if key in data and isinstance(data[key], dict):
                sub_known = {f.name for f in dataclasses.fields(sub)}
                bad = sorted(set(data[key]) - sub_known)
                if bad:
                    raise ValueError(
                        f"config: unknown {key} keys {bad}; "
                        f"expected a subset of {sorted(sub_known)}"
                    )
                data[key] = sub(**data[key])
        return cls(**data)
