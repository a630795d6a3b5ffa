"""``kalmanscan inspect``: what a text did to the belief states of a KLA language model.

Loads the bundled byte-level model (or ``--checkpoint DIR``), streams the text through
:func:`kalmanscan.kla.inspect` (from the argument, ``--file PATH`` or standard input, at most
``--max-bytes``), prints a per-layer summary, and writes into ``--out``: ``overview.png``
(channel views and per-layer curves over the whole text, surprisal aligned), ``inspect.nc``
(the dataset), and with ``--window A:B`` the per-lane detail of those tokens and
``window.png``; with ``--compare`` a second text and ``comparison.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class _Ints(list):
    """The ints of ``--layers`` / ``--channels``, with the text as typed (``.text``)."""

    text = ""


class _Span(tuple):
    """``--window``'s (start, stop), with the text as typed (``.text``)."""

    text = ""


def _int_list(text: str) -> list[int]:
    try:
        out = _Ints()
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                out.extend(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
        out.text = text
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ints like '0,2,5-9', got {text!r}") from None


def _window(text: str) -> tuple[int, int]:
    try:
        lo, hi = text.split(":")
        out = _Span((int(lo), int(hi)))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START:STOP token positions, got {text!r}"
        ) from None
    out.text = text
    return out


# inspect()'s argument names -> the options that set them (its messages name the argument)
_OPTIONS = {"window": "--window", "channels": "--channels", "layers": "--layers",
            "chunk_size": "--chunk-size"}  # fmt: skip


def _as_options(message: str) -> str:
    """An error of :func:`kalmanscan.kla.inspect` reworded to name the options as typed."""
    head, sep, rest = message.partition(": ")
    names = [n.strip() for n in head.split(",")]
    if not sep or not all(n in _OPTIONS for n in names):
        return message
    rest = rest.replace(
        "pass a window=(start, stop), fewer channels or detail=False (summaries only, any length)",
        "pass a shorter --window START:STOP or fewer --channels (without --window: summaries "
        "only, any length)",
    )
    return ", ".join(_OPTIONS[n] for n in names) + ": " + rest


def _check_window(window, texts) -> None:
    """``--window`` against the texts' length in tokens (bytes), before anything runs."""
    L = max(len(t) for t in texts)
    lo, hi = window
    if not 0 <= lo < hi or lo >= L:
        raise ValueError(
            f"--window: expected START:STOP with 0 <= START < STOP and START below the text's "
            f"{L} tokens (bytes), got {window.text!r}"
        )


def _check_channels(channels, model, layers) -> None:
    """``--channels`` against the channels of the inspected KLA blocks, before anything runs."""
    from kalmanscan.kla._inspect import kla_layers

    found = kla_layers(model)
    mods = [found[b] for b in (layers if layers is not None else found) if b in found]
    sizes = {m.d_inner for m in mods}
    if len(sizes) != 1:  # layers of several sizes: inspect() names --layers
        return
    (M,) = sizes
    bad = [c for c in channels if not 0 <= c < M]
    if not channels or bad:
        shown = ", ".join(str(v) for v in bad[:5]) + (", ..." if len(bad) > 5 else "")
        got = f"{len(bad)} outside it ({shown})" if bad else "none"
        raise ValueError(
            f"--channels: expected channel ids in [0, {M}) (the inspected blocks' channels), "
            f"got {got} from {channels.text!r}"
        )


def _read(text, path, max_bytes, what, option="--file"):
    """UTF-8 bytes of the text from the argument, a file or stdin ('-'), cut at max_bytes."""
    if path is not None:
        try:
            data = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise ValueError(
                f"{option}: expected a readable file, got {str(path)!r} ({reason})"
            ) from None
    elif text == "-" or (text is None and not sys.stdin.isatty()):
        data = sys.stdin.buffer.read()
    elif text is None:
        raise ValueError(f"{what}: expected text, --file PATH or text on standard input")
    else:
        data = text.encode("utf-8")
    if not data:
        raise ValueError(f"{what}: expected at least one byte, got none")
    if len(data) > max_bytes:
        print(
            f"kalmanscan inspect: {what}: using the first {max_bytes} of {len(data)} bytes "
            "(--max-bytes)",
            file=sys.stderr,
        )
        data = data[:max_bytes]
    return data


def _cpu_backend() -> str:
    """The KLA op backend of inspection on the CPU: the compiled forward (no gradients, none
    needed here) where the extension is built, else the sequential token loop."""
    from kalmanscan.core import native

    return "native" if native.kla_available() else "sequential"


def inspect_main(argv: list[str] | None = None) -> int:
    """Entry point of ``kalmanscan inspect``; returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="kalmanscan inspect",
        description="What a text did to the belief states of a KLA language model.",
    )
    ap.add_argument(
        "text", nargs="?", default=None, help="text (UTF-8 bytes are the tokens); '-' = stdin"
    )
    ap.add_argument(
        "--file", type=Path, default=None, help="read the text from a file ('-' = stdin)"
    )
    ap.add_argument("--compare", default=None, help="a second text, shown against the first")
    ap.add_argument("--compare-file", type=Path, default=None, help="the second text from a file")
    ap.add_argument(
        "--max-bytes", type=int, default=1_000_000, help="use at most this many bytes of each text"
    )
    ap.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="checkpoint directory (model.safetensors + config.json); default: bundled",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("kla-inspect"),
        help="output directory for overview.png, inspect.nc, window.png and comparison.png "
        "(default kla-inspect/)",
    )
    ap.add_argument("--layers", type=_int_list, default=None, help="KLA block indices, e.g. 0,3")
    ap.add_argument(
        "--window",
        type=_window,
        default=None,
        help="keep the per-lane detail of tokens START:STOP (default: summaries only)",
    )
    ap.add_argument(
        "--channels", type=_int_list, default=None, help="channels in the detail, e.g. 0-63"
    )
    ap.add_argument(
        "--layer",
        type=int,
        default=None,
        help="KLA block drawn in the heatmaps, one of those inspected (default: the last)",
    )
    ap.add_argument(
        "--chunk-size", type=int, default=512, help="tokens per forward chunk (default 512)"
    )
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on the CPU (default 1: the filter's per-token steps are "
        "too small to share, the reductions run on a second thread beside it, and more "
        "threads stall when other processes share the cores)",
    )
    ap.add_argument(
        "--backend",
        default=None,
        help="KLA op backend (default on the CPU: 'native', the compiled forward, where it is "
        "built, else 'sequential'; 'auto' elsewhere)",
    )
    args = ap.parse_args(argv)
    if args.max_bytes < 1:
        ap.error(f"--max-bytes: expected a positive int, got {args.max_bytes}")
    if args.threads < 1:
        ap.error(f"--threads: expected a positive int, got {args.threads}")
    if args.chunk_size < 1:
        ap.error(f"--chunk-size: expected a positive int, got {args.chunk_size}")
    if args.text is not None and args.file is not None:
        ap.error(f"TEXT, --file: expected one of them, got both (TEXT {args.text!r})")
    if args.compare is not None and args.compare_file is not None:
        ap.error("--compare, --compare-file: expected one of them, got both")
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out: expected a directory (existing or new), got the file {str(args.out)!r}")
    if args.layers is not None and args.layer is not None and args.layer not in args.layers:
        ap.error(f"--layer: expected one of the blocks in --layers {args.layers}, got {args.layer}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from kalmanscan.kla._inspect import inspect, kla_layers, save_dataset, summarize
    from kalmanscan.kla.io import CheckpointError, _check_backend, _check_device, load_checkpoint
    from kalmanscan.kla.plot import plot_comparison, plot_overview, plot_precision

    try:
        _check_backend(args.backend, "--backend")
        device = _check_device(args.device, "--device")
    except ValueError as err:
        ap.error(str(err))
    try:
        texts = [_read(args.text, args.file, args.max_bytes, "text")]
        if args.compare is not None or args.compare_file is not None:
            texts.append(
                _read(args.compare, args.compare_file, args.max_bytes, "compare", "--compare-file")
            )
        if args.window is not None:
            _check_window(args.window, texts)
        backend = args.backend or ("auto" if device.type != "cpu" else _cpu_backend())
        model = load_checkpoint(args.checkpoint, device=device, backend=backend)
        blocks = list(kla_layers(model))
        chosen = blocks if args.layers is None else args.layers
        bad = [b for b in chosen if b not in blocks]
        if bad:
            raise ValueError(f"--layers: expected KLA blocks of the model {blocks}, got {bad}")
        if args.layer is None:
            layer = -1
        elif args.layer in chosen:
            layer = chosen.index(args.layer)  # the plots take a position in the inspected list
        else:
            raise ValueError(f"--layer: expected one of the inspected blocks {chosen}, got "
                             f"{args.layer}")  # fmt: skip
        if args.channels is not None:
            _check_channels(args.channels, model, args.layers)
        threads = torch.get_num_threads()
        if device.type == "cpu":
            torch.set_num_threads(args.threads)
        try:
            ds = inspect(
                model,
                texts if len(texts) > 1 else texts[0],
                layers=args.layers,
                channels=args.channels,
                window=args.window,
                detail=args.window is not None,
                chunk_size=args.chunk_size,
            )
        except ValueError as err:  # inspect() names its arguments: say the options instead
            raise ValueError(_as_options(str(err))) from None
        finally:
            torch.set_num_threads(threads)  # a caller's setting (main() called in-process)
    except (CheckpointError, ValueError, TypeError, OSError) as err:
        print(f"kalmanscan inspect: {err}", file=sys.stderr)
        return 2

    try:
        written = _write(args, ds, texts, layer, plt, plot_overview, plot_comparison,
                         plot_precision, save_dataset)  # fmt: skip
    except OSError as err:
        print(f"kalmanscan inspect: --out: cannot write into {str(args.out)!r} ({err})",
              file=sys.stderr)  # fmt: skip
        return 2
    engine = written.pop()
    # A figure an earlier run wrote into this folder and this run does not (window.png without
    # --window, comparison.png with one text) would sit beside the new ones as if it were theirs.
    stale = [
        p for p in (args.out / "window.png", args.out / "comparison.png")
        if p not in written and p.exists()
    ]  # fmt: skip
    for p in stale:
        p.unlink()

    L = ds.sizes["time"]
    print(
        f"{[len(t) for t in texts]} bytes, layers {ds['layer'].values.tolist()}, "
        f"{ds.sizes['channel']} channels x {ds.sizes['slot']} slots"
    )
    for b in range(ds.sizes["batch"]):
        print(f"text {b}: model surprisal {_surprisal_text(ds, b)}")
    import pandas as pd

    with pd.option_context("display.width", 120, "display.precision", 3):
        print(summarize(ds).to_string())
    print(f"wrote {', '.join(str(p) for p in written)} ({engine} engine; {L} tokens)")
    if stale:
        print(f"removed {', '.join(str(p) for p in stale)}: an earlier run's, not this text's")
    return 0


def _write(args, ds, texts, layer, plt, plot_overview, plot_comparison, plot_precision,
           save_dataset):  # fmt: skip
    """Write the figures and the dataset into ``args.out``; returns the paths written and, last,
    the netCDF engine."""
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    axes = plot_overview(ds, layer=layer)
    path = args.out / "overview.png"
    axes[0].figure.savefig(path, dpi=100)
    plt.close(axes[0].figure)
    written.append(path)
    if len(texts) > 1:
        axes = plot_comparison(ds, layer=layer)
        path = args.out / "comparison.png"
        axes[0].figure.savefig(path, dpi=100)
        plt.close(axes[0].figure)
        written.append(path)
    if args.window is not None:
        W = ds.sizes["window"]
        fig, axs = plt.subplots(
            2, 1, figsize=(min(max(12.0, 0.09 * W), 36.0), 10), gridspec_kw={"hspace": 0.3}
        )
        fig.subplots_adjust(left=0.08, right=0.93, top=0.96, bottom=0.08)
        labels = W if W <= 400 else 100  # a label per token for windows up to 400 tokens
        plot_precision(
            ds, "posterior_precision", layer=layer, relative_to="baseline",
            sort_by="timescale", ax=axs[0], max_labels=labels,
        )  # fmt: skip
        plot_precision(
            ds, "write_gain", layer=layer, sort_by="timescale", ax=axs[1], cmap="magma",
            max_labels=labels,
        )  # fmt: skip
        path = args.out / "window.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    nc = args.out / "inspect.nc"
    engine = save_dataset(ds, nc)
    written.append(nc)
    return written + [engine]


def _surprisal_text(ds, b) -> str:
    """The mean surprisal of text ``b`` in bits per byte, or why there is none (a text of one
    token: the first token has no prediction)."""
    import numpy as np

    bits = ds["surprisal"].isel(batch=b).values
    bits = bits[~np.isnan(bits)]
    if len(bits):
        return f"{float(bits.mean()):.3f} bits/byte"
    n = int(np.asarray(ds["mask"].isel(batch=b).values, dtype=bool).sum())
    if n == 1:
        return "none (one token: no prediction)"
    return f"none (no token of the {n} has a prediction)"  # pragma: no cover - LMs predict


if __name__ == "__main__":
    sys.exit(inspect_main())
