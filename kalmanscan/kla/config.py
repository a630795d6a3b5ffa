"""Configuration dataclasses of the KLA layer, the attention baseline and the language model.

The field names and defaults follow the authors' published implementation, so that a config
written for it reads naturally here (see ``docs/kla.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

_DISCRETIZATIONS = ("ou", "zoh")
_GATE_ACTIVATIONS = ("silu", "gelu", "relu")
_PROCESS_NOISE_MODES = ("learned", "fixed", "zero")
_MIXERS = ("kla", "attention")

# The authors' published KLAConfig (vaisakh-shaj/kalman-linear-attention, package kla 0.1.0):
# their field name -> ours, for the fields whose meaning is the same.
_AUTHORS_RENAMED = {
    "conv_kernel_size": "conv_kernel",
    "gating_activation": "gate_activation",
    "process_noise_scale": "process_noise_init",
}
_AUTHORS_SAME = (
    "d_state",
    "expand",
    "dt_min",
    "dt_max",
    "dt_init_floor",
    "discretization",
    "obs_var_min",
    "qk_norm",
    "lambda_skip_init",
    "process_noise_init",
    "process_noise_mode",
)
# Their architecture switches this layer implements only at one setting: accepted at that
# setting, refused by name otherwise (a different setting changes the parameters or the math).
_AUTHORS_FIXED = {
    "use_conv": True,
    "conv_activation": "silu",
    "use_gating": True,
    "use_lambda_skip": True,
    "lambda_skip_mode": "scalar",
    "value_rank": "full",
    "var_rank": "full",
    "bias": False,
    "clip_value": None,
    "obs_var_max": None,
    "decode_from_prior": False,
    "return_variance": False,
    "process_noise_param": "raw",
    "obs_noise_init": None,
}
# Their implementation choices that do not change what the layer computes (beyond rounding):
# accepted and dropped. backend names differ between the packages; ours picks by device.
_AUTHORS_IGNORED = ("backend", "mobius_impl", "checkpoint_ssm", "dt_rank", "scan_impl")


# The largest float32: the layers' parameters are float32, so a config value beyond it (or
# infinite) would build a parameter that is not finite.
_FLOAT32_MAX = 3.4028234663852886e38


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_positive(name: str, value, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        expected = "a positive int" if integer else "a positive number"
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    if not integer and not value <= _FLOAT32_MAX:
        raise ValueError(
            f"{name}: expected a positive number, finite and at most {_FLOAT32_MAX:.4g} "
            f"(float32's range), got {value!r}"
        )


def _check_finite(name: str, value) -> None:
    """A real number (any sign) that a float32 parameter can hold."""
    if not _is_number(value) or not -_FLOAT32_MAX <= value <= _FLOAT32_MAX:
        raise ValueError(
            f"{name}: expected a finite number (at most {_FLOAT32_MAX:.4g} in magnitude, "
            f"float32's range), got {value!r}"
        )


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool (True or False), got {value!r}")


def _check_choice(name: str, value, choices: tuple) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


@dataclass
class KLAConfig:
    """Hyper-parameters of one :class:`~kalmanscan.kla.KLALayer`.

    ``M = int(expand * d_model)`` channels, each filtering ``d_state`` slots.

    ``process_noise_mode``: ``"learned"`` (a parameter floored at 1e-7 in the dynamics),
    ``"fixed"`` (a buffer at ``process_noise_init``, same floor) or ``"zero"`` (a zero buffer
    plus 1e-12: deterministic dynamics), the authors' ``learnable_process_noise=False`` and
    ``zero_process_noise=True`` variants. Configs written for the authors' package convert with
    :meth:`from_authors`.

    ``process_noise_param="log"`` learns ``process_noise_log`` with ``p = exp(.)`` instead of a
    raw ``process_noise`` floored at 1e-7: an optimizer cannot push it onto the floor, where a
    raw parameter gets no gradient (a state dict with a different key; for training new models).

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
    process_noise_mode: str = "learned"  # "learned", "fixed" (a buffer) or "zero"
    process_noise_param: str = "raw"  # "raw" (the authors' layout) or "log" (learned only)
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
        _check_bool("qk_norm", self.qk_norm)
        _check_choice("discretization", self.discretization, _DISCRETIZATIONS)
        _check_positive("process_noise_init", self.process_noise_init)
        _check_choice("process_noise_mode", self.process_noise_mode, _PROCESS_NOISE_MODES)
        _check_choice("process_noise_param", self.process_noise_param, ("raw", "log"))
        if self.process_noise_param == "log" and self.process_noise_mode != "learned":
            raise ValueError(
                "process_noise_param: 'log' is for learned process noise, got "
                f"process_noise_mode={self.process_noise_mode!r}"
            )
        _check_positive("obs_var_min", self.obs_var_min)
        _check_finite("lambda_skip_init", self.lambda_skip_init)
        _check_choice("gate_activation", self.gate_activation, _GATE_ACTIVATIONS)
        _check_positive("dt_min", self.dt_min)
        _check_positive("dt_max", self.dt_max)
        _check_positive("dt_init_floor", self.dt_init_floor)
        if self.dt_min > self.dt_max:
            raise ValueError(
                f"dt_min, dt_max: expected dt_min <= dt_max, got {self.dt_min} > {self.dt_max}"
            )
        from kalmanscan.core.backends import check_name

        check_name(self.backend, "kla")

    def d_inner(self, d_model: int) -> int:
        """Number of channels ``M`` for a layer of width ``d_model``."""
        return int(self.expand * d_model)

    @classmethod
    def from_authors(cls, config) -> KLAConfig:
        """Convert a config of the authors' package (a dict of their ``KLAConfig`` fields, or
        that dataclass itself) into ours, faithfully or not at all.

        Renamed: ``conv_kernel_size``, ``gating_activation``, ``process_noise_scale``.
        ``learnable_process_noise=False`` and ``zero_process_noise=True`` become
        ``process_noise_mode="fixed"`` / ``"zero"`` (the process noise is then a buffer, as in
        their layer, and the zero variant adds 1e-12 instead of flooring at 1e-7). Architecture
        switches this layer implements at one setting only (``use_conv``, ``use_gating``,
        ``value_rank``, ``var_rank``, ``bias``, ``clip_value``, ``obs_var_max``,
        ``decode_from_prior``, ...) are accepted at that setting and otherwise refused with a
        ValueError naming them; implementation choices that do not change the results
        (``backend``, ``mobius_impl``, ``checkpoint_ssm``) are dropped; unknown fields are
        refused by name. Missing fields take their defaults, which equal ours.

        >>> cfg = KLAConfig.from_authors({"d_state": 8, "conv_kernel_size": 4,
        ...     "gating_activation": "silu", "process_noise_scale": 0.02,
        ...     "learnable_process_noise": False, "backend": "torch_unfused_pscan"})
        >>> cfg.d_state, cfg.process_noise_init, cfg.process_noise_mode
        (8, 0.02, 'fixed')
        """
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = dataclasses.asdict(config)
        if not isinstance(config, dict):
            raise TypeError(
                f"config: expected a dict of the authors' KLAConfig fields, got "
                f"{type(config).__name__}"
            )
        out = {}
        unknown, refused = [], []
        learnable = config.get("learnable_process_noise", True)
        zero = config.get("zero_process_noise", False)
        for key, value in config.items():
            if key in _AUTHORS_RENAMED:
                out[_AUTHORS_RENAMED[key]] = value
            elif key in _AUTHORS_SAME:
                out[key] = value
            elif key in ("learnable_process_noise", "zero_process_noise"):
                if not isinstance(value, bool):
                    raise ValueError(f"{key}: expected a bool, got {value!r}")
            elif key in _AUTHORS_FIXED:
                if value != _AUTHORS_FIXED[key]:
                    refused.append(f"{key}={value!r} (supported: {_AUTHORS_FIXED[key]!r})")
            elif key in _AUTHORS_IGNORED:
                pass
            else:
                unknown.append(key)
        if "process_noise_scale" in config and "process_noise_init" in config:
            refused.append("both process_noise_scale and process_noise_init (give one)")
        if unknown:
            raise ValueError(f"config: unknown authors' KLAConfig fields {sorted(unknown)}")
        if refused:
            raise ValueError(
                "config: settings of the authors' layer that kalmanscan's KLALayer does not "
                "implement: " + "; ".join(refused)
            )
        mode = "zero" if zero else ("learned" if learnable else "fixed")
        if "process_noise_mode" in out and (zero or not learnable):
            if out["process_noise_mode"] != mode:
                raise ValueError(
                    f"config: process_noise_mode={out['process_noise_mode']!r} contradicts "
                    f"learnable_process_noise={learnable}, zero_process_noise={zero}"
                )
        out.setdefault("process_noise_mode", mode)
        return cls(**out)


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
        for key, sub in (("kla", KLAConfig), ("attention", AttentionConfig)):
            value = getattr(self, key)
            if isinstance(value, dict):
                known = {f.name for f in dataclasses.fields(sub)}
                bad = sorted(set(value) - known, key=str)
                if bad:
                    raise ValueError(
                        f"{key}: unknown {sub.__name__} keys {bad}; expected a subset of "
                        f"{sorted(known)}"
                    )
                setattr(self, key, sub(**value))
        if not isinstance(self.kla, KLAConfig):
            raise ValueError(
                f"kla: expected a KLAConfig or a dict of its fields, got {type(self.kla).__name__}"
            )
        if not isinstance(self.attention, AttentionConfig):
            raise ValueError(
                "attention: expected an AttentionConfig or a dict of its fields, got "
                f"{type(self.attention).__name__}"
            )
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
        """Attention in every block except a KLA last block; ``kwargs`` are the other fields.

        >>> ModelConfig.hybrid(3, d_model=32).mixer_list()
        ['attention', 'attention', 'kla']
        """
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
