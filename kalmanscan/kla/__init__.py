"""Kalman Linear Attention: the neural client of the KLA filter op, a byte-level language model,
and tools to inspect the belief-state precisions inside trained models.

>>> import torch
>>> from kalmanscan.kla import KLALayer, KLAConfig
>>> layer = KLALayer(32, KLAConfig(d_state=4))
>>> tuple(layer(torch.randn(1, 6, 32)).shape)
(1, 6, 32)

``inspect`` imports xarray and the plot helpers matplotlib when first called.

``kalmanscan.kla.inspect`` is the function. Its module is ``kalmanscan.kla._inspect``, also
importable as ``kalmanscan.kla.inspect`` (``from kalmanscan.kla.inspect import summarize``, the
path of earlier releases); no file is named ``inspect.py``, so no import can rebind the name
``inspect`` here to a module.
"""

import sys as _sys

from kalmanscan.kla import _inspect
from kalmanscan.kla._inspect import (
    baseline_log10_precision,
    compare,
    inspect,
    kla_layers,
    save_dataset,
    summarize,
)
from kalmanscan.kla.config import AttentionConfig, KLAConfig, ModelConfig
from kalmanscan.kla.io import (
    CheckpointError,
    decode_bytes,
    encode_text,
    load_checkpoint,
    load_state_dict,
    save_checkpoint,
)
from kalmanscan.kla.layer import KLALayer, KLALayerState, KLATrace
from kalmanscan.kla.model import CausalSelfAttention, KLALanguageModel

_sys.modules[__name__ + ".inspect"] = _inspect

__all__ = [
    "AttentionConfig",
    "CausalSelfAttention",
    "CheckpointError",
    "KLAConfig",
    "KLALanguageModel",
    "KLALayer",
    "KLALayerState",
    "KLATrace",
    "ModelConfig",
    "baseline_log10_precision",
    "channel_order",
    "compare",
    "decode_bytes",
    "encode_text",
    "inspect",
    "kla_layers",
    "load_checkpoint",
    "load_state_dict",
    "plot_comparison",
    "plot_layer_summary",
    "plot_overview",
    "plot_precision",
    "save_checkpoint",
    "save_dataset",
    "summarize",
]


def __getattr__(name):
    if name in (
        "plot_precision", "plot_layer_summary", "plot_overview", "plot_comparison", "channel_order"
    ):  # fmt: skip
        from kalmanscan.kla import plot

        return getattr(plot, name)
    raise AttributeError(f"module 'kalmanscan.kla' has no attribute {name!r}")
