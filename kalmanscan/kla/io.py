"""Safe checkpoints (safetensors + a JSON config) and byte-level text encoding.

A checkpoint is a directory holding ``model.safetensors`` (tensors only: loading executes no
code) and ``config.json`` (``{"format": "kalmanscan-kla-lm", "model": ModelConfig.to_dict(),
...}``). Pickle-based files (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) are refused. The bundled
model lives in ``kalmanscan/kla/weights/``.
"""

from __future__ import annotations

import json
import math
import os
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
    """A checkpoint is missing, unsafe, or does not match the model it is loaded into (a
    ``ValueError``); the message lists every problem found.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> state = m.state_dict()
    >>> del state["lm_head.weight"]
    >>> try:
    ...     load_state_dict(m, state)
    ... except CheckpointError as err:
    ...     print(err)
    state dict does not match the model:
      missing keys (1): lm_head.weight
    """


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


def byte_labels(tokens) -> list[str]:
    """One label per byte of a UTF-8 text: :func:`byte_label` for single bytes, the character
    on the first byte of a multi-byte character and ``""`` on its other bytes, so the labels
    read as the text and join back into it; bytes that are not valid UTF-8 keep their escapes.

    >>> byte_labels("é!".encode())
    ['é', '', '!']
    """
    data = bytes(int(t) for t in tokens)
    labels = [byte_label(t) for t in data]
    i = 0
    while i < len(data):
        lead = data[i]
        n = 1 if lead < 0xC2 or lead > 0xF4 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if n > 1:
            try:
                char = data[i : i + n].decode("utf-8")
            except UnicodeDecodeError:
                char = None
            if char is not None and len(char) == 1 and char.isprintable():
                labels[i : i + n] = [char] + [""] * (n - 1)
                i += n
                continue
        i += 1
    return labels


# ---------------------------------------------------------------------- state dicts


def _check_keys(title: str, missing, unexpected, wrong) -> None:
    """Raise :class:`CheckpointError` under ``title`` listing the missing and unexpected keys and
    the wrong tensors (up to 20 of each), if there are any."""
    if not (missing or unexpected or wrong):
        return
    lines = [title]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): {', '.join(missing[:20])}")
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): {', '.join(unexpected[:20])}")
    lines += [f"  {w}" for w in wrong[:20]]
    raise CheckpointError("\n".join(lines))


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointError` listing every missing key, unexpected key, shape mismatch,
    non-floating tensor and tensor holding NaN or inf.

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
        else:
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                wrong.append(
                    f"{key}: expected finite values, got {bad} NaN or inf of {value.numel()}"
                )
    _check_keys("state dict does not match the model:", missing, unexpected, wrong)


def load_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """Check ``state_dict`` (see :func:`check_state_dict`), then load it with ``strict=True``,
    casting each tensor to the model's dtype. Returns ``model``; raises :class:`CheckpointError`
    listing what does not match.

    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> cfg = ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2))
    >>> a, b = KLALanguageModel(cfg), KLALanguageModel(cfg)
    >>> b = load_state_dict(b, a.state_dict())
    >>> bool(torch.equal(a.lm_head.weight, b.lm_head.weight))
    True
    """
    check_state_dict(model, state_dict)
    ref = model.state_dict()
    model.load_state_dict({k: v.to(ref[k].dtype) for k, v in state_dict.items()}, strict=True)
    return model


# ---------------------------------------------------------------------- checkpoints


def _metadata_type(value) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _check_metadata(value, where: str = "", depth: int = 0, seen: tuple = ()) -> None:
    """A TypeError naming ``metadata`` and the key where ``value`` holds something JSON cannot
    store as it is (json's types: dict with str keys, list/tuple, str, int, float, bool, None);
    a ValueError for a NaN or infinite float, which strict JSON has no token for (Python's json
    would write ``NaN``, which other parsers reject)."""
    at = f" at {where!r}" if where else ""
    if isinstance(value, (dict, list, tuple)):
        if any(value is s for s in seen) or depth > 64:
            raise ValueError(f"metadata: expected a tree of JSON values, got a cycle{at}")
        seen = seen + (value,)
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise TypeError(
                        f"metadata: expected a JSON-serialisable dict (str keys), got a key "
                        f"{k!r} of type {_metadata_type(k)}{at}"
                    )
                _check_metadata(v, f"{where}.{k}" if where else k, depth + 1, seen)
        else:
            for i, v in enumerate(value):
                _check_metadata(v, f"{where}[{i}]", depth + 1, seen)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(
            f"metadata: expected finite floats (JSON has no NaN or Infinity), got {value!r}{at}; "
            "store None or a string such as 'nan' instead"
        )
    elif value is None or isinstance(value, (str, int, float)):  # bool is an int
        pass
    else:
        hint = (
            " (convert it with float(), int() or .tolist())"
            if hasattr(value, "item") or hasattr(value, "tolist")
            else ""
        )
        raise TypeError(
            f"metadata: expected a JSON-serialisable dict, got {_metadata_type(value)}{at}{hint}"
        )


def _unstorable(key: str, value: torch.Tensor, stored: torch.Tensor) -> str:
    """Why the state-dict entry ``key`` cannot be stored as ``stored`` (its cast to the checkpoint's
    dtype) and read back, or "": NaN or inf in the model itself, or a finite value beyond the
    stored dtype's range (a float32 weight of 1e5 is inf in float16)."""
    if not stored.is_floating_point() or bool(torch.isfinite(stored).all()):
        return ""
    finite = torch.isfinite(value)
    if not bool(finite.all()):
        n = int((~finite).sum())
        return f"{key}: holds {n} NaN or inf of {value.numel()} in the model ({value.dtype})"
    big = float(value.abs().max())
    limit = torch.finfo(stored.dtype).max
    over = int((~torch.isfinite(stored)).sum())
    return (
        f"{key}: largest magnitude {big:.6g} is beyond {stored.dtype}'s range "
        f"(+-{limit:.6g}; {over} of {value.numel()} values overflow); save with dtype=None or "
        f"torch.bfloat16, or rescale the weight"
    )


def _write_atomic(path: Path, write) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(
    model: nn.Module, directory: str | Path, *, dtype: torch.dtype | None = None, metadata=None
) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (created if needed).

    ``dtype`` (e.g. ``torch.float16``) stores the matrices in half precision; the filter
    dynamics, scalars and norms stay float32. A tensor with NaN or inf, or one whose largest
    magnitude is beyond ``dtype``'s range (float16: 65504), is refused with a ValueError naming
    it, its largest magnitude and the range (:func:`load_checkpoint` refuses non-finite values,
    so such a checkpoint could not be read back). ``metadata`` (a JSON-able dict: str keys;
    values dicts, lists, str, int, finite float, bool or None) is stored under ``"metadata"`` in
    the config; anything else (a ``numpy.float32``, a tensor) is refused with a TypeError, a NaN
    or infinite float with a ValueError, naming its key. A ``directory`` that is a file (or lies
    under one) is refused with a FileExistsError naming ``directory``. All of this happens
    before any file or directory is written. Each file is written to a temporary file and
    renamed over the old one, so an existing checkpoint is never left with a half-written file.
    Returns the directory.

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
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise TypeError(
            f"dtype: expected None or a floating torch.dtype (e.g. torch.float16), got {dtype!r}"
        )
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(
            f"metadata: expected None or a JSON-serialisable dict, got {_metadata_type(metadata)}"
        )
    directory = _as_path("directory", directory)
    # a file where the directory (or one of its parents) would go: say so by name, before
    # anything is written (mkdir would raise a bare "[Errno 17] File exists")
    for path in (directory, *directory.parents):
        if path.is_dir():
            break
        if path.exists() or path.is_symlink():
            what = "a file" if path == directory else f"a path under the file {str(path)!r}"
            raise FileExistsError(
                f"directory: expected a directory to write {WEIGHTS_FILE} and {CONFIG_FILE} "
                f"into (existing or new), got {str(directory)!r}, {what}"
            )
    config = {"format": FORMAT, "version": _VERSIONS[-1], "model": model.config.to_dict()}
    if metadata is not None:
        _check_metadata(metadata)
        config["metadata"] = metadata
    # everything that can fail on the values is done before the first file is touched
    try:  # strict JSON: no NaN / Infinity tokens (_check_metadata names the key first)
        text = json.dumps(config, indent=2, sort_keys=True, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:  # pragma: no cover - _check_metadata finds these
        raise TypeError(f"metadata: expected a JSON-serialisable dict, got {err}") from None
    tensors = {}
    bad = []
    for key, value in model.state_dict().items():
        value = value.detach().cpu()
        stored = value
        if dtype is not None and not any(part in key for part in _KEEP_FP32):
            stored = value.to(dtype)
        problem = _unstorable(key, value, stored)
        if problem:
            bad.append(problem)
        tensors[key] = stored.contiguous()
    if bad:
        raise ValueError(
            f"model: expected finite tensors that fit the stored dtype (load_checkpoint refuses "
            f"NaN and inf), got {len(bad)} that do not; nothing was written:\n  " + "\n  ".join(bad)
        )
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(
        directory / WEIGHTS_FILE,
        lambda tmp: save_file(tensors, str(tmp), metadata={"format": FORMAT}),
    )
    _write_atomic(directory / CONFIG_FILE, lambda tmp: tmp.write_text(text))
    return directory


_VERSIONS = (1,)  # config.json "version"s this reader understands (save_checkpoint writes 1)
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; refuse megabytes before reading
_MAX_DEPTH = 4  # {"model": {"kla": {...}}} plus metadata one level deeper
_MAX_INT = 1 << 31
_MAX_LAYERS = 4096
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_DTYPE_NAMES = {
    "BOOL": "torch.bool",
    "U8": "torch.uint8",
    "I8": "torch.int8",
    "I16": "torch.int16",
    "I32": "torch.int32",
    "I64": "torch.int64",
}


def _check_json(value, where: str, depth: int = 0) -> None:
    """Types, sizes and finiteness of a parsed config, before any of it is used."""
    if depth > _MAX_DEPTH:
        raise CheckpointError(f"checkpoint: {where}: nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, dict):
        if len(value) > 256:
            raise CheckpointError(
                f"checkpoint: {where}: expected at most 256 keys, got {len(value)}"
            )
        for k, v in value.items():
            _check_json(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list):
        if len(value) > _MAX_LAYERS:
            raise CheckpointError(
                f"checkpoint: {where}: expected a list of at most {_MAX_LAYERS} entries, got "
                f"{len(value)}"
            )
        for i, v in enumerate(value):
            if isinstance(v, (dict, list)):
                raise CheckpointError(
                    f"checkpoint: {where}[{i}]: expected a number or string, "
                    f"got a nested {type(v).__name__}"
                )
            _check_json(v, f"{where}[{i}]", depth + 1)
    elif isinstance(value, str):
        if len(value) > 1024:
            raise CheckpointError(
                f"checkpoint: {where}: expected a string of at most 1024 "
                f"characters, got {len(value)}"
            )
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if abs(value) >= _MAX_INT:
            raise CheckpointError(
                f"checkpoint: {where}: expected an integer below 2**31, got {value}"
            )
    elif isinstance(value, float):
        if not (abs(value) < 1e30):  # also NaN
            raise CheckpointError(
                f"checkpoint: {where}: expected a finite number below 1e30, got {value!r}"
            )
    else:  # pragma: no cover - json gives no other types
        raise CheckpointError(f"checkpoint: {where}: unexpected {type(value).__name__}")


def read_config(directory: str | Path) -> dict:
    """The parsed ``config.json`` of a checkpoint directory, checked for the format tag, a size of
    at most 1 MiB, and in ``model`` for types, sizes and finite numbers (nested at most 4 levels,
    integers below 2**31, at most 4096 layers) before anything is built from it."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint: expected a config file {path}, found none")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise CheckpointError(
            f"checkpoint: expected {path} of at most {MAX_CONFIG_BYTES} bytes, got {size}"
        )
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"checkpoint: {path} is not valid JSON ({err})") from None
    except RecursionError:
        raise CheckpointError(f"checkpoint: {path}: nested too deeply to be a config") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT or "model" not in config:
        raise CheckpointError(
            f"checkpoint: expected {path} to hold {{'format': {FORMAT!r}, 'model': {{...}}}}, "
            f"got keys {sorted(config) if isinstance(config, dict) else type(config).__name__}"
        )
    if not isinstance(config["model"], dict):
        raise CheckpointError(
            f"checkpoint: {path}: expected 'model' to be a dict, got "
            f"{type(config['model']).__name__}"
        )
    version = config.get("version", 1)
    if isinstance(version, bool) or version not in _VERSIONS:
        raise CheckpointError(
            f"checkpoint: {path}: version: expected one of {list(_VERSIONS)} (the formats this "
            f"kalmanscan reads), got {version!r}; a newer kalmanscan may read it"
        )
    _check_json(config["model"], "model")
    n_layers = config["model"].get("n_layers", 0)
    if isinstance(n_layers, int) and n_layers > _MAX_LAYERS:
        raise CheckpointError(
            f"checkpoint: {path}: model.n_layers: expected at most {_MAX_LAYERS}, got {n_layers}"
        )
    return config


def _empty_model(model_config: ModelConfig) -> nn.Module:
    """The model ``model_config`` describes, on the meta device (no memory) and without its
    random init (``kalmanscan.kla.layer._skip_init``: every tensor is read from the checkpoint
    next); a config it cannot be built from raises :class:`CheckpointError`."""
    from kalmanscan.kla.layer import _skip_init
    from kalmanscan.kla.model import KLALanguageModel

    try:
        with torch.device("meta"), _skip_init():
            return KLALanguageModel(model_config)
    except (TypeError, ValueError, OverflowError, RuntimeError) as err:
        raise CheckpointError(f"checkpoint: invalid model config: {err}") from None


def _allocate(model: nn.Module, dtype: torch.dtype, names) -> nn.Module:
    """``model`` (built by :func:`_empty_model`) with each parameter and buffer replaced by
    uninitialised CPU memory of its shape, the floating ones in ``dtype``: what
    ``model.to(dtype).to_empty(device="cpu")`` gives, without their meta-device ops, which run
    through ``torch._refs`` and import sympy on their first call. ``names`` are those of the
    state dict that fills them next; a tensor outside it (a non-persistent buffer) would keep
    uninitialised memory, so it is refused with a RuntimeError. A tensor shared by two modules
    stays shared."""
    made = {}  # id of a meta tensor -> its replacement
    for prefix, module in model.named_modules():
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, old in own:
            key = f"{prefix}.{name}" if prefix else name
            if key not in names:
                raise RuntimeError(
                    f"load_checkpoint: expected every parameter and buffer of the model in its "
                    f"state dict, got {key} outside it (it would keep uninitialised memory)"
                )
            new = made.get(id(old))
            if new is None:
                new = torch.empty(
                    old.shape, dtype=dtype if old.is_floating_point() else old.dtype, device="cpu"
                )
                if isinstance(old, nn.Parameter):
                    new = nn.Parameter(new, requires_grad=old.requires_grad)
                made[id(old)] = new
            setattr(module, name, new)
    return model


def _check_weight_header(model: nn.Module, weights: Path) -> None:
    """Compare the tensor names, shapes and dtypes in the safetensors header with ``model``
    (the one the config describes, on the meta device), before anything real is allocated."""
    from safetensors import SafetensorError, safe_open

    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    try:
        with safe_open(str(weights), framework="pt") as fh:
            header = {
                k: (tuple(fh.get_slice(k).get_shape()), fh.get_slice(k).get_dtype())
                for k in fh.keys()
            }
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"checkpoint: cannot read {weights} as safetensors ({err})") from None
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    wrong = [
        f"{k}: expected shape {list(expected[k])}, got {list(header[k][0])}"
        for k in sorted(set(expected) & set(header))
        if tuple(header[k][0]) != expected[k]
    ] + [
        f"{k}: expected a floating-point tensor, got {_DTYPE_NAMES.get(header[k][1], header[k][1])}"
        for k in sorted(set(expected) & set(header))
        if header[k][1] not in _FLOAT_DTYPES
    ]
    _check_keys(f"checkpoint: {weights} does not match its config:", missing, unexpected, wrong)


def _as_path(name: str, value) -> Path:
    if not isinstance(value, (str, Path)) and not hasattr(value, "__fspath__"):
        raise TypeError(f"{name}: expected a path (str or os.PathLike), got {type(value).__name__}")
    return Path(value)


def _check_device(device, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` this torch can allocate on, else a ValueError naming it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{name}: expected a torch device such as 'cpu' or 'cuda:0', got "
                         f"{device!r} ({err})") from None  # fmt: skip
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"{name}: expected an available device, got {device!r}: this torch sees no "
                f"CUDA device (torch.cuda.is_available() is False)"
            )
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{name}: expected a CUDA index in [0, {count}), got {device!r}")
    elif dev.type not in ("cpu", "meta"):
        module = getattr(torch, dev.type, None)
        available = getattr(module, "is_available", None)
        if callable(available) and not available():
            raise ValueError(
                f"{name}: expected an available device, got {device!r}: torch.{dev.type} "
                "reports none"
            )
    return dev


def _check_backend(backend, name: str = "backend") -> None:
    """None (keep the config's) or a KLA op backend name, else a ValueError naming ``name``."""
    from kalmanscan.core.backends import check_name

    if backend is not None:
        check_name(backend, "kla", name)


def _checkpoint_dir(directory: Path) -> Path:
    """``directory`` if it is one; a file inside a checkpoint, a pickle or a missing path is
    refused with a message saying what to pass instead."""
    if directory.is_dir():
        return directory
    if directory.is_file():
        if directory.name in (WEIGHTS_FILE, CONFIG_FILE):
            raise CheckpointError(
                f"checkpoint: expected the checkpoint directory, got its file "
                f"{str(directory)!r}; pass {str(directory.parent)!r}"
            )
        if directory.suffix in _PICKLE_SUFFIXES:
            raise CheckpointError(
                f"checkpoint: expected a directory with {WEIGHTS_FILE} and {CONFIG_FILE}, got "
                f"the pickle file {str(directory)!r}, which is refused because unpickling can "
                f"run arbitrary code: {_CONVERT_HINT}"
            )
        raise CheckpointError(
            f"checkpoint: expected a directory with {WEIGHTS_FILE} and {CONFIG_FILE}, got the "
            f"file {str(directory)!r}"
        )
    raise CheckpointError(f"checkpoint: expected a directory, got {str(directory)!r} (not found)")


_CONVERT_HINT = (
    "convert it with safetensors.torch.save_file(state_dict, "
    f"'{WEIGHTS_FILE}') in an environment you trust and write a {CONFIG_FILE} "
    "(see save_checkpoint)"
)


def load_checkpoint(
    directory: str | Path | None = None, *, device="cpu", dtype=torch.float32, backend=None
):
    """Build a :class:`~kalmanscan.kla.KLALanguageModel` from a checkpoint directory.

    ``directory=None`` loads the model bundled with the package. Only safetensors weights are
    read (no pickle); the config is checked (types, sizes, finite numbers) and the weights'
    names, shapes and dtypes are compared with the model it describes, built on the meta device,
    before any tensor is allocated; anything that differs raises :class:`CheckpointError`.
    That model skips its random init (every tensor is read from the checkpoint), so loading
    draws nothing from torch's global generator. ``backend`` overrides the KLA op backend of
    the stored config (e.g. ``"sequential"``, the faster one for short CPU inputs). The model
    is returned in eval mode.

    >>> import tempfile
    >>> from kalmanscan.kla import KLALanguageModel, ModelConfig, KLAConfig
    >>> m = KLALanguageModel(ModelConfig(d_model=16, n_layers=1, kla=KLAConfig(d_state=2)))
    >>> back = load_checkpoint(save_checkpoint(m, tempfile.mkdtemp()))
    >>> back.config == m.config, back.training
    (True, False)
    >>> model = load_checkpoint()  # the bundled byte-level model  # doctest: +SKIP
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"dtype: expected a floating torch.dtype (e.g. torch.float32), got {dtype!r}"
        )
    device = _check_device(device)
    _check_backend(backend)
    directory = BUNDLED_DIR if directory is None else _as_path("directory", directory)
    directory = _checkpoint_dir(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        hint = (
            f"; found pickle files {pickles}, which are refused because unpickling can run "
            f"arbitrary code: {_CONVERT_HINT}"
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
    except (TypeError, ValueError, OverflowError) as err:
        raise CheckpointError(
            f"checkpoint: invalid model config in {directory / CONFIG_FILE}: {err}"
        ) from None
    model = _empty_model(model_config)
    _check_weight_header(model, weights)
    try:
        state_dict = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"checkpoint: cannot read {weights} as safetensors ({err})") from None
    model = _allocate(model, dtype, set(state_dict))
    load_state_dict(model, state_dict)
    return model.to(device).eval()
