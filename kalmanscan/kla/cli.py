"""``kalmanscan inspect "some text"``: belief-state precisions of a KLA language model.

Loads the bundled byte-level model (or ``--checkpoint DIR``) on the CPU, runs
:func:`kalmanscan.kla.inspect` on the text, and writes ``precision.png`` (heatmaps and per-block
curves) and ``inspect.nc`` (the dataset) into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _int_list(text: str) -> list[int]:
    try:
        out = []
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                out.extend(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ints like '0,2,5-9', got {text!r}") from None


def inspect_main(argv: list[str] | None = None) -> int:
    """Entry point of ``kalmanscan inspect``; returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="kalmanscan inspect",
        description="Belief-state precisions of a KLA language model over a piece of text.",
    )
    ap.add_argument("text", help="text to run through the model (UTF-8 bytes are the tokens)")
    ap.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="checkpoint directory (model.safetensors + config.json); default: bundled",
    )
    ap.add_argument("--out", type=Path, default=Path("kla-inspect"), help="output directory")
    ap.add_argument("--layers", type=_int_list, default=None, help="KLA block indices, e.g. 0,3")
    ap.add_argument("--channels", type=_int_list, default=None, help="channels, e.g. 0-63")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument(
        "--backend",
        default=None,
        help="KLA op backend (default: 'sequential' on the CPU, where it is the "
        "fastest for one sequence; 'auto' elsewhere)",
    )
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kalmanscan.kla.inspect import inspect
    from kalmanscan.kla.io import CheckpointError, load_checkpoint
    from kalmanscan.kla.plot import plot_layer_summary, plot_precision

    if not args.text:
        print("kalmanscan inspect: text: expected at least one character", file=sys.stderr)
        return 2
    try:
        backend = args.backend or ("sequential" if args.device == "cpu" else "auto")
        model = load_checkpoint(args.checkpoint, device=args.device, backend=backend)
        ds = inspect(model, args.text, layers=args.layers, channels=args.channels)
    except (CheckpointError, ValueError, TypeError) as err:
        print(f"kalmanscan inspect: {err}", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    L = ds.sizes["time"]
    fig, axes = plt.subplots(4, 1, figsize=(max(8.0, 0.14 * L + 2), 14), constrained_layout=True)
    plot_precision(ds, "posterior_precision", ax=axes[0])
    plot_precision(ds, "value_precision", ax=axes[1], cmap="magma")
    plot_layer_summary(ds, "posterior_precision", ax=axes[2])
    plot_layer_summary(ds, "readout_variance", ax=axes[3])
    png = args.out / "precision.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    nc = args.out / "inspect.nc"
    ds.to_netcdf(nc)

    bits = ds["surprisal"].isel(batch=0).values[:-1]
    print(
        f"{L} bytes, blocks {ds['layer'].values.tolist()}, {ds.sizes['channel']} channels x "
        f"{ds.sizes['slot']} slots"
    )
    if len(bits):
        print(f"model surprisal: {bits.mean():.3f} bits/byte over the text")
    for i, layer in enumerate(ds["layer"].values):
        lam = ds["posterior_precision"].isel(layer=i, batch=0)
        print(
            f"block {int(layer)}: posterior precision median {float(lam.median()):.3g} "
            f"(first token {float(lam.isel(time=0).median()):.3g}, "
            f"last {float(lam.isel(time=-1).median()):.3g})"
        )
    print(f"wrote {png} and {nc}")
    return 0


if __name__ == "__main__":
    sys.exit(inspect_main())
