"""Safe checkpoints (safetensors + a JSON config) and byte-level text encoding.

A checkpoint is a directory holding ``model.safetensors`` (tensors only: loading executes no
code) and ``config.json`` (``{"format": "kalmanscan-kla-lm", "model": ModelConfig.to_dict(),
...}``). Pickle-based files (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) are refused. The bundled
model lives in ``kalmanscan/kla/weights/``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from kalmanscan.kla.config import ModelConfig

FORMAT = "kalmanscan-kla-lm"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
BUNDLED_DIR = Path(__file__).resolve().parent / "weights"
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")

# Parameters kept in float32 when a checkpoint is stored in half precision: the filter's dynamics
# and the scalars, whose small values need the mantissa and range.
_KEEP_FP32 = ("delta", "lambda_log", "process_noise", "lambda_skip", "norm")


class CheckpointError(ValueError):
    """A checkpoint is missing, unsafe, or does not match the model it is loaded into."""


# ---------------------------------------------------------------------- text <-> bytes


def encode_text(text: str | bytes) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a token tensor ``[1, L]`` (int64, vocabulary 256).

    >>> encode_text("hi").tolist()
    [[104, 105]]
    """
    if isinstance(text, str):
        data = text.encode("utf-8")
    elif isinstance(text, (bytes, bytearray)):
        data = bytes(text)
    else:
        raise TypeError(f"text: expected str or bytes, got {type(text).__name__}")
    if not data:
        raise ValueError("text: expected at least one byte, got an empty string")
    return torch.tensor(list(data), dtype=torch.int64)[None]


def decode_bytes(tokens) -> str:
    """Token ids (bytes) back to text; invalid UTF-8 becomes U+FFFD.

    >>> decode_bytes([104, 105])
    'hi'
    """
    return bytes(int(t) for t in torch.as_tensor(tokens).reshape(-1).tolist()).decode(
        "utf-8", errors="replace"
    )


def byte_label(token: int) -> str:
    """A printable one-token label: the ASCII character, or an escape such as ``\\n``/``\\xe2``.

    >>> [byte_label(t) for t in (97, 10, 32, 226)]
    ['a', '\\\\n', '␣', '\\\\xe2']
    """
    token = int(token)
    if token == 32:
        return "␣"
    if 33 <= token < 127:
        return chr(token)
    return {9: "\\t", 10: "\\n", 13: "\\r"}.get(token, f"\\x{token:02x}")


# ---------------------------------------------------------------------- state dicts


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointError` listing every missing key, unexpected key and shape mismatch.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> check_state_dict(m, m.state_dict())  # no error
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = []
    for key in sorted(set(expected) & set(state_dict)):
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            wrong.append(f"{key}: expected a tensor, got {type(value).__name__}")
        elif tuple(value.shape) != tuple(expected[key].shape):
            wrong.append(
                f"{key}: expected shape {list(expected[key].shape)}, got {list(value.shape)}"
            )
        elif not value.is_floating_point():
            wrong.append(f"{key}: expected a floating-point tensor, got {value.dtype}")
    if missing or unexpected or wrong:
        lines = ["state dict does not match the model:"]
        if missing:
            lines.append(f"  missing keys ({len(missing)}): {', '.join(missing[:20])}")
        if unexpected:
            lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected[:20])}")
        lines += [f"  {w}" for w in wrong[:20]]
        raise CheckpointError("\n".join(lines))


def load_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """Check ``state_dict`` (see :func:`check_state_dict`), then load it with ``strict=True``,
    casting each tensor to the model's dtype. Returns ``model``."""
    check_state_dict(model, state_dict)
    ref = model.state_dict()
    model.load_state_dict({k: v.to(ref[k].dtype) for k, v in state_dict.items()}, strict=True)
    return model


# ---------------------------------------------------------------------- checkpoints


def save_checkpoint(
    model: nn.Module, directory: str | Path, *, dtype: torch.dtype | None = None, metadata=None
) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (created if needed).

    ``dtype`` (e.g. ``torch.float16``) stores the matrices in half precision; the filter
    dynamics, scalars and norms stay float32. ``metadata`` (a JSON-able dict) is stored under
    ``"metadata"`` in the config. Returns the directory.

    >>> import tempfile
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> d = save_checkpoint(m, tempfile.mkdtemp())
    >>> sorted(p.name for p in d.iterdir())
    ['config.json', 'model.safetensors']
    """
    from safetensors.torch import save_file

    if not isinstance(getattr(model, "config", None), ModelConfig):
        raise TypeError(f"model: expected a KLALanguageModel, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, value in model.state_dict().items():
        value = value.detach().cpu()
        if dtype is not None and not any(part in key for part in _KEEP_FP32):
            value = value.to(dtype)
        tensors[key] = value.contiguous()
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    config = {"format": FORMAT, "version": 1, "model": model.config.to_dict()}
    if metadata is not None:
        config["metadata"] = metadata
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def read_config(directory: str | Path) -> dict:
    """The parsed ``config.json`` of a checkpoint directory (checked for the format tag)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint: expected a config file {path}, found none")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint: {path} is not valid JSON ({err})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT or "model" not in config:
        raise CheckpointError(
            f"checkpoint: expected {path} to hold {{'format': {FORMAT!r}, 'model': {{...}}}}, "
            f"got keys {sorted(config) if isinstance(config, dict) else type(config).__name__}"
        )
    return config


def load_checkpoint(
    directory: str | Path | None = None, *, device="cpu", dtype=torch.float32, backend=None
):
    """Build a :class:`~kalmanscan.kla.KLALanguageModel` from a checkpoint directory.

    ``directory=None`` loads the model bundled with the package. Only safetensors weights are
    read (no pickle); shapes and keys must match the config exactly, else
    :class:`CheckpointError` names what differs. ``backend`` overrides the KLA op backend of
    the stored config (e.g. ``"sequential"``, the faster one for short CPU inputs). The model is
    returned in eval mode.

    >>> model = load_checkpoint()  # the bundled byte-level model  # doctest: +SKIP
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from kalmanscan.kla.model import KLALanguageModel

    directory = BUNDLED_DIR if directory is None else Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint: expected a directory, got {str(directory)!r}")
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        hint = (
            f"; found pickle files {pickles}, which are refused because unpickling can run "
            "arbitrary code: convert them with safetensors.torch.save_file(state_dict, "
            f"'{WEIGHTS_FILE}') in an environment you trust"
            if pickles
            else ""
        )
        raise CheckpointError(f"checkpoint: expected weights {weights}, found none{hint}")
    config = read_config(directory)
    try:
        model_dict = dict(config["model"])
        if backend is not None:
            model_dict["kla"] = {**model_dict.get("kla", {}), "backend": backend}
        model_config = ModelConfig.from_dict(model_dict)
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint: invalid model config in {directory / CONFIG_FILE}: {err}"
        ) from None
    try:
        state_dict = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"checkpoint: cannot read {weights} as safetensors ({err})") from None
    model = KLALanguageModel(model_config).to(dtype)
    load_state_dict(model, state_dict)
    return model.to(device).eval()
